"""python -m mok.tune: mok.perf's predictions at MoK's benchmark shape, calibrated against MoK's published figures.

Every time printed is a prediction of the model (mok.perf), not a measurement.

Calibration: one fitted parameter, `Costs.hbm_per_sm_gbps` (the HBM bandwidth one SM's tasks sustain), chosen to
minimise the larger relative error on MoK's two published forward figures on 4x GB200 (2048 tokens per rank,
384 experts, top-6, H 7168, I 3072, shared expert of size I, minibatch 4096, macrobatch 131072, P 256): MXFP8
2.56 ms with 36 comm SMs, BF16 3.71 ms (comm SMs not stated; MoK's default fwd_num_comm_sms, 40, is assumed).
Every other parameter keeps its physical default (mok.perf.Costs).

The autotuner, `best` (cached as `auto`), chooses fwd/bwd comm SMs, minibatch and macrobatch for a shape on a GPU
profile; MoKConfig's "auto" fields ask it through `resolve_config`. `--plots DIR` writes the sweeps as PNGs
(matplotlib, the package's `plots` extra).
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
import time
from dataclasses import dataclass

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


def calibrate(seed: int = 0, grid: tuple = tuple(range(50, 121, 2)), costs: Costs | None = None) -> tuple[float, list]:
    """The HBM-per-SM value on `grid` (GB/s) with the smallest worst relative error on PUBLISHED, the other
    parameters those of `costs` (default CALIBRATED)."""
    best = None
    base = costs if costs is not None else CALIBRATED
    graphs = {m: _graph(MOK_SHAPE.replace(mxfp8=m == "mxfp8"), "forward", seed) for m, _, _ in PUBLISHED}
    for value in grid:
        costs = base.replace(hbm_per_sm_gbps=float(value))
        err = max(abs(simulate(graphs[m], PROFILES["GB200"], c, costs).time_s * 1e3 / ms - 1) for m, c, ms in PUBLISHED)
        if best is None or err < best[1]:
            best = (float(value), err)
    return best[0], calibration_errors(base.replace(hbm_per_sm_gbps=best[0]), seed)



# ----------------------------------------------------------------------------------------------------------------
# The autotuner: what MoKConfig's "auto" fields ask (docs/performance.md, "The autotuner")

COMM_GRID = (8, 16, 24, 32, 40, 48, 64)  # comm SMs tried, forward and backward (fewer than any profile's SMs)
DEFAULT_COMM_SMS = 36  # the forward's comm SMs while schedules are compared, unless the config fixes them
MINIBATCH_CANDIDATES = 5  # minibatches tried: the largest 5 of P, 2P, 4P, ... up to MAX_MINIBATCH_TRIED
MAX_MINIBATCH_TRIED = 16384  # MoK's range is 2048 to 16384 rows
RING_FACTORS = (1, 2, 4, 8, 16, 32)  # macrobatches tried: these multiples of the minibatch, and the whole ring
RING_SLACK = 0.01  # the smallest ring predicted within 1% of the fastest is taken: a larger ring is more memory


@dataclass(frozen=True)
class Choice:
    """The autotuner's answer for one shape on one GPU profile. Its times are predictions of mok.perf."""

    profile: str
    fwd_comm_sms: int
    bwd_comm_sms: int | None  # None: the backward was not tuned (backward=False)
    minibatch: int
    macrobatch: int
    forward_s: float  # predicted forward at this choice
    backward_s: float | None
    schedule_sweep: tuple  # ((minibatch, macrobatch, predicted forward s), ...) in the order tried
    forward_sweep: tuple  # ((comm SMs, predicted forward s), ...) at the chosen schedule
    backward_sweep: tuple  # ((comm SMs, predicted backward s), ...) at the chosen schedule
    simulations: int
    seconds: float  # what finding it took on this CPU


