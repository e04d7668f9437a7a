"""mok.perf: the performance model's invariants (its outputs are predictions; nothing here measures a GPU).

Small shapes keep each simulation well under a second; routings are drawn fresh per seed."""

import dataclasses
import math

import numpy as np
import pytest

from mok import perf

try:
    from mok import _mok

    HAS_GRAPH = hasattr(_mok, "task_graph")
except ImportError:
    HAS_GRAPH = False
pytestmark = pytest.mark.skipif(not HAS_GRAPH, reason="mok._mok has no task_graph (an extension built without "
                                                      "core's headers, or MOK_NO_EXTENSION): mok.perf needs it")

SMALL = perf.Shape(
    world=2,
    experts=16,
    hidden=1024,
    intermediate=768,
    top_k=2,
    tokens=1024,
    shared_intermediate=0,
    expert_padding=128,
    minibatch=512,
    macrobatch=2048,
)
FREE = perf.Costs(task_overhead_us=0.0, launch_us=0.0, barrier_us=0.0)  # no latencies, no per-SM caps
PASSES = ("forward", "recompute", "backward", "backward_kept")


def infinite(profile):
    return dataclasses.replace(profile, hbm_tbps=math.inf, nvlink_gbps=math.inf)


def draw(shape, seed, dist="uniform"):
    return perf.routing(shape, dist, seed=seed)


def test_routing_draws_distinct_experts_per_token():
    rng = np.random.default_rng(1)
    for dist in ("uniform", "zipf", "hot"):
        ids = draw(SMALL, int(rng.integers(1 << 30)), dist)
        assert ids.shape == (SMALL.world, SMALL.tokens, SMALL.top_k) and ids.dtype == np.int32
        assert ids.min() >= 0 and ids.max() < SMALL.experts
        assert (np.sort(ids, axis=2)[:, :, 1:] != np.sort(ids, axis=2)[:, :, :-1]).all()
    hot = draw(SMALL, 5, "hot")
    # half the tokens send a route to expert 0, the rest pick it with chance about K / E = 1/8
    share = (hot == 0).any(axis=2).mean()
    assert 0.5 < share < 0.65


