"""mok.perf: a performance model of one pass of the MoE layer on one rank, run on a CPU.

Every figure this module returns is a prediction of the model, never a measurement of a GPU.

The model runs core's own task graph (`mok._mok.task_graph`: the comm and compute queues of
`core::build_task_graph` and each task's dependencies from `core/task_deps.hpp`) through a discrete-event
simulation: `comm_sms` SMs take the comm queue and the other SMs the compute queue, each in queue order
(one shared head per queue, as core's workers do); an SM that took a task waits for its dependencies, then
spends a fixed per-task overhead and then the task's work. A task's work takes

    max(FLOPs / (per-SM tensor rate), HBM bytes / HBM share, NVLink bytes / NVLink share)

where a share is the resource's bandwidth split evenly among the SMs moving bytes over it at that moment
(capped by what one SM can drive), recomputed at every event. See docs/performance.md, "Performance model".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

KINDS = ("dispatch", "gate_up", "swiglu", "down", "dgrad_h", "swiglu_bwd", "dgrad_x", "wgrad", "combine", "shared")
KIND = {name: i for i, name in enumerate(KINDS)}
COLUMN_BLOCK = 256  # core's kColumnBlock: output columns of one GEMM task, output rows of one wgrad task
PASS_KINDS = ("forward", "recompute", "backward", "backward_kept")


@dataclass(frozen=True)
class Profile:
    """One GPU's physical figures (dense rates, per GPU); `sources` says where each number comes from."""

    name: str
    sms: int
    clock_ghz: float
    bf16_tflops: float
    mxfp8_tflops: float | None  # None: no MXFP8 (Hopper)
    hbm_tbps: float
    nvlink_gbps: float  # one direction, per GPU
    sources: dict = field(default_factory=dict, compare=False)

    def tensor_tflops(self, mxfp8: bool) -> float:
        if not mxfp8:
            return self.bf16_tflops
        if self.mxfp8_tflops is None:
            raise ValueError(f"profile {self.name!r}: no MXFP8 tensor cores (mxfp8=True needs a Blackwell profile)")
        return self.mxfp8_tflops


_ANCHORS = "NVIDIA datasheets (dense rates, HBM, NVLink one way)"
PROFILES = {
    "GB200": Profile(
        "GB200",
        148,
        1.965,
        2500.0,
        5000.0,
        8.0,
        900.0,
        {
            "sms": "148 SMs per Blackwell GPU (B200 device query, multiProcessorCount); not verified here for GB200",
            "clock_ghz": "boost clock as reported for B200; informative only, the model uses the dense rates",
            "bf16_tflops": "2.5 PF dense BF16 per GPU, " + _ANCHORS,
            "mxfp8_tflops": "5 PF dense FP8/MXFP8 per GPU, " + _ANCHORS,
            "hbm_tbps": "8 TB/s HBM3e, " + _ANCHORS,
            "nvlink_gbps": "NVLink 5: 1.8 TB/s bidirectional = 900 GB/s one way, " + _ANCHORS,
        },
    ),
    "GB300": Profile(
        "GB300",
        160,
        1.965,
        2500.0,
        5000.0,
        8.0,
        900.0,
        {
            "sms": "160 SMs (Blackwell Ultra, NVIDIA's Blackwell Ultra announcement); not verified here",
            "clock_ghz": "assumed equal to GB200's; informative only",
            "bf16_tflops": "2.5 PF dense BF16, " + _ANCHORS + " (GB200 and GB300 one row)",
            "mxfp8_tflops": "5 PF dense MXFP8, " + _ANCHORS,
            "hbm_tbps": "8 TB/s HBM3e, " + _ANCHORS,
            "nvlink_gbps": "900 GB/s one way (NVLink 5), " + _ANCHORS,
        },
    ),
    "B200": Profile(
        "B200",
        148,
        1.965,
        2250.0,
        4500.0,
        8.0,
        900.0,
        {
            "sms": "148 SMs (B200 device query, multiProcessorCount)",
            "clock_ghz": "boost clock as reported for B200; informative only",
            "bf16_tflops": "2.25 PF dense BF16 (HGX B200), " + _ANCHORS,
            "mxfp8_tflops": "4.5 PF dense FP8/MXFP8 (HGX B200), " + _ANCHORS,
            "hbm_tbps": "8 TB/s, " + _ANCHORS,
            "nvlink_gbps": "900 GB/s one way (NVLink 5), " + _ANCHORS,
        },
    ),
    "H100": Profile(
        "H100",
        132,
        1.98,
        989.0,
        None,
        3.35,
        450.0,
        {
            "sms": "132 SMs (H100 SXM5, NVIDIA H100 datasheet / whitepaper)",
            "clock_ghz": "1.98 GHz max boost (H100 SXM5 whitepaper); informative only",
            "bf16_tflops": "989 TF dense BF16 (H100 SXM datasheet; 0.99 PF in " + _ANCHORS + ")",
            "mxfp8_tflops": "none: Hopper has FP8 (1979 TF dense) but no MX block scaling",
            "hbm_tbps": "3.35 TB/s HBM3, " + _ANCHORS,
            "nvlink_gbps": "NVLink 4: 900 GB/s bidirectional = 450 GB/s one way, " + _ANCHORS,
        },
    ),
    "H200": Profile(
        "H200",
        132,
        1.98,
        989.0,
        None,
        4.8,
        450.0,
        {
            "sms": "132 SMs (H200 SXM: the H100 SXM die)",
            "clock_ghz": "1.98 GHz max boost, as H100 SXM; informative only",
            "bf16_tflops": "989 TF dense BF16 (H200 datasheet), " + _ANCHORS,
            "mxfp8_tflops": "none: no MX block scaling on Hopper",
            "hbm_tbps": "4.8 TB/s HBM3e, " + _ANCHORS,
            "nvlink_gbps": "450 GB/s one way (NVLink 4), " + _ANCHORS,
        },
    ),
}