def most_rows(shape: Shape) -> int:
    """The most rows a rank can receive, W T K + E_local P (the host executor caps its ring at this)."""
    return shape.world * shape.tokens * shape.top_k + shape.experts_per_rank * shape.expert_padding


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def minibatch_candidates(shape: Shape, macrobatch: int | None = None) -> tuple[int, ...]:
    """Powers of two times P (a power of two) up to MAX_MINIBATCH_TRIED and the rows a rank can receive; those
    dividing `macrobatch` when it is fixed; the largest MINIBATCH_CANDIDATES of them."""
    p = shape.expert_padding
    top = min(MAX_MINIBATCH_TRIED, _round_up(most_rows(shape), p))
    values = [p << j for j in range(32) if p << j <= top and (macrobatch is None or macrobatch % (p << j) == 0)]
    return tuple(values[-MINIBATCH_CANDIDATES:]) or (p,)


def macrobatch_candidates(shape: Shape, minibatch: int) -> tuple[int, ...]:
    """RING_FACTORS times the minibatch, and the whole ring (every row a rank can receive), none past it."""
    whole = _round_up(most_rows(shape), minibatch)
    return tuple(sorted({min(minibatch * r, whole) for r in RING_FACTORS} | {whole}))


TIE = 1e-9  # times this close (relative) are equal: the earlier candidate wins (float noise picks no winner)


def _argmin(pairs):
    """The first entry with the smallest time (ties: the earlier, so the smaller comm SMs or minibatch)."""
    fastest = min(t for *_, t in pairs)
    return next(pair for pair in pairs if pair[-1] <= fastest * (1 + TIE))


def best(
    shape: Shape,
    profile: str = "GB200",
    *,
    fwd_comm_sms: int | None = None,
    bwd_comm_sms: int | None = None,
    minibatch: int | None = None,
    macrobatch: int | None = None,
    backward: bool = True,
    seed: int = 0,
    costs: Costs | None = None,
    progress=None,
) -> Choice:
    """The fastest configuration the model predicts for `shape` (uniform routing, seed `seed`, its busiest rank)
    on `profile`. A field given as an int is kept; one given as None is chosen, in this order:

    1. minibatch, macrobatch (one schedule serves both passes; compared on the forward, at the forward's comm SMs
       if given, else DEFAULT_COMM_SMS): the minibatch with the fastest forward among minibatch_candidates, the
       ring the whole ring (or the fixed macrobatch) meanwhile; then the smallest macrobatch among
       macrobatch_candidates predicted within RING_SLACK of the fastest of them.
    2. fwd_comm_sms: the fastest forward over COMM_GRID at that schedule.
    3. bwd_comm_sms (when `backward`): the fastest backward over COMM_GRID at that schedule.

    A coordinate search, not a joint one: it costs len(minibatches) + len(macrobatches) + len(COMM_GRID)
    forward simulations and len(COMM_GRID) backward ones, and may miss a joint optimum the grid holds."""
    started = time.perf_counter()
    prof = PROFILES[profile]
    costs = costs if costs is not None else CALIBRATED
    ids = routing(shape, "uniform", seed)
    rank = busiest_rank(shape, ids)
    runs = [0]

    def predict(kind, comm, mb, ring):
        runs[0] += 1
        s = shape.replace(minibatch=mb, macrobatch=ring)
        t = float(simulate(graph(s, ids, rank, kind, costs.mma_rows), prof, comm, costs).time_s)
        if progress is not None:
            progress()
        return t

    grid = tuple(c for c in COMM_GRID if c < prof.sms)
    compare_at = fwd_comm_sms if fwd_comm_sms is not None else DEFAULT_COMM_SMS
    schedule_sweep = []
    if minibatch is None:
        for mb in minibatch_candidates(shape, macrobatch):
            ring = macrobatch if macrobatch is not None else macrobatch_candidates(shape, mb)[-1]
            schedule_sweep.append((mb, ring, predict("forward", compare_at, mb, ring)))
        minibatch = _argmin(schedule_sweep)[0]
    if macrobatch is None:
        tried = {(mb, ring): t for mb, ring, t in schedule_sweep}
        rings = []
        for ring in macrobatch_candidates(shape, minibatch):
            t = tried.get((minibatch, ring))
            rings.append((minibatch, ring, t if t is not None else predict("forward", compare_at, minibatch, ring)))
        schedule_sweep += [r for r in rings if (r[0], r[1]) not in tried]
        fastest = _argmin(rings)[2]
        macrobatch = next(ring for _, ring, t in rings if t <= fastest * (1 + RING_SLACK))
    forward_sweep = ()
    if fwd_comm_sms is None:
        forward_sweep = tuple((c, predict("forward", c, minibatch, macrobatch)) for c in grid)
        fwd_comm_sms = _argmin(forward_sweep)[0]
    backward_sweep = ()
    if backward and bwd_comm_sms is None:
        backward_sweep = tuple((c, predict("backward", c, minibatch, macrobatch)) for c in grid)
        bwd_comm_sms = _argmin(backward_sweep)[0]
    forward_s = dict(forward_sweep).get(fwd_comm_sms)
    if forward_s is None:
        forward_s = predict("forward", fwd_comm_sms, minibatch, macrobatch)
    backward_s = dict(backward_sweep).get(bwd_comm_sms)
    if backward and backward_s is None:
        backward_s = predict("backward", bwd_comm_sms, minibatch, macrobatch)
    return Choice(profile, fwd_comm_sms, bwd_comm_sms, minibatch, macrobatch, forward_s, backward_s,
                  tuple(schedule_sweep), forward_sweep, backward_sweep, runs[0], time.perf_counter() - started)


