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