@pytest.mark.parametrize("kind", PASSES)
def test_graph_flops_add_up_to_the_layer(kind):
    # Compute-queue FLOPs against the layer's own count, per routed row: forward 3 GEMMs (6 H I), backward
    # gate_up again, dgrad_h, dgrad_x and the weight gradients (16 H I; 12 when g, u are kept); the shared
    # expert per local token 6 (forward) or 16 (backward) H I_s. Exact: every count is an integer in float64.
    shape = SMALL.replace(shared_intermediate=256)
    ids = draw(shape, 11)
    ids[0, :37, 0] = -1  # a few -1 routes
    g = perf.graph(shape, ids, 1, kind)
    rows = int(np.asarray(g.raw["expert_rows"]).sum())
    per_row = {"forward": 6, "recompute": 6, "backward": 16, "backward_kept": 12}[kind]
    shared = 0 if kind == "recompute" else (16 if kind in ("backward", "backward_kept") else 6)
    want = per_row * rows * shape.hidden * shape.intermediate + shared * shape.tokens * shape.hidden * 256
    assert g.flops[g.queue == 1].sum() == want
    assert g.flops[g.queue == 0].sum() == 0
    # The down GEMM alone: 2 H I per routed row.
    if kind in ("forward", "recompute"):
        assert g.flops[g.kinds == perf.KIND["down"]].sum() == 2 * rows * shape.hidden * shape.intermediate
    # Every remote row crosses NVLink once each way: H bf16 (x in, y out) forward.
    remote = sum(int(((ids[r] // shape.experts_per_rank) == 1).sum()) for r in range(shape.world) if r != 1)
    if kind == "forward":
        assert g.nvlink_bytes.sum() == 2 * remote * shape.hidden * 2


def check_timeline(g, res):
    """Every task ran once, on a worker of its queue, after each of its dependencies, one task at a time per SM."""
    assert np.isfinite(res.start).all() and np.isfinite(res.finish).all()
    assert (res.finish >= res.start).all()
    dep_of = np.repeat(np.arange(g.n), np.diff(g.dep_start))
    late = res.start[dep_of] < res.finish[g.deps] - 1e-15
    # the shared chunk of a backward waits inside the task: only its end follows its dependency
    inside = g.kinds[dep_of] == perf.KIND["shared"]
    assert not (late & ~inside).any()
    assert (res.finish[dep_of] >= res.finish[g.deps]).all()
    assert ((res.worker < res.comm_sms) == (g.queue == 0)).all()
    for w in np.unique(res.worker):
        mine = np.flatnonzero(res.worker == w)
        o = mine[np.argsort(res.start[mine], kind="stable")]
        assert (res.start[o[1:]] >= res.finish[o[:-1]] - 1e-15).all()


@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("kind", PASSES)
def test_tasks_run_once_and_in_the_pipeline_order(kind, seed):
    # The order checked here is written from the kinds and indices, not from the graph's dependency lists, so a
    # dependency the graph drops shows: tile stages after their minibatch's dispatch, combine m after m's last
    # stage, dispatch m + R after combine m (the ring), down / dgrad_x of m after combine m - 2 (output ring).
    shape = SMALL.replace(macrobatch=1024, shared_intermediate=128 if seed == 4 else 0)
    ids = draw(shape, seed, "zipf")
    g = perf.graph(shape, ids, perf.busiest_rank(shape, ids), kind)
    res = perf.simulate(g, perf.PROFILES["GB200"], 8, perf.Costs(task_overhead_us=0.5))
    check_timeline(g, res)
    k, idx = g.kinds, g.index
    P, mb, R = shape.expert_padding, shape.minibatch, shape.macrobatch // shape.minibatch
    tile_kinds = [perf.KIND[n] for n in ("gate_up", "swiglu", "down", "dgrad_h", "swiglu_bwd", "dgrad_x")]
    is_tile = np.isin(k, tile_kinds)
    tile_mb = np.where(is_tile, idx * P // mb, -1)
    disp = {int(idx[j]): j for j in np.flatnonzero(k == perf.KIND["dispatch"])}
    comb = {int(idx[j]): j for j in np.flatnonzero(k == perf.KIND["combine"])}
    last = perf.KIND["down"] if kind in ("forward", "recompute") else perf.KIND["dgrad_x"]
    first = perf.KIND["gate_up"] if kind != "backward_kept" else perf.KIND["dgrad_h"]
    for m, d in disp.items():
        tiles = np.flatnonzero(is_tile & (tile_mb == m))
        assert (res.start[tiles] >= res.finish[d] - 1e-15).all(), f"a tile of minibatch {m} before its dispatch"
        ends = np.flatnonzero((k == last) & (tile_mb == m))
        assert res.start[comb[m]] >= res.finish[ends].max() - 1e-15, f"combine {m} before its tiles"
        if m >= R:
            assert res.start[d] >= res.finish[comb[m - R]] - 1e-15, f"dispatch {m} overwrote live ring rows"
        if m >= 2:
            assert (res.start[ends] >= res.finish[comb[m - 2]] - 1e-15).all(), f"minibatch {m}'s output rows"
    for t in np.unique(idx[is_tile]):
        mine = is_tile & (idx == t)
        firsts, rest = np.flatnonzero(mine & (k == first)), np.flatnonzero(mine & (k != first))
        assert (res.start[rest] >= res.finish[firsts].max() - 1e-15).all(), f"tile {t}'s stages out of order"


@pytest.mark.parametrize("mxfp8", [False, True])
def test_infinite_bandwidth_gives_compute_over_the_compute_sms_rate(mxfp8):
    # With no latencies and unbounded bandwidth the pass takes the compute queue's FLOPs over the compute SMs'
    # rate, plus at most the tail of one task. That holds when each minibatch has many tiles per compute SM (here
    # 64 tiles of 3 + 1 + 4 tasks on 10 SMs): a worker takes its task before the task's stage may start, so with
    # few tiles per SM the workers that took the next stage wait for the last tasks of the one before.
    shape = SMALL.replace(mxfp8=mxfp8, tokens=8192, world=1, experts=8, minibatch=8192, macrobatch=16384)
    g = perf.graph(shape, draw(shape, 21), 0, "forward")
    prof = dataclasses.replace(infinite(perf.PROFILES["GB200"]), sms=12)
    comm = 2
    res = perf.simulate(g, prof, comm, FREE)
    rate = prof.tensor_tflops(mxfp8) * 1e12 / prof.sms
    work = g.exec_flops[g.queue == 1]
    ideal = work.sum() / ((prof.sms - comm) * rate)
    tail = work.max() / rate
    assert ideal <= res.time_s <= ideal + tail, (res.time_s, ideal, tail)


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_more_nvlink_bandwidth_never_slows_a_pass(seed):
    rng = np.random.default_rng(seed)
    shape = SMALL.replace(world=int(rng.choice([2, 4])), minibatch=int(rng.choice([256, 512])))
    ids = draw(shape, seed, ["uniform", "zipf", "hot"][seed % 3])
    costs = perf.Costs(nvlink_per_sm_gbps=float(rng.uniform(5, 50)))
    for kind in ("forward", "backward"):
        g = perf.graph(shape, ids, perf.busiest_rank(shape, ids), kind)
        base = perf.PROFILES["GB200"]
        for nvl in (20.0, 100.0, 900.0):
            slow = perf.simulate(g, dataclasses.replace(base, nvlink_gbps=nvl), 16, costs).time_s
            fast = perf.simulate(g, dataclasses.replace(base, nvlink_gbps=2 * nvl), 16, costs).time_s
            assert fast <= slow * (1 + 1e-12), (kind, nvl, fast, slow)


def test_more_comm_sms_help_when_nvlink_bound():
    # Each comm SM drives at most 10 GB/s over NVLink: with 2 of them the pass waits for its rows. A dispatch is one
    # task per minibatch, so comm SMs help up to the minibatches in flight: small minibatches, a ring of 64 of them.
    shape = SMALL.replace(world=4, experts=16, minibatch=128, macrobatch=8192)
    ids = draw(shape, 41)
    g = perf.graph(shape, ids, 0, "forward")
    costs = perf.Costs(nvlink_per_sm_gbps=10.0)
    times = [perf.simulate(g, perf.PROFILES["GB200"], c, costs).time_s for c in (2, 4, 8)]
    assert times[0] > times[1] > times[2]
    res = perf.simulate(g, perf.PROFILES["GB200"], 2, costs)
    assert res.breakdown["comm"]["busy"] > res.breakdown["compute"]["busy"]
    assert res.nvlink_s > 0 and res.roofline_s >= max(res.nvlink_s, res.tensor_s)


def test_roofline_and_fraction():
    shape = SMALL.replace(world=4, experts=16)
    res = perf.predict(shape, "B200", "forward", comm_sms=16, costs=perf.Costs(), seed=7)
    assert res.roofline_s == max(res.nvlink_s, res.tensor_s)
    assert 0 < res.fraction_of_roofline <= 1
    for cls in ("comm", "compute"):
        b = res.breakdown[cls]
        assert abs(b["busy"] + b["waiting"] + b["idle"] - 1) < 1e-9 and min(b.values()) >= -1e-9


def test_profiles_name_a_source_for_every_number():
    numbers = ("sms", "clock_ghz", "bf16_tflops", "mxfp8_tflops", "hbm_tbps", "nvlink_gbps")
    assert set(perf.PROFILES) == {"GB200", "GB300", "B200", "H100", "H200"}
    for p in perf.PROFILES.values():
        assert all(p.sources.get(n) for n in numbers), p.name


def test_bad_arguments_are_refused():
    g = perf.graph(SMALL, draw(SMALL, 1), 0, "forward")
    with pytest.raises(ValueError, match="comm_sms"):
        perf.simulate(g, perf.PROFILES["H100"], 132)
    with pytest.raises(ValueError, match="MXFP8"):
        perf.simulate(perf.graph(SMALL.replace(mxfp8=True), draw(SMALL, 1), 0, "forward"), perf.PROFILES["H100"], 8)
    with pytest.raises(ValueError, match="multiple of world"):
        SMALL.replace(world=3)
    with pytest.raises(ValueError, match="kind"):
        perf.graph(SMALL, draw(SMALL, 1), 0, "sideways")
    with pytest.raises(ValueError, match="ids"):
        perf.graph(SMALL, np.full((2, 4, 2), 99, np.int32), 0, "forward")
    with pytest.raises(ValueError, match="dist"):
        perf.routing(SMALL, "normal")