# One answer per (shape (its world included), profile, fixed fields, passes): a layer's "auto" config asks this
# once per workspace shape, not once per call.
auto = functools.lru_cache(maxsize=64)(best)


# ----------------------------------------------------------------------------------------------------------------
# MoKConfig's "auto" fields

AUTO = "auto"
AUTO_FIELDS = ("fwd_num_comm_sms", "bwd_num_comm_sms", "minibatch_size", "macrobatch_size")


def profile_of_device(name: str) -> str | None:
    """The profile a CUDA device name names ("NVIDIA GB200" -> "GB200", "NVIDIA H100 80GB HBM3" -> "H100"), or
    None. A name matches as a word of its own: "B200" is not found inside "GB200"."""
    upper = name.upper()
    found = [p for p in PROFILES if re.search(rf"(?<![A-Z0-9]){p}(?![0-9])", upper)]
    return max(found, key=len) if found else None


def profile_for(config, device) -> str:
    """The GPU profile an "auto" config is tuned for: MoKConfig.gpu_profile, else on CUDA the device's name."""
    if config.gpu_profile is not None:
        return config.gpu_profile
    fields = ", ".join(f"{f}='auto'" for f in AUTO_FIELDS if getattr(config, f) == AUTO)
    names = ", ".join(sorted(PROFILES))
    if device.type != "cuda":
        raise ValueError(f"MoKConfig({fields}) asks mok.perf, a model of a GPU, and the layer runs on "
                         f"{device.type}, which it does not model: name the GPU to tune for with "
                         f"MoKConfig.gpu_profile (one of {names}), or give the fields as numbers")
    import torch

    name = torch.cuda.get_device_name(device)
    found = profile_of_device(name)
    if found is None:
        raise ValueError(f"MoKConfig({fields}): the device {name!r} is none of mok.perf's GPU profiles: name the "
                         f"closest with MoKConfig.gpu_profile (one of {names}), or give the fields as numbers")
    return found