@dataclass(frozen=True)
class Costs:
    """The model's non-datasheet parameters, each physical. `CALIBRATED` (mok.tune) holds fitted values."""

    task_overhead_us: float = 1.0  # per task: take it, wait for the TMA pipeline to fill, epilogue, publish
    launch_us: float = 5.0  # kernel launch to the first SM running
    barrier_us: float = 3.0  # one group barrier over NVLink (entry, closing)
    tensor_efficiency: float = 1.0  # fraction of the per-SM dense peak a tile GEMM's MMA reaches
    nvlink_per_sm_gbps: float = math.inf  # what one SM's loads and stores can drive over NVLink
    hbm_per_sm_gbps: float = math.inf  # what one SM can drive from HBM
    mma_rows: int = 128  # a tile GEMM runs its rows in blocks of this (one SM's MMA height)

    def replace(self, **kw) -> Costs:
        return dataclasses.replace(self, **kw)


@dataclass(frozen=True)
class Shape:
    """The layer on an EP group of `world` ranks, `tokens` per rank (as MoKConfig and LayerShape name them)."""

    world: int = 4
    experts: int = 384
    hidden: int = 7168
    intermediate: int = 3072
    top_k: int = 6
    tokens: int = 2048
    shared_intermediate: int = 3072
    expert_padding: int = 256
    minibatch: int = 4096
    macrobatch: int = 131072
    mxfp8: bool = False

    def __post_init__(self):
        if self.experts % self.world:
            raise ValueError(f"experts ({self.experts}) must be a multiple of world ({self.world})")
        if self.top_k > self.experts:
            raise ValueError("top_k must be at most experts")

    @property
    def experts_per_rank(self) -> int:
        return self.experts // self.world

    def replace(self, **kw) -> Shape:
        return dataclasses.replace(self, **kw)


# MoK's published benchmark shape (/work/shared/ANCHORS.md); its FLOPs count a shared expert of size I.
MOK_SHAPE = Shape()


def routing(shape: Shape, dist: str = "uniform", seed: int = 0, zipf_s: float = 1.2, hot: float = 0.5) -> np.ndarray:
    """Every rank's top-k ids, int32 [world, tokens, top_k], K distinct experts per token.

    dist: "uniform"; "zipf" (expert popularity ~ 1 / rank^zipf_s, ranks of experts shuffled); "hot" (a fraction
    `hot` of tokens route one of their k to expert 0, the rest uniform)."""
    rng = np.random.default_rng(seed)
    w, t, k, e = shape.world, shape.tokens, shape.top_k, shape.experts
    if dist == "uniform":
        logp = np.zeros(e, np.float32)
    elif dist == "zipf":
        logp = (-zipf_s * np.log(np.arange(1, e + 1, dtype=np.float64)))[rng.permutation(e)].astype(np.float32)
    elif dist == "hot":
        logp = np.zeros(e, np.float32)
    else:
        raise ValueError(f"dist: {dist!r} is not 'uniform', 'zipf' or 'hot'")
    ids = np.empty((w, t, k), np.int32)
    for r in range(w):  # top-k of Gumbel-perturbed log-probabilities: k draws without replacement
        g = logp - np.log(-np.log(rng.random((t, e), dtype=np.float32) + 1e-30) + 1e-30)
        if dist == "hot":
            g[rng.random(t) < hot, 0] = np.inf
        ids[r] = np.argpartition(-g, k - 1, axis=1)[:, :k]
    return ids


