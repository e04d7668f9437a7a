"""What libmok asks for at MoK's benchmark shape (docs/core.md, "Memory"): at most 8 GiB per rank, peer buffer and
workspace together, at W = 8 and W = 64, in bf16 and MXFP8. Only sizes are computed (mokLayerGetSizes): nothing is
allocated."""

from __future__ import annotations

import pytest

from mok import _mok

GIB = 2**30


def sizes(world: int, mxfp8: bool, workers: int = 2) -> tuple[int, int]:
    config = dict(world=world, rank=0, experts_per_rank=384 // world, hidden=7168, intermediate=3072, top_k=6,
                  max_tokens=2048, shared_intermediate=0, mxfp8=mxfp8, swiglu_limit=0.0, expert_padding=256,
                  minibatch=4096, macrobatch=131072, timeout_ms=1000, comm_workers=1, compute_workers=workers - 1)
    return _mok.layer_sizes(config)


@pytest.mark.parametrize("mxfp8", [False, True], ids=["bf16", "mxfp8"])
@pytest.mark.parametrize("world", [8, 64])
def test_benchmark_shape_fits_in_8_gib_per_rank(world, mxfp8):
    peer, workspace = sizes(world, mxfp8)
    assert peer + workspace <= 8 * GIB, f"W={world}: peer {peer / GIB:.2f} GiB + workspace {workspace / GIB:.2f} GiB"


def test_the_rings_dominate_and_no_per_expert_fp32_buffer_remains():
    """The rings (bf16 x, dy [macrobatch, H]; g, u, h [macrobatch, I]) are most of it; what is left at W = 8,
    where no expert's rows can span more than the ring, is far below one fp32 copy of the experts' weights
    (48 x 3 x I x H x 4 bytes = 11.8 GiB): nothing per expert is held in fp32."""
    rings = 131072 * (2 * 7168 + 3 * 3072) * 2
    peer, workspace = sizes(8, False)
    assert rings <= workspace < rings + GIB // 2, f"workspace {workspace / GIB:.2f} GiB, rings {rings / GIB:.2f} GiB"


def test_the_memory_report_gives_libmoks_sizes_per_executor():
    """python -m mok.memory (docs/core.md's table of the executors' workspaces): one line per executor with
    mokLayerGetSizes' bytes in GiB and the ratio to the host executor's, or why libmok does not size it here."""
    from mok import memory

    shape = memory.PRESETS["mok-w8"]
    lines = memory.report(shape, True, 40, 108)
    assert [line.split()[0] for line in lines] == list(memory.EXECUTORS)
    host = memory.sizes(shape, True, "host", 40, 108)[1]
    for executor, line in zip(memory.EXECUTORS, lines, strict=True):
        got = memory.sizes(shape, True, executor, 40, 108)
        if isinstance(got, str):
            assert "not sized" in line and got in line
            continue
        assert f"peer {got[0] / GIB:6.2f} GiB" in line and f"workspace {got[1] / GIB:6.2f} GiB" in line, line
        assert f"{got[1] / host:5.2f}x host" in line, line
    # A backward that moves rows on fewer workers runs more compute workers, whose sums the workers' executors hold:
    # their workspaces grow, the split executor's (no workers) does not.
    for executor in ("host", "cuda"):
        plain, split = (memory.sizes(shape, True, executor, 40, 108, backward) for backward in (0, 28))
        if isinstance(plain, str):
            continue
        assert (split[1] > plain[1]) == (executor == "host"), (executor, plain, split)