def resolve_config(config, *, world: int, experts_per_rank: int, hidden: int, intermediate: int, topk: int,
                   tokens: int, shared_intermediate: int, mxfp8: bool, device, workers: int | None):
    """`config` with its "auto" fields replaced by the autotuner's choice for this layer (auto: cached per shape,
    world and profile). `workers`: the executor's fixed workers that the comm fields split, None for a GPU
    executor (its SMs: the profile's). On an executor with other workers (backend="host": its threads) a comm
    field is the GPU's comm share of them, round(comm SMs x workers / the profile's SMs), at least 1 and fewer
    than `workers`: the GPU's split carried over, not a model of that executor."""
    import dataclasses

    wanted = [f for f in AUTO_FIELDS if getattr(config, f) == AUTO]
    if not wanted:
        return config
    profile = profile_for(config, device)
    shape = Shape(world=world, experts=experts_per_rank * world, hidden=hidden, intermediate=intermediate,
                  top_k=topk, tokens=max(tokens, 1), shared_intermediate=shared_intermediate,
                  expert_padding=config.expert_padding, mxfp8=bool(mxfp8))
    on_gpu = workers is None

    def fixed(name):  # a fixed comm field counts GPU SMs only on a GPU executor
        value = getattr(config, name)
        if value == AUTO:
            return None
        return value if on_gpu and value is not None else DEFAULT_COMM_SMS

    schedule = {f: None if getattr(config, f) == AUTO else getattr(config, f) for f in AUTO_FIELDS[2:]}
    try:
        choice = auto(shape, profile, fwd_comm_sms=fixed("fwd_num_comm_sms"), bwd_comm_sms=fixed("bwd_num_comm_sms"),
                      minibatch=schedule["minibatch_size"], macrobatch=schedule["macrobatch_size"],
                      backward="bwd_num_comm_sms" in wanted)
    except (ValueError, RuntimeError) as e:
        raise type(e)(f"MoKConfig({', '.join(f + '=' + repr(AUTO) for f in wanted)}) on profile {profile}: {e}") from e
    found = {"fwd_num_comm_sms": choice.fwd_comm_sms, "bwd_num_comm_sms": choice.bwd_comm_sms,
             "minibatch_size": choice.minibatch, "macrobatch_size": choice.macrobatch}
    if not on_gpu:
        for name in AUTO_FIELDS[:2]:
            share = round(found[name] * workers / PROFILES[profile].sms) if found[name] else 1
            found[name] = min(max(share, 1), workers - 1)
    return dataclasses.replace(config, **{f: found[f] for f in wanted})


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