@dataclass
class Graph:
    """core's task graph of one pass on one rank, with each task's work. Task ids: comm queue first."""

    shape: Shape
    kind: str
    rank: int
    raw: dict
    num_comm: int
    queue: np.ndarray
    kinds: np.ndarray
    index: np.ndarray
    block: np.ndarray
    dep_start: np.ndarray
    deps: np.ndarray
    rows: np.ndarray  # rows a task's GEMM works on (tile tasks, shared, wgrad: its part's rows; comm: routed rows)
    flops: np.ndarray  # useful tensor-core FLOPs (routed rows only)
    exec_flops: np.ndarray  # FLOPs the tensor cores execute (rows in blocks of Costs.mma_rows)
    hbm_bytes: np.ndarray
    nvlink_bytes: np.ndarray  # remote bytes (comm tasks)
    nvlink_peer_bytes: np.ndarray  # [num_comm, world]: per peer (0 for the own rank)

    @property
    def n(self) -> int:
        return len(self.kinds)


def graph(shape: Shape, ids: np.ndarray, rank: int, kind: str = "forward", mma_rows: int = 128) -> Graph:
    """The task list of both queues for `rank` (its kind, index, block, dependencies, FLOPs, bytes)."""
    from mok import _mok

    if kind not in PASS_KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {PASS_KINDS}")
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    spec = dict(
        experts_per_rank=shape.experts_per_rank,
        hidden=shape.hidden,
        intermediate=shape.intermediate,
        shared_intermediate=shape.shared_intermediate,
        mxfp8=int(shape.mxfp8),
        expert_padding=shape.expert_padding,
        minibatch=shape.minibatch,
        macrobatch=shape.macrobatch,
    )
    if not hasattr(_mok, "task_graph"):
        raise RuntimeError("this mok's extension was built without core's task graph (mok._mok.task_graph: a "
                           "package built against an installed libmok without libmok's source tree beside it); "
                           "mok.perf needs it")
    raw = _mok.task_graph(spec, ids, rank, kind)
    if list(raw["kind_names"]) != list(KINDS):
        raise RuntimeError(f"core's task kinds {raw['kind_names']} are not mok.perf's {KINDS}")
    arrays = (np.asarray(raw[k]) for k in ("queue", "kind", "index", "block", "dep_start", "deps"))
    g = Graph(shape, kind, rank, raw, int(raw["num_comm"]), *arrays, *([None] * 6))
    _work(g, mma_rows)
    return g


