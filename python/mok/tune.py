"""python -m mok.tune: mok.perf's predictions at MoK's benchmark shape, calibrated against MoK's published figures.

Every time printed is a prediction of the model (mok.perf), not a measurement.

Calibration: one fitted parameter, `Costs.hbm_per_sm_gbps` (the HBM bandwidth one SM's tasks sustain), chosen to
minimise the larger relative error on MoK's two published forward figures on 4x GB200 (2048 tokens per rank,
384 experts, top-6, H 7168, I 3072, shared expert of size I, minibatch 4096, macrobatch 131072, P 256): MXFP8
2.56 ms with 36 comm SMs, BF16 3.71 ms (comm SMs not stated; MoK's default fwd_num_comm_sms, 40, is assumed).
Every other parameter keeps its physical default (mok.perf.Costs).
"""

from __future__ import annotations

import argparse
import sys

from mok.perf import MOK_SHAPE, PROFILES, Costs, Shape, busiest_rank, graph, mok_tflops, routing, simulate

FITTED_HBM_PER_SM_GBPS = 70.0  # calibrate() at seed 0 (docs/performance.md, "Performance model")
CALIBRATED = Costs(hbm_per_sm_gbps=FITTED_HBM_PER_SM_GBPS)

# (mode, comm SMs, published ms): MoK on 4x GB200, forward, at MOK_SHAPE (/work/shared/ANCHORS.md).
PUBLISHED = (("mxfp8", 36, 2.56), ("bf16", 40, 3.71))


def _graph(shape: Shape, kind: str, seed: int):
    ids = routing(shape, "uniform", seed)
    return graph(shape, ids, busiest_rank(shape, ids), kind, CALIBRATED.mma_rows)


def calibration_errors(costs: Costs, seed: int = 0, profile: str = "GB200") -> list[tuple[str, int, float, float]]:
    """(mode, comm SMs, published ms, predicted ms) for each published point."""
    out = []
    for mode, comm, ms in PUBLISHED:
        g = _graph(MOK_SHAPE.replace(mxfp8=mode == "mxfp8"), "forward", seed)
        out.append((mode, comm, ms, simulate(g, PROFILES[profile], comm, costs).time_s * 1e3))
    return out


def calibrate(seed: int = 0, grid: tuple = tuple(range(50, 121, 2))) -> tuple[float, list]:
    """The HBM-per-SM value on `grid` (GB/s) with the smallest worst relative error on PUBLISHED."""
    best = None
    graphs = {m: _graph(MOK_SHAPE.replace(mxfp8=m == "mxfp8"), "forward", seed) for m, _, _ in PUBLISHED}
    for value in grid:
        costs = CALIBRATED.replace(hbm_per_sm_gbps=float(value))
        err = max(abs(simulate(graphs[m], PROFILES["GB200"], c, costs).time_s * 1e3 / ms - 1) for m, c, ms in PUBLISHED)
        if best is None or err < best[1]:
            best = (float(value), err)
    return best[0], calibration_errors(CALIBRATED.replace(hbm_per_sm_gbps=best[0]), seed)


class _Progress:
    def __init__(self, total: int):
        self.total, self.done = total, 0

    def step(self):
        self.done += 1
        bar = "#" * (30 * self.done // self.total)
        sys.stderr.write(f"\r  [{bar:<30}] {self.done}/{self.total}")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _row(res, shape, backward=False):
    b = res.breakdown
    return (
        f"{res.time_s * 1e3:9.3f} {res.roofline_s * 1e3:8.3f} {res.nvlink_s * 1e3:7.3f} {res.tensor_s * 1e3:7.3f} "
        f"{res.fraction_of_roofline:6.2f} {mok_tflops(shape, res.time_s, backward):7.0f}   "
        f"{b['comm']['busy']:.2f}/{b['comm']['waiting']:.2f}  {b['compute']['busy']:.2f}/{b['compute']['waiting']:.2f}"
    )


HEADER = "   pred ms  roof ms   nv ms   tc ms  frac.  TFLOP/s   comm busy/wait  compute busy/wait"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mok.tune", description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="GB200", choices=sorted(PROFILES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kind", default="forward", choices=("forward", "backward"))
    ap.add_argument("--comm-sms", type=int, nargs="*", default=[8, 16, 24, 36, 48, 64])
    ap.add_argument("--world", type=int, nargs="*", default=[4, 8, 16, 32, 64, 72])
    ap.add_argument("--calibrate", action="store_true", help="refit hbm_per_sm_gbps on the published points")
    args = ap.parse_args(argv)
    prof = PROFILES[args.profile]
    backward = args.kind == "backward"
    print("mok.tune: predictions of mok.perf (a model, not measurements)")
    print(
        f"  profile {prof.name}: {prof.sms} SMs, {prof.bf16_tflops:.0f}/{prof.mxfp8_tflops} TF dense BF16/MXFP8, "
        f"HBM {prof.hbm_tbps} TB/s, NVLink {prof.nvlink_gbps:.0f} GB/s one way"
    )
    costs = CALIBRATED
    if args.calibrate:
        value, _ = calibrate(args.seed)
        costs = CALIBRATED.replace(hbm_per_sm_gbps=value)
    print(f"  costs: {costs}")
    print("\nCalibration (forward, 4x GB200, MoK's shape): published vs predicted")
    for mode, comm, ms, pred in calibration_errors(costs, args.seed):
        print(f"  {mode:5s} comm SMs {comm:2d}: published {ms:.2f} ms, predicted {pred:.3f} ms ({pred / ms - 1:+.1%})")
    modes = ("bf16", "mxfp8") if prof.mxfp8_tflops else ("bf16",)
    progress = _Progress(len(modes) * (len(args.comm_sms) + len(args.world)))
    lines = []
    for mode in modes:
        shape = MOK_SHAPE.replace(mxfp8=mode == "mxfp8")
        g = _graph(shape, args.kind, args.seed)
        lines.append(f"\n{args.kind} {mode}, EP 4, vs comm SMs\n  comm SMs{HEADER}")
        for comm in args.comm_sms:
            lines.append(f"  {comm:8d}" + _row(simulate(g, prof, comm, costs), shape, backward))
            progress.step()
        lines.append(f"\n{args.kind} {mode}, 36 comm SMs, vs EP size (tokens per rank fixed)\n  EP  E{HEADER}  bound")
        for world in args.world:
            experts = 384 if 384 % world == 0 else world * -(-384 // world)  # 72: 432 experts, 6 per rank
            s = shape.replace(world=world, experts=experts)
            res = simulate(_graph(s, args.kind, args.seed), prof, 36, costs)
            bound = "NVLink" if res.nvlink_s > res.tensor_s else "tensor"
            lines.append(f"  {world:2d} {experts:3d}" + _row(res, s, backward) + f"  {bound}")
            progress.step()
    print("\n".join(lines))
    print(
        "\n  roof: max(NVLink time, tensor-core time at peak) of the rank; frac.: roof / predicted; "
        "TFLOP/s: MoK's 6 (T + T K) H I / t; bound: which term sets the roofline"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
