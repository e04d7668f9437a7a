"""python -m mok.memory: what each of libmok's executors asks for per rank at a layer's shape (mokLayerGetSizes: the
peer buffer and the workspace), side by side, with each workspace's ratio to the host executor's. Sizes only: nothing
is allocated and no GPU is needed; an executor this libmok was built without is named as such.

The workers are a GPU's (a CTA per SM): --comm-workers and --compute-workers, 40 and 108 by default (148 SMs), the
fused executor's forward split; --backward-comm-workers the backward's (0 by default: the same; mok.cuda's sm100
layer takes 28, which holds a compute worker's buffers for 120). The host executor is sized with the same counts for
the side-by-side ratio.
"""

from __future__ import annotations

import argparse

from mok import _mok

GIB = 2**30
EXECUTORS = ("host", "cuda", "sm100")
# The shapes docs/core.md's "Memory" tabulates: MoK's benchmark shape, and DeepSeek-V3's experts at EP 32.
PRESETS = {
    "mok-w8": dict(world=8, experts_per_rank=48, hidden=7168, intermediate=3072, top_k=6, max_tokens=2048,
                   shared_intermediate=0, expert_padding=256, minibatch=4096, macrobatch=131072),
    "mok-w64": dict(world=64, experts_per_rank=6, hidden=7168, intermediate=3072, top_k=6, max_tokens=2048,
                    shared_intermediate=0, expert_padding=256, minibatch=4096, macrobatch=131072),
    "deepseek-v3-w32": dict(world=32, experts_per_rank=8, hidden=7168, intermediate=2048, top_k=8, max_tokens=4096,
                            shared_intermediate=2048, expert_padding=128, minibatch=128, macrobatch=4096),
}


def sizes(shape: dict, mxfp8: bool, executor: str, comm_workers: int, compute_workers: int,
          backward_comm_workers: int = 0) -> tuple[int, int] | str:
    """(peer bytes, workspace bytes) for rank 0, or why libmok refuses the executor (not compiled in, a shape it
    does not run)."""
    config = dict(rank=0, mxfp8=mxfp8, executor=executor, comm_workers=comm_workers, compute_workers=compute_workers,
                  backward_comm_workers=backward_comm_workers, **shape)
    try:
        return _mok.layer_sizes(config)
    except (ValueError, RuntimeError) as error:
        return str(error)


def report(shape: dict, mxfp8: bool, comm_workers: int, compute_workers: int,
           backward_comm_workers: int = 0) -> list[str]:
    """One line per executor: peer and workspace GiB and the workspace over the host executor's."""
    host = sizes(shape, mxfp8, "host", comm_workers, compute_workers, backward_comm_workers)
    lines = []
    for executor in EXECUTORS:
        got = sizes(shape, mxfp8, executor, comm_workers, compute_workers, backward_comm_workers)
        if isinstance(got, str):
            lines.append(f"  {executor:<6} not sized: {got}")
            continue
        ratio = f"{got[1] / host[1]:5.2f}x host" if not isinstance(host, str) else ""
        lines.append(f"  {executor:<6} peer {got[0] / GIB:6.2f} GiB  workspace {got[1] / GIB:6.2f} GiB  {ratio}")
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m mok.memory", description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), action="append", help="a shape (default: all of them)")
    p.add_argument("--comm-workers", type=int, default=40)
    p.add_argument("--compute-workers", type=int, default=108)
    p.add_argument("--backward-comm-workers", type=int, default=0)
    args = p.parse_args(argv)
    for name in args.preset or sorted(PRESETS):
        for mxfp8 in (False, True):
            split = f" (backward: {args.backward_comm_workers} comm)" if args.backward_comm_workers else ""
            mode = "MXFP8" if mxfp8 else "bf16"
            print(f"{name} {mode}, {args.comm_workers} + {args.compute_workers} workers{split}:")
            print("\n".join(report(PRESETS[name], mxfp8, args.comm_workers, args.compute_workers,
                                    args.backward_comm_workers)))


if __name__ == "__main__":
    main()