def _ep_shape(shape: Shape, world: int) -> Shape:
    """MoK's shape on `world` ranks, tokens per rank fixed; 384 experts, or the next multiple of `world` (72: 432,
    6 per rank) where 384 does not split."""
    return shape.replace(world=world, experts=384 if 384 % world == 0 else world * -(-384 // world))


def sweeps(args, prof, costs, progress) -> dict:
    """Every prediction the tables and plots show: per mode, vs comm SMs, vs minibatch, vs EP size."""
    modes = ("bf16", "mxfp8") if prof.mxfp8_tflops else ("bf16",)
    out = {}
    for mode in modes:
        shape = MOK_SHAPE.replace(mxfp8=mode == "mxfp8")
        g = _graph(shape, args.kind, args.seed)
        comm = []
        for c in args.comm_sms:
            comm.append((c, simulate(g, prof, c, costs)))
            progress.step()
        minibatch = []
        for mb in args.minibatch:
            s = shape.replace(minibatch=mb, macrobatch=macrobatch_candidates(shape, mb)[-1])
            minibatch.append((mb, simulate(_graph(s, args.kind, args.seed), prof, DEFAULT_COMM_SMS, costs)))
            progress.step()
        ep = []
        for world in args.world:
            s = _ep_shape(shape, world)
            ep.append((world, s, simulate(_graph(s, args.kind, args.seed), prof, DEFAULT_COMM_SMS, costs)))
            progress.step()
        out[mode] = dict(shape=shape, comm=comm, minibatch=minibatch, ep=ep)
    return out


def print_tables(args, results) -> None:
    backward = args.kind == "backward"
    for mode, r in results.items():
        shape = r["shape"]
        print(f"\n{args.kind} {mode}, EP 4, vs comm SMs\n  comm SMs{HEADER}")
        for c, res in r["comm"]:
            print(f"  {c:8d}" + _row(res, shape, backward))
        print(f"\n{args.kind} {mode}, EP 4, {DEFAULT_COMM_SMS} comm SMs, vs minibatch (ring: every row a rank can "
              f"receive)\n  minibatch{HEADER}")
        for mb, res in r["minibatch"]:
            print(f"  {mb:9d}" + _row(res, shape, backward))
        print(f"\n{args.kind} {mode}, {DEFAULT_COMM_SMS} comm SMs, vs EP size (tokens per rank fixed)\n"
              f"  EP  E{HEADER}  bound")
        for world, s, res in r["ep"]:
            bound = "NVLink" if res.nvlink_s > res.tensor_s else "tensor"
            print(f"  {world:2d} {s.experts:3d}" + _row(res, s, backward) + f"  {bound}")
    print(
        "\n  roof: max(NVLink time, tensor-core time at peak) of the rank; frac.: roof / predicted; "
        "TFLOP/s: MoK's 6 (T + T K) H I / t; bound: which term sets the roofline"
    )


def write_plots(directory, args, prof, results) -> list[str]:
    """Three PNGs of the sweeps (predicted times): vs comm SMs, vs minibatch, vs EP size. Needs matplotlib."""
    import os

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    os.makedirs(directory, exist_ok=True)
    note = f"mok.perf predictions (a model, not measurements), {prof.name}, seed {args.seed}"
    published = {mode: (comm, ms) for mode, comm, ms in PUBLISHED}
    paths = []

    def axes(ax, title, xlabel, ylabel=f"predicted {args.kind} time, ms"):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        if title:
            ax.set_title(f"{title}\n{note}", fontsize=9)

    def save(fig, name):
        fig.tight_layout()
        paths.append(os.path.join(directory, name))
        fig.savefig(paths[-1], dpi=90)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for mode, r in results.items():
        ax.plot([c for c, _ in r["comm"]], [res.time_s * 1e3 for _, res in r["comm"]], "o-", ms=3,
                label=f"{mode.upper()} predicted")
        if args.kind == "forward" and prof.name == "GB200" and mode in published:
            assumed = "; comm SMs not published, MoK's default assumed" if mode == "bf16" else ""
            ax.plot(*published[mode], "k*", ms=9, label=f"{mode.upper()} published (MoK, 4x GB200{assumed})")
    axes(ax, f"{args.kind}, MoK's shape, EP 4, minibatch 4096: time vs comm SMs", "comm SMs")
    save(fig, "tune_comm_sms.png")

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for mode, r in results.items():
        ax.plot([mb for mb, _ in r["minibatch"]], [res.time_s * 1e3 for _, res in r["minibatch"]], "o-", ms=3,
                label=f"{mode.upper()} predicted")
    ax.set_xscale("log", base=2)
    sizes = [mb for mb, _ in next(iter(results.values()))["minibatch"]]
    ax.set_xticks(sizes, [str(mb) for mb in sizes])
    ax.minorticks_off()
    axes(ax, f"{args.kind}, MoK's shape, EP 4, {DEFAULT_COMM_SMS} comm SMs, whole ring: time vs minibatch",
         "minibatch (rows)")
    save(fig, "tune_minibatch.png")

    fig, (ax, terms) = plt.subplots(2, 1, figsize=(6.4, 6.0), sharex=True, height_ratios=(3, 2))
    nvlink_drawn = None
    for mode, r in results.items():
        worlds = [w for w, _, _ in r["ep"]]
        color = ax.plot(worlds, [res.time_s * 1e3 for *_, res in r["ep"]], "o-", ms=3,
                        label=f"{mode.upper()} predicted")[0].get_color()
        nvlink = [res.nvlink_s * 1e3 for *_, res in r["ep"]]
        tensor = [res.tensor_s * 1e3 for *_, res in r["ep"]]
        if nvlink != nvlink_drawn:  # both modes move the same bf16 rows: one line unless they differ
            terms.plot(worlds, nvlink, "k--", lw=1.2, label=f"NVLink time at {prof.nvlink_gbps:.0f} GB/s"
                       + (f" ({mode.upper()})" if nvlink_drawn is not None else ""))
            nvlink_drawn = nvlink
        terms.plot(worlds, tensor, ":", color=color, lw=1.5, label=f"{mode.upper()} tensor cores at peak")
        bound = [w for w, n, t in zip(worlds, nvlink, tensor, strict=True) if n > t]
        if bound:
            terms.axvspan(bound[0], worlds[-1], color=color, alpha=0.12,
                          label=f"{mode.upper()} NVLink-bound roofline (EP {bound[0]} on)")
    ax.set_ylim(bottom=0)
    terms.set_ylim(bottom=0)
    axes(ax, f"{args.kind}, MoK's shape, {DEFAULT_COMM_SMS} comm SMs, tokens per rank fixed: time vs EP size", "")
    axes(terms, None, "EP size (ranks)", "roofline terms, ms")
    save(fig, "tune_ep.png")
    return paths


def print_best(args, prof, costs) -> None:
    modes = ("bf16", "mxfp8") if prof.mxfp8_tflops else ("bf16",)
    print(f"\nAutotuner (tune.best, what MoKConfig's \"auto\" fields get), MoK's shape, EP 4, {prof.name}:")
    print("  mode   fwd comm  bwd comm  minibatch  macrobatch  pred fwd ms  pred bwd ms  simulations  seconds")
    for mode in modes:
        c = best(MOK_SHAPE.replace(mxfp8=mode == "mxfp8"), prof.name, seed=args.seed, costs=costs)
        print(f"  {mode:5s} {c.fwd_comm_sms:9d} {c.bwd_comm_sms:9d} {c.minibatch:10d} {c.macrobatch:11d} "
              f"{c.forward_s * 1e3:12.3f} {c.backward_s * 1e3:12.3f} {c.simulations:12d} {c.seconds:8.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mok.tune", description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="GB200", choices=sorted(PROFILES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kind", default="forward", choices=("forward", "backward"))
    ap.add_argument("--comm-sms", type=int, nargs="*", default=[8, 16, 24, 36, 48, 64])
    ap.add_argument("--minibatch", type=int, nargs="*", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--world", type=int, nargs="*", default=[4, 8, 16, 32, 64, 72])
    ap.add_argument("--calibrate", action="store_true", help="refit hbm_per_sm_gbps on the published points")
    ap.add_argument("--nvlink-per-sm-gbps", type=float, metavar="GBPS",
                    help="assume one SM moves at most this over NVLink (default: unbounded, as calibrated)")
    ap.add_argument("--best", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the autotuner at MoK's shape (a few seconds per mode)")
    ap.add_argument("--plots", metavar="DIR", help="write tune_comm_sms.png, tune_minibatch.png, tune_ep.png here "
                    "(needs matplotlib: pip install mok[plots])")
    args = ap.parse_args(argv)
    prof = PROFILES[args.profile]
    for name in ("comm_sms", "minibatch", "world"):
        if any(v < 1 for v in getattr(args, name)):
            ap.error(f"--{name.replace('_', '-')} values must be positive")
    if any(not c < prof.sms for c in args.comm_sms):
        ap.error(f"--comm-sms values must be fewer than {prof.name}'s {prof.sms} SMs")
    if any(mb % MOK_SHAPE.expert_padding for mb in args.minibatch):
        ap.error(f"--minibatch values must be multiples of the expert padding ({MOK_SHAPE.expert_padding})")
    if args.plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            ap.error("--plots needs matplotlib (pip install 'mok[plots]', or matplotlib==3.11.2)")
    print("mok.tune: predictions of mok.perf (a model, not measurements)")
    print(
        f"  profile {prof.name}: {prof.sms} SMs, {prof.bf16_tflops:.0f}/{prof.mxfp8_tflops} TF dense BF16/MXFP8, "
        f"HBM {prof.hbm_tbps} TB/s, NVLink {prof.nvlink_gbps:.0f} GB/s one way"
    )
    costs = CALIBRATED
    if args.nvlink_per_sm_gbps is not None:
        if not args.nvlink_per_sm_gbps > 0:
            ap.error("--nvlink-per-sm-gbps must be positive")
        costs = costs.replace(nvlink_per_sm_gbps=args.nvlink_per_sm_gbps)
    if args.calibrate:
        value, _ = calibrate(args.seed, costs=costs)
        costs = costs.replace(hbm_per_sm_gbps=value)
    print(f"  costs: {costs}")
    print("\nCalibration (forward, 4x GB200, MoK's shape): published vs predicted")
    for mode, comm, ms, pred in calibration_errors(costs, args.seed):
        print(f"  {mode:5s} comm SMs {comm:2d}: published {ms:.2f} ms, predicted {pred:.3f} ms ({pred / ms - 1:+.1%})")
    modes = 2 if prof.mxfp8_tflops else 1
    progress = _Progress(modes * (len(args.comm_sms) + len(args.minibatch) + len(args.world)))
    results = sweeps(args, prof, costs, progress)
    print_tables(args, results)
    if args.best:
        print_best(args, prof, costs)
    if args.plots:
        for path in write_plots(args.plots, args, prof, results):
            print(f"  wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