def _work(g: Graph, mma_rows: int) -> None:
    """Each task's FLOPs and bytes, from its kind and the schedule (vectorised over tasks of a kind)."""
    s, kind = g.shape, g.kind
    h, i, i_s, p = s.hidden, s.intermediate, s.shared_intermediate, s.expert_padding
    a = 1.0 + 1.0 / 32 if s.mxfp8 else 2.0  # bytes per GEMM operand element (e4m3 and its e8m0 scale, or bf16)
    backward = kind in ("backward", "backward_kept")
    n = g.n
    rows = np.zeros(n)
    flops = np.zeros(n)
    exec_rows = np.zeros(n)  # rows the MMA runs
    hbm = np.zeros(n)
    nvl = np.zeros(n)
    tile_rows = np.asarray(g.raw["tile_rows"], dtype=np.float64)
    kinds, index, block = g.kinds, g.index, g.block

    def cols(width, sel):
        return np.minimum(COLUMN_BLOCK, width - block[sel] * COLUMN_BLOCK).astype(np.float64)

    def tiles(name):
        sel = kinds == KIND[name]
        r = tile_rows[index[sel]]
        rows[sel] = r
        exec_rows[sel] = np.ceil(r / mma_rows) * mma_rows
        return sel, r

    sel, r = tiles("gate_up")  # g, u = x W_gate^T, x W_up^T over a block of I
    c = cols(i, sel)
    flops[sel], hbm[sel] = 4 * r * c * h, r * h * a + 2 * c * h * a + 2 * r * c * 2
    sel, r = tiles("down")  # y = h W_down^T over a block of H
    c = cols(h, sel)
    flops[sel], hbm[sel] = 2 * r * c * i, r * i * a + c * i * a + r * c * 2
    sel, r = tiles("dgrad_h")  # dh = dy W_down over a block of I
    c = cols(i, sel)
    flops[sel], hbm[sel] = 2 * r * c * h, r * h * a + c * h * a + r * c * 2
    sel, r = tiles("dgrad_x")  # dx = dg W_gate + du W_up over a block of H
    c = cols(h, sel)
    flops[sel], hbm[sel] = 4 * r * c * i, 2 * r * i * a + 2 * c * i * a + r * c * 2
    sel, r = tiles("swiglu")  # elementwise: read g, u; write h
    hbm[sel] = r * i * (4 + a)
    sel, r = tiles("swiglu_bwd")  # read g, u, dh; write dg, du, h (MXFP8: both orientations)
    hbm[sel] = r * i * (6 + 3 * a * (2 if s.mxfp8 else 1))

    sel = kinds == KIND["wgrad"]  # one block of dW_down, dW_gate or dW_up over its part's rows
    if sel.any():
        first, end = np.asarray(g.raw["part_first_tile"]), np.asarray(g.raw["part_end_tile"])
        prefix = np.concatenate([[0.0], np.cumsum(tile_rows)])
        part_rows = prefix[end] - prefix[first]
        r = part_rows[index[sel]]
        blocks_h = -(-h // COLUMN_BLOCK)
        j = block[sel]
        down = j < blocks_h
        height = np.where(down, h, i)
        row0 = np.where(down, j, (j - blocks_h) % -(-i // COLUMN_BLOCK)) * COLUMN_BLOCK
        br = np.minimum(COLUMN_BLOCK, height - row0).astype(np.float64)
        width = np.where(down, i, h).astype(np.float64)
        rows[sel] = r
        exec_rows[sel] = r  # the tokens are the depth: no padding to MMA rows
        flops[sel] = 2 * br * width * r
        hbm[sel] = r * (br + width) * a + br * width * 4  # operands over the part; the block's fp32 sums once

    sel = kinds == KIND["shared"]  # a chunk of P local tokens through the whole shared expert
    if sel.any():
        t = int(g.raw["tokens"])
        r = np.minimum(p, t - index[sel] * p).astype(np.float64)
        rows[sel], exec_rows[sel] = r, np.ceil(r / mma_rows) * mma_rows
        gemms = 16 if backward else 6  # forward: gate, up, down; backward: those again + dh, dx, 3 wgrads
        flops[sel] = gemms * r * i_s * h
        hbm[sel] = 3 * i_s * h * 2 * (2 if backward else 1) + r * h * 2 * 3 + (3 * i_s * h * 8 if backward else 0)

    # Comm: rows of minibatch m per source rank; a row is H bf16 for x, H more for dout in backward.
    frm = np.asarray(g.raw["minibatch_rows_from"], dtype=np.float64)
    peer = np.zeros((g.num_comm, s.world))
    row_in = h * 2.0 * ((kind != "backward_kept") + backward)
    ring_write = h * (a if s.mxfp8 else 2.0) * ((kind != "backward_kept") + backward)
    for name, per_row, local_extra in (("dispatch", row_in, ring_write), ("combine", h * 2.0, h * 2.0)):
        sel = np.flatnonzero(kinds == KIND[name])
        f = frm[index[sel]]
        remote = f.copy()
        remote[:, g.rank] = 0
        peer[sel] = remote * per_row
        total = f.sum(axis=1)
        rows[sel] = total
        nvl[sel] = remote.sum(axis=1) * per_row
        hbm[sel] = f[:, g.rank] * per_row + total * local_extra  # local rows read in HBM; the ring's side

    g.rows, g.flops, g.hbm_bytes, g.nvlink_bytes, g.nvlink_peer_bytes = rows, flops, hbm, nvl, peer
    with np.errstate(invalid="ignore", divide="ignore"):
        g.exec_flops = np.where(rows > 0, flops * exec_rows / np.where(rows > 0, rows, 1), 0.0)


@dataclass
class Result:
    """A predicted pass (model output, not a measurement)."""

    time_s: float
    task_phase_s: float
    roofline_s: float
    nvlink_s: float
    tensor_s: float
    start: np.ndarray
    finish: np.ndarray
    worker: np.ndarray
    comm_sms: int
    compute_sms: int
    breakdown: dict  # per worker class: busy, waiting, idle (fractions of the task phase)
    kind_busy_s: dict  # SM-seconds per task kind

    @property
    def fraction_of_roofline(self) -> float:
        return self.roofline_s / self.time_s


def simulate(g: Graph, profile: Profile, comm_sms: int, costs: Costs | None = None, check: bool = True) -> Result:
    """One pass of `g` on `profile` with `comm_sms` comm SMs and the rest compute: the predicted timeline."""
    costs = costs if costs is not None else Costs()
    s = g.shape
    sms = profile.sms
    if not 1 <= comm_sms < sms:
        raise ValueError(f"comm_sms ({comm_sms}) must be in [1, {sms - 1}] for {profile.name}")
    n, nc = g.n, g.num_comm
    rate = profile.tensor_tflops(s.mxfp8) * 1e12 / sms * costs.tensor_efficiency  # FLOP/s of one SM
    hbm_bw, nvl_bw = profile.hbm_tbps * 1e12, profile.nvlink_gbps * 1e9
    cap_h, cap_n = costs.hbm_per_sm_gbps * 1e9, costs.nvlink_per_sm_gbps * 1e9
    overhead = costs.task_overhead_us * 1e-6
    compute_time = g.exec_flops / rate
    hb, nb = g.hbm_bytes, g.nvlink_bytes
    # Dependents as a CSR, and each task's count of unfinished dependencies.
    dep_of = np.repeat(np.arange(n), np.diff(g.dep_start))
    order = np.argsort(g.deps, kind="stable")
    dependents = dep_of[order]
    dstart = np.searchsorted(g.deps[order], np.arange(n + 1))
    remaining = np.diff(g.dep_start).astype(np.int64)
    # Where in a task its waits are: at its start (0), except the backward's shared chunk, which computes its
    # g, u, h, dh and dx (10 of its 16 GEMM units of rows x I_s x H) before it waits for the chunk before it
    # (compute_tasks.hpp, run_shared: only the weight gradients go in chunk order).
    wait_at = np.zeros(n)
    if g.kind in ("backward", "backward_kept"):
        wait_at[g.kinds == KIND["shared"]] = 10 / 16

    IDLE, WAIT, LAT, RUN, DONE = 0, 1, 2, 3, 4
    state = np.zeros(sms, np.int8)
    task = np.full(sms, -1, np.int64)
    queue_of = np.where(np.arange(sms) < comm_sms, 0, 1)
    heads, ends = [0, nc], [nc, n]
    lat_end = np.zeros(sms)
    progress = np.zeros(sms)
    tc, th, tn = np.zeros(sms), np.zeros(sms), np.zeros(sms)
    busy, waiting = np.zeros(sms), np.zeros(sms)
    start, finish = np.full(n, np.nan), np.full(n, np.nan)
    worker_of = np.full(n, -1, np.int64)
    t0 = (costs.launch_us + costs.barrier_us) * 1e-6
    t = t0
    while True:
        for w in np.flatnonzero(state == IDLE):  # take the next task of the worker's queue, in order
            q = queue_of[w]
            if heads[q] < ends[q]:
                task[w], state[w], progress[w] = heads[q], WAIT, 0.0
                heads[q] += 1
            else:
                state[w] = DONE
        held = np.maximum(task, 0)
        free = remaining[held] == 0
        started = ~np.isnan(start[held])
        state[(state == WAIT) & free & started] = RUN  # past a wait inside the task
        ready = np.flatnonzero((state == WAIT) & (free | (wait_at[held] > 0)) & ~started)
        if len(ready):
            k = task[ready]
            start[k], worker_of[k] = t, ready
            state[ready], lat_end[ready] = LAT, t + overhead
            tc[ready], th[ready], tn[ready], progress[ready] = compute_time[k], hb[k], nb[k], 0.0
        if (state == DONE).all():
            break
        run = state == RUN
        n_h = np.count_nonzero(run & (th > 0))
        n_n = np.count_nonzero(run & (tn > 0))
        share_h = min(cap_h, hbm_bw / max(n_h, 1))
        share_n = min(cap_n, nvl_bw / max(n_n, 1))
        duration = np.maximum(tc, np.maximum(th / share_h, tn / share_n))
        # A task with a wait inside it runs up to that point, then waits there for its dependencies.
        stop = np.where(remaining[np.maximum(task, 0)] > 0, wait_at[np.maximum(task, 0)], 1.0)
        left = np.where(run, (stop - progress) * duration, np.inf)
        left = np.where(state == LAT, lat_end - t, left)
        dt = left.min()
        if not np.isfinite(dt):
            raise RuntimeError("the simulated pass is stuck: every taken task waits (a broken graph)")
        dt = max(dt, 0.0)
        busy += dt * ((state == RUN) | (state == LAT))
        waiting += dt * (state == WAIT)
        with np.errstate(invalid="ignore", divide="ignore"):
            progress = np.where(run & (duration > 0), progress + dt / duration, progress)
            progress = np.where(run & (duration == 0), stop, progress)
        t += dt
        ended = np.flatnonzero(left <= dt * (1 + 1e-12) + 1e-15)
        for w in ended:
            if state[w] == LAT:
                state[w] = RUN
                continue
            k = task[w]
            if remaining[k] > 0:  # reached the wait inside the task
                state[w] = WAIT
                continue
            finish[k] = t
            remaining[dependents[dstart[k] : dstart[k + 1]]] -= 1
            state[w], task[w] = IDLE, -1
    task_phase = t - t0
    # After the closing barrier: the home sums (and in backward the shared expert's write-out) over HBM.
    tokens, k_, h = s.tokens, s.top_k, s.hidden
    backward = g.kind in ("backward", "backward_kept")
    sums_bytes = tokens * (k_ + 2) * h * 2 * (2 if backward else 1)
    if backward:
        sums_bytes += 3 * s.shared_intermediate * h * 6
    sums_s = sums_bytes / hbm_bw if g.kind != "recompute" else 0.0
    total = t + costs.barrier_us * 1e-6 + sums_s
    if check and (np.isnan(finish).any() or (remaining != 0).any()):
        raise RuntimeError("a task never ran")
    nvlink_s = g.nvlink_bytes.sum() / nvl_bw
    tensor_s = g.flops.sum() / (profile.tensor_tflops(s.mxfp8) * 1e12)
    roof = max(nvlink_s, tensor_s)
    breakdown = {}
    for name, sel in (("comm", queue_of == 0), ("compute", queue_of == 1)):
        span = task_phase * sel.sum()
        breakdown[name] = dict(
            busy=busy[sel].sum() / span,
            waiting=waiting[sel].sum() / span,
            idle=1 - (busy[sel].sum() + waiting[sel].sum()) / span,
        )
    dur = finish - start
    kind_busy = {KINDS[k]: float(dur[g.kinds == k].sum()) for k in np.unique(g.kinds)}
    return Result(
        total,
        task_phase,
        roof,
        nvlink_s,
        tensor_s,
        start,
        finish,
        worker_of,
        comm_sms,
        sms - comm_sms,
        breakdown,
        kind_busy,
    )


def busiest_rank(shape: Shape, ids: np.ndarray) -> int:
    """The rank that receives the most routed rows (a pass is as slow as its slowest rank)."""
    experts = ids[ids >= 0] // shape.experts_per_rank
    return int(np.argmax(np.bincount(experts, minlength=shape.world)))


def predict(
    shape: Shape = MOK_SHAPE,
    profile: str | Profile = "GB200",
    kind: str = "forward",
    comm_sms: int = 36,
    costs: Costs | None = None,
    dist: str = "uniform",
    seed: int = 0,
    ids: np.ndarray | None = None,
) -> Result:
    """A predicted pass on the busiest rank of a routing drawn from `dist` (or the given ids)."""
    profile = PROFILES[profile] if isinstance(profile, str) else profile
    costs = costs if costs is not None else calibrated()
    ids = routing(shape, dist, seed) if ids is None else ids
    g = graph(shape, ids, busiest_rank(shape, ids), kind, costs.mma_rows)
    return simulate(g, profile, comm_sms, costs)


def mok_tflops(shape: Shape, seconds: float, backward: bool = False) -> float:
    """MoK's throughput figure: 6 (T + T K) H I / t, x2 for the backward (counts a shared expert of size I)."""
    flops = 6 * (shape.tokens + shape.tokens * shape.top_k) * shape.hidden * shape.intermediate
    return flops * (2 if backward else 1) / seconds / 1e12


def calibrated() -> Costs:
    """The fitted costs (mok.tune's CALIBRATED), else the defaults."""
    from mok import tune

    return tune.CALIBRATED
