"""python -m mok.bench: the MoE layer's forward and backward per CPU backend, side by side.

Each run starts --world processes as one gloo group (every rank draws the same problem from the seed and takes its
tokens and experts) and times, per rank and iteration, after --warmup untimed iterations:

  host         mok.functional.forward / backward with backend="host" (libmok's host executor)
  reference    the same calls with backend="reference" (pure PyTorch, mok.ep)
  composed     the layer written the way a user would: gather rows per expert, per-expert torch.matmul GEMMs and
               SwiGLU, index_add back, bf16 storage, autograd for the backward (all_to_all when W > 1)
  matmul-fp32  torch.matmul alone, fp32, at the experts' GEMM shapes on this rank (the same FLOPs, no layer)

An iteration's time is the slowest rank's (the layer is collective). FLOPs per rank: 6 * T*K * H * I per forward
(gate, up, down: three GEMMs of 2 * rows * H * I), plus 6 * T * H * I_s for the shared expert; the backward is
twice that. "x ref" and "x matmul" are throughput ratios (that line's median time over this line's).

--device cuda (one process per GPU, launched by torchrun; NCCL) times, with CUDA events after --warmup
iterations, each CUDA-capable mok backend (mok.functional.backends()) against a composed GPU baseline (all_to_all,
then torch._grouped_mm, else per-expert matmuls): the max over ranks per iteration, the median; TFLOP/s by MoK's
6 (T + T K) H I / t (x2 backward). Without a CUDA device it says so and times nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace

import torch
import torch._dynamo  # noqa: F401 - a custom op's first call imports it: once here, not once per forked rank
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F

import mok
from mok import functional
from mok._group import run_group
from mok.demo import layer_inputs
from mok.experts import RoutedExperts

CASES = ("host", "reference", "composed", "matmul-fp32")
# torch.distributed.nn.functional.all_to_all_single (the public autograd all_to_all) warns on every call that a
# private module replaces it; the composed baseline keeps the public one.
warnings.filterwarnings("ignore", message=".*all_to_all_single is deprecated", category=FutureWarning)
RANK_TIMEOUT_S = 1800  # the longest a whole run may take on one rank before the parent gives up on it


@dataclass(frozen=True)
class Problem:
    tokens: int  # per rank
    hidden: int
    intermediate: int
    experts: int  # global
    topk: int
    shared: int  # I_s, 0 for none
    mxfp8: bool = False


PRESETS = {
    "mok": (Problem(2048, 7168, 3072, 384, 6, 3072), [4]),  # MoK's benchmark shape (a GPU's: --device cuda)
    "tiny": (Problem(64, 64, 32, 4, 2, 64), [1]),
    "issue9-small": (Problem(1024, 512, 256, 16, 4, 512), [1]),
    "issue9-large": (Problem(2048, 1024, 512, 32, 4, 0), [1, 2]),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m mok.bench", description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="issue9-small",
                   help="sizes and world sizes from issue #9 (tiny: for CI); the options below override them")
    p.add_argument("--tokens", type=int, help="tokens per rank")
    p.add_argument("--hidden", type=int)
    p.add_argument("--intermediate", type=int)
    p.add_argument("--experts", type=int, help="global routed experts, a multiple of --world")
    p.add_argument("--topk", type=int)
    p.add_argument("--shared", type=int, help="the shared expert's intermediate size I_s, 0 for none")
    p.add_argument("--mxfp8", action="store_true", help="routed experts in MXFP8 for host and reference")
    p.add_argument("--world", type=int, action="append", help="ranks (processes over gloo); repeat for several runs")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: the CPU backends in forked gloo ranks; cuda: one GPU per rank under torchrun")
    p.add_argument("--iters", type=int, help="timed iterations (default 10 on cpu, 100 on cuda)")
    p.add_argument("--warmup", type=int, help="untimed iterations first (default 2 on cpu, 50 on cuda)")
    p.add_argument("--threads", type=int, help="torch threads per rank (default: the CPUs / the world size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write the results here")
    p.add_argument("--plot", metavar="PATH", help="also draw the median times as a PNG (matplotlib)")
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    if args.preset == "mok" and not cuda:
        p.error("--preset mok is MoK's GPU benchmark shape (about 50 GB of expert weights): use it with --device cuda")
    args.iters = args.iters if args.iters is not None else (100 if cuda else 10)
    args.warmup = args.warmup if args.warmup is not None else (50 if cuda else 2)
    problem, worlds = PRESETS[args.preset]
    overrides = {name: getattr(args, name) for name in ("tokens", "hidden", "intermediate", "experts", "topk",
                                                        "shared") if getattr(args, name) is not None}
    args.problem = replace(problem, mxfp8=args.mxfp8 or problem.mxfp8, **overrides)
    args.worlds = args.world or worlds
    if cuda:  # the ranks are torchrun's processes, one GPU each
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if args.world and args.world != [launched]:
            p.error(f"--world on --device cuda is the launcher's (torchrun --nproc-per-node W): this process is "
                    f"one of {launched}, --world says {args.world}")
        args.worlds = [launched]
    for name, value in asdict(args.problem).items():
        if name != "mxfp8" and (value < 0 or (value == 0 and name != "shared")):
            p.error(f"--{name} must be positive, got {value}")
    for world in args.worlds:
        if not 1 <= world <= 72:
            p.error(f"--world must be between 1 and 72, got {world}")
        if args.problem.experts % world:
            p.error(f"--experts ({args.problem.experts}) must be a multiple of --world ({world})")
    if args.problem.topk > args.problem.experts:
        p.error(f"--topk ({args.problem.topk}) must be at most --experts ({args.problem.experts})")
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be at least 1 and --warmup at least 0")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be at least 1")
    return args


# ----------------------------------------------------------------------------------------------------------------
# The problem


def flops(problem: Problem) -> tuple[float, float]:
    """(forward, backward) FLOPs per rank, by the formula in the module docstring."""
    forward = 6.0 * problem.tokens * problem.topk * problem.hidden * problem.intermediate
    forward += 6.0 * problem.tokens * problem.hidden * problem.shared
    return forward, 2 * forward


def draw(problem: Problem, world: int, seed: int):
    """The whole group's inputs (every rank draws the same): x, topk ids and weights, experts, shared, dout."""
    return layer_inputs(seed, problem.tokens * world, problem.hidden, problem.intermediate, problem.shared,
                        problem.experts, problem.topk)


def rank_share(problem: Problem, world: int, rank: int, seed: int):
    """This rank's tokens and experts of the group's problem, and the rows each of its experts receives."""
    x, ids, weights, routed, shared, dout = draw(problem, world, seed)
    tokens = slice(rank * problem.tokens, (rank + 1) * problem.tokens)
    local = problem.experts // world
    experts = slice(rank * local, (rank + 1) * local)
    rows = [int((ids == e).sum()) for e in range(experts.start, experts.stop)]  # from every rank's tokens
    mine = RoutedExperts(*(w[experts].contiguous() for w in (routed.gate, routed.up, routed.down)))
    return (x[tokens].contiguous(), ids[tokens].contiguous(), weights[tokens].contiguous(), mine, shared,
            dout[tokens].contiguous(), rows)


# ----------------------------------------------------------------------------------------------------------------
# What is timed: each case gives (forward, backward) callables; backward() uses what the latest forward() made.


def layer_case(backend: str, x, ids, weights, routed, shared, dout, mxfp8: bool, workers: int):
    """mok's layer on `backend`; the host executor computes on `workers` threads (the torch threads of the other
    cases), plus its one comm worker."""
    routed = routed.to_mxfp8() if mxfp8 else routed
    config = functional.MoKConfig(host_compute_workers=workers)
    state = {}

    def forward():
        state["out"], state["ctx"] = functional.forward(x, ids, weights, routed, shared, backend=backend,
                                                        config=config, group=_group())

    def backward():
        state["grads"] = functional.backward(state.pop("ctx"), dout)

    return forward, backward


def _group():
    """The benchmark's expert-parallel group: every process of run_group's gloo group."""
    return dist.group.WORLD if dist.is_initialized() else functional.LOCAL


def autograd_case(layer, x, ids, weights, routed, shared, dout, world: int):
    """forward() and backward() of `layer` (composed_forward's signature) on fresh leaves, autograd for the backward."""
    leaves = [t.clone().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down)]
    shared_leaves = [w.clone().requires_grad_(True) for w in (shared.gate, shared.up, shared.down)] if shared else []
    state = {}

    def forward():
        for t in leaves + shared_leaves:
            t.grad = None
        state["out"] = layer(*leaves, ids, shared_leaves, world)

    def backward():
        state.pop("out").backward(dout)

    return forward, backward


def composed_case(x, ids, weights, routed, shared, dout, world: int):
    """The layer as a user composes it from torch ops, with autograd for the backward."""
    return autograd_case(composed_forward, x, ids, weights, routed, shared, dout, world)


def composed_forward(x, weights, gate, up, down, ids, shared, world: int):
    T, K = ids.shape
    local = gate.shape[0]
    flat = ids.flatten().long()
    order = torch.argsort(flat, stable=True)  # routes grouped by expert, so by destination rank too
    token = order // K
    rows = x[token]
    expert = flat[order]
    if world > 1:  # send each route's row to its expert's rank, with the expert id
        send = torch.bincount(expert // local, minlength=world)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        send_splits, recv_splits = send.tolist(), recv.tolist()
        rows = dist_nn.all_to_all_single(rows.new_empty(sum(recv_splits), rows.shape[1]), rows, recv_splits,
                                         send_splits)
        got = expert.new_empty(sum(recv_splits))
        dist.all_to_all_single(got, expert, recv_splits, send_splits)
        expert = got % local
    y = []
    for e in range(local):
        mine = rows[expert == e]
        h = F.silu(mine @ gate[e].t()) * (mine @ up[e].t())
        y.append(h @ down[e].t())
    y = torch.cat(y)
    if world > 1:  # rows arrived grouped by source rank: put them in that order again and send them back
        y = y[torch.argsort(torch.argsort(expert, stable=True))]
        y = dist_nn.all_to_all_single(y.new_empty(sum(send_splits), y.shape[1]), y, send_splits, recv_splits)
    weighted = y.float() * weights.flatten()[order][:, None]
    out = torch.zeros(T, x.shape[1], dtype=torch.float32).index_add(0, token, weighted)
    if shared:
        s_gate, s_up, s_down = shared
        out = out + (F.silu(x @ s_gate.t()) * (x @ s_up.t())) @ s_down.t()
    return out.to(torch.bfloat16)


def matmul_case(problem: Problem, rows: list[int]):
    """fp32 torch.matmul at the GEMM shapes of this rank's experts (and the shared expert): the same FLOPs."""
    H, I, Is, T = problem.hidden, problem.intermediate, problem.shared, problem.tokens
    shapes = [(r, I) for r in rows if r] + ([(T, Is)] if Is else [])

    rand = torch.randn
    # Per GEMM shape: X [r, H], W [H, n], A [r, n], D [n, H], dY [r, H], X^T [H, r], A^T [n, r].
    operands = [(rand(r, H), rand(H, n), rand(r, n), rand(n, H), rand(r, H), rand(H, r), rand(n, r))
                for r, n in shapes]

    def forward():
        for x, w, a, wt, _, _, _ in operands:
            torch.matmul(x, w)  # gate
            torch.matmul(x, w)  # up
            torch.matmul(a, wt)  # down

    def backward():
        for _, w, a, wt, dy, xt, at in operands:
            for _ in range(2):  # gate and up: dX = dA W^T, dW = X^T dA
                torch.matmul(a, wt)
                torch.matmul(xt, a)
            torch.matmul(dy, w)  # down: dA = dY D^T, dD = A^T dY
            torch.matmul(at, dy)

    return forward, backward


# ----------------------------------------------------------------------------------------------------------------
# One rank


def rank_run(rank: int, world: int, args) -> dict:
    problem = args.problem
    x, ids, weights, routed, shared, dout, rows = rank_share(problem, world, rank, args.seed)
    cases = {
        "host": layer_case("host", x, ids, weights, routed, shared, dout, problem.mxfp8, threads(args, world)),
        "reference": layer_case("reference", x, ids, weights, routed, shared, dout, problem.mxfp8,
                                threads(args, world)),
        "composed": composed_case(x, ids, weights, routed, shared, dout, world),
        "matmul-fp32": matmul_case(problem, rows),
    }
    times = {}
    for name, (forward, backward) in cases.items():
        fwd, bwd = [], []
        for _ in range(args.warmup + args.iters):
            fwd.append(timed(forward, world))
            bwd.append(timed(backward, world))
        times[name] = {"forward": fwd[args.warmup:], "backward": bwd[args.warmup:]}
    return times


def timed(fn, world: int) -> float:
    if world > 1:
        dist.barrier()  # every rank starts together; gloo's barrier is bounded by the group's timeout
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_world(world: int, args) -> list[dict]:
    """Every rank's times, from `world` forked processes in one gloo group (they inherit the imported torch and mok)."""
    return run_group(world, rank_run, args, timeout_s=RANK_TIMEOUT_S, threads=threads(args, world))


def threads(args, world: int) -> int:
    return args.threads or max(1, (os.cpu_count() or 1) // world)


# ----------------------------------------------------------------------------------------------------------------
# On GPUs (--device cuda): written for a GPU, never run on one here (docs/performance.md says what ran)

GPU_COMPOSED = "composed-gpu"
GROUPED_PATH = ["not run"]  # which grouped GEMM the baseline's latest call ran (grouped_experts)


def cuda_refusal() -> str | None:
    """Why --device cuda cannot run here, or None when a CUDA device is usable."""
    if not torch.cuda.is_available():
        return (f"no CUDA device here (torch.cuda.is_available() is False; torch {torch.__version__}, built for "
                f"CUDA {torch.version.cuda or 'none'})")
    return None


def mok_tflops(problem: Problem, seconds: float, backward: bool) -> float:
    """MoK's figure: 6 (T + T K) H I / t, x2 for the backward (T per rank; it counts a shared expert of size I)."""
    work = 6.0 * (problem.tokens + problem.tokens * problem.topk) * problem.hidden * problem.intermediate
    return work * (2 if backward else 1) / seconds / 1e12


def gpu_rank_inputs(problem: Problem, world: int, rank: int, seed: int, device):
    """This rank's inputs, drawn on the GPU: its tokens, its experts (seeded per rank, so no rank builds all E
    experts), the shared expert (alike on every rank) and the group's routing (every rank draws all of it)."""
    from mok.experts import SharedExpert

    T, H, I, Is, E, K = (problem.tokens, problem.hidden, problem.intermediate, problem.shared, problem.experts,
                         problem.topk)
    local = E // world

    def bf16(gen, *shape, fan_in=1):
        return (torch.randn(*shape, generator=gen, device=device) / fan_in ** 0.5).to(torch.bfloat16)

    group_gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(world * T, E, generator=group_gen, device=device)
    weights, ids = logits.softmax(-1).topk(K, dim=-1)  # softmax top-k routing of the whole group
    mine = slice(rank * T, (rank + 1) * T)
    shared = SharedExpert(bf16(group_gen, Is, H, fan_in=H), bf16(group_gen, Is, H, fan_in=H),
                          bf16(group_gen, H, Is, fan_in=Is)) if Is else None
    gen = torch.Generator(device=device).manual_seed(seed + 1 + rank)
    routed = RoutedExperts(bf16(gen, local, I, H, fan_in=H), bf16(gen, local, I, H, fan_in=H),
                           bf16(gen, local, H, I, fan_in=I))
    return (bf16(gen, T, H), ids[mine].to(torch.int32).contiguous(), weights[mine].contiguous(), routed, shared,
            bf16(gen, T, H))


def grouped_experts(rows, expert, gate, up, down):
    """SwiGLU experts over rows sorted by `expert` (local ids): torch._grouped_mm where this torch has it, else one
    matmul per expert. Returns (y in the rows' order, which path ran)."""
    local = gate.shape[0]
    order = torch.argsort(expert, stable=True)
    sorted_rows = rows[order]
    y = None
    if hasattr(torch, "_grouped_mm"):
        offs = torch.cumsum(torch.bincount(expert, minlength=local), 0).to(torch.int32)
        try:
            g = torch._grouped_mm(sorted_rows, gate.transpose(1, 2), offs=offs)
            u = torch._grouped_mm(sorted_rows, up.transpose(1, 2), offs=offs)
            y, path = torch._grouped_mm(F.silu(g) * u, down.transpose(1, 2), offs=offs), "torch._grouped_mm"
        except RuntimeError:  # a device or shape this torch's grouped GEMM does not take: the matmuls below
            y = None
    if y is None:
        sorted_expert = expert[order]
        parts = []
        for e in range(local):
            mine = sorted_rows[sorted_expert == e]
            parts.append((F.silu(mine @ gate[e].t()) * (mine @ up[e].t())) @ down[e].t())
        y, path = torch.cat(parts), "per-expert matmul"
    return y[torch.argsort(order)], path


def grouped_forward(x, weights, gate, up, down, ids, shared, world: int):
    """The composed GPU baseline: all_to_all of the routed rows, grouped GEMMs, all_to_all back, weighted sum."""
    T, K = ids.shape
    local = gate.shape[0]
    flat = ids.flatten().long()
    order = torch.argsort(flat, stable=True)  # routes grouped by expert, so by destination rank too
    token = order // K
    rows, expert = x[token], flat[order]
    if world > 1:
        send = torch.bincount(expert // local, minlength=world)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        send_splits, recv_splits = send.tolist(), recv.tolist()
        rows = dist_nn.all_to_all_single(rows.new_empty(sum(recv_splits), rows.shape[1]), rows, recv_splits,
                                         send_splits)
        got = expert.new_empty(sum(recv_splits))
        dist.all_to_all_single(got, expert, recv_splits, send_splits)
        expert = got
    y, GROUPED_PATH[0] = grouped_experts(rows, expert % local, gate, up, down)
    if world > 1:
        y = dist_nn.all_to_all_single(y.new_empty(sum(send_splits), y.shape[1]), y, send_splits, recv_splits)
    weighted = y.float() * weights.flatten()[order][:, None]
    out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device).index_add(0, token, weighted)
    if shared:
        s_gate, s_up, s_down = shared
        out = out + (F.silu(x @ s_gate.t()) * (x @ s_up.t())) @ s_down.t()
    return out.to(torch.bfloat16)


def grouped_case(x, ids, weights, routed, shared, dout, world: int):
    return autograd_case(grouped_forward, x, ids, weights, routed, shared, dout, world)


def cuda_timed(fn, world: int) -> float:
    """One call's time in seconds by CUDA events around it on the current stream, the ranks started together."""
    if world > 1:
        dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def gpu_cases(problem: Problem, world: int, rank: int, args, device) -> dict:
    x, ids, weights, routed, shared, dout = gpu_rank_inputs(problem, world, rank, args.seed, device)
    cases = {}
    for backend in functional.backends():
        try:
            functional.select_backend(backend, device)
        except ValueError:
            continue  # a CPU-only executor
        cases[f"mok:{backend}"] = layer_case(backend, x, ids, weights, routed, shared, dout, problem.mxfp8, 1)
    cases[GPU_COMPOSED] = grouped_case(x, ids, weights, routed, shared, dout, world)
    return cases


def gpu_main(args) -> int:
    """--device cuda: this process is one rank of torchrun's group (or the only one), on GPU LOCAL_RANK."""
    refusal = cuda_refusal()
    if refusal is not None:
        print(f"mok bench --device cuda: {refusal}. Nothing was timed: no GPU figure is printed without a GPU. "
              "Run it on a machine with one (torchrun --nproc-per-node W -m mok.bench --device cuda), or use "
              "--device cpu.")
        return 2
    world = args.worlds[0]
    if world > 1:
        dist.init_process_group("nccl")
    rank = dist.get_rank() if world > 1 else 0
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    problem = args.problem
    times = {}
    for name, (forward, backward) in gpu_cases(problem, world, rank, args, device).items():
        fwd, bwd = [], []
        for _ in range(args.warmup + args.iters):
            fwd.append(cuda_timed(forward, world))
            bwd.append(cuda_timed(backward, world))
        times[name] = {"forward": fwd[args.warmup:], "backward": bwd[args.warmup:]}
    per_rank = [times]
    if world > 1:  # every rank's times on every rank: the max over ranks is per iteration
        per_rank = [None] * world
        dist.all_gather_object(per_rank, times)
    lines = gpu_summary(per_rank, problem)
    if rank == 0:
        facts = {"gpu": torch.cuda.get_device_name(device), "gpus": world, "torch": torch.__version__,
                 "cuda": torch.version.cuda, "libmok": mok.libmok_version, "functional_backends": functional.backends(),
                 "grouped_gemm": GROUPED_PATH[0],
                 "deep_ep": "not used by this baseline (all_to_all + grouped GEMM)"}
        print(f"mok bench --device cuda: preset {args.preset}, {world} x {facts['gpu']}; torch {facts['torch']}, "
              f"CUDA {facts['cuda']}, libmok {facts['libmok']}; baseline {GPU_COMPOSED}: all_to_all + "
              f"{facts['grouped_gemm']}")
        print(f"  {args.iters} iterations after {args.warmup} warm-up, CUDA events, the max over ranks per "
              f"iteration, the median; TFLOP/s = 6 (T + T K) H I / t (x2 backward)")
        print(f"  {'pass':<9}{'case':<18}{'median ms':>10}{'min ms':>10}{'max ms':>10}{'TFLOP/s':>9}{'x base':>8}")
        for line in lines:
            print(f"  {line['pass']:<9}{line['case']:<18}{line['median_ms']:>10.3f}{line['min_ms']:>10.3f}"
                  f"{line['max_ms']:>10.3f}{line['tflops']:>9.1f}{line['x_baseline']:>8.2f}")
        report = {"preset": args.preset, "problem": asdict(problem), "iters": args.iters, "warmup": args.warmup,
                  "seed": args.seed, "device": "cuda", "machine": facts, "runs": [{"world": world, "lines": lines}]}
        write_outputs(args, report)
    if world > 1:
        dist.destroy_process_group()
    return 0


def gpu_summary(per_rank: list[dict], problem: Problem) -> list[dict]:
    """One line per pass and case: per iteration the slowest rank, then median, min, max, MoK's TFLOP/s and the
    throughput against the composed GPU baseline."""
    lines = []
    for phase in ("forward", "backward"):
        medians = {}
        for case in per_rank[0]:
            slowest = [max(ranks) for ranks in zip(*(r[case][phase] for r in per_rank), strict=True)]
            medians[case] = statistics.median(slowest)
            lines.append({"pass": phase, "case": case, "median_ms": medians[case] * 1e3, "min_ms": min(slowest) * 1e3,
                          "max_ms": max(slowest) * 1e3,
                          "tflops": mok_tflops(problem, medians[case], phase == "backward")})
        for line in lines[-len(medians):]:
            line["x_baseline"] = medians[GPU_COMPOSED] / medians[line["case"]]
    return lines


def write_outputs(args, report: dict) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot:
        plot(report, args.plot)


def plot(report: dict, path: str) -> None:
    """The median time of each case per pass and world size, as bars (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    runs = report["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(3.4 + 3.0 * len(runs), 3.8), squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        cases = list(dict.fromkeys(line["case"] for line in run["lines"]))
        for i, phase in enumerate(("forward", "backward")):
            medians = {line["case"]: line["median_ms"] for line in run["lines"] if line["pass"] == phase}
            ax.bar([j + 0.4 * i for j in range(len(cases))], [medians[c] for c in cases], width=0.4, label=phase)
        ax.set_xticks([j + 0.2 for j in range(len(cases))], cases, rotation=20, fontsize=8)
        ax.set_ylabel("median ms (slowest rank per iteration)")
        ax.set_title(f"W={run['world']}, {report['device']}", fontsize=9)
        ax.legend(fontsize=8)
    p = report["problem"]
    fig.suptitle(f"mok.bench (measured on this machine): T={p['tokens']}/rank H={p['hidden']} I={p['intermediate']} "
                 f"E={p['experts']} K={p['topk']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------------
# Report


def summarise(per_rank: list[dict], problem: Problem) -> list[dict]:
    """One line per pass and case: the slowest rank's time per iteration, then median, min, max, ratios."""
    work = dict(zip(("forward", "backward"), flops(problem), strict=True))
    lines = []
    for phase in ("forward", "backward"):
        medians = {}
        for case in CASES:
            slowest = [max(ranks) for ranks in zip(*(r[case][phase] for r in per_rank), strict=True)]
            medians[case] = statistics.median(slowest)
            lines.append({"pass": phase, "case": case, "median_ms": medians[case] * 1e3,
                          "min_ms": min(slowest) * 1e3, "max_ms": max(slowest) * 1e3,
                          "gflops": work[phase] / medians[case] / 1e9})
        for line in lines[-len(CASES):]:
            line["x_reference"] = medians["reference"] / medians[line["case"]]
            line["x_matmul"] = medians["matmul-fp32"] / medians[line["case"]]
    return lines


def machine_facts(args) -> dict:
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    host_workers = {str(w): {"comm_workers": 1, "compute_workers": threads(args, w)} for w in args.worlds}
    return {"cpu": model, "logical_cpus": os.cpu_count(), "torch": torch.__version__,
            "torch_threads_per_rank": {str(w): threads(args, w) for w in args.worlds},
            "libmok": mok.libmok_version, "mok_backends": {b.name: "available" if b.available else b.reason
                                                          for b in mok.backends()},
            "functional_backends": functional.backends(), "host_workers_per_rank": host_workers}


def print_run(problem: Problem, world: int, args, lines: list[dict]) -> None:
    fwd, bwd = flops(problem)
    shared = f"I_s={problem.shared}" if problem.shared else "none"
    print(f"\nW={world}: T={problem.tokens} per rank, H={problem.hidden}, I={problem.intermediate}, "
          f"E={problem.experts} ({problem.experts // world} per rank), K={problem.topk}, shared expert {shared}, "
          f"{'MXFP8' if problem.mxfp8 else 'BF16'} routed experts; torch threads per rank {threads(args, world)}")
    print(f"  per rank: forward {fwd / 1e9:.3f} GFLOP, backward {bwd / 1e9:.3f} GFLOP; {args.iters} iterations "
          f"after {args.warmup} warm-up, each timed as the slowest rank")
    print(f"  {'pass':<9}{'case':<13}{'median ms':>10}{'min ms':>10}{'max ms':>10}{'GFLOP/s':>9}"
          f"{'x ref':>8}{'x matmul':>10}")
    for line in lines:
        print(f"  {line['pass']:<9}{line['case']:<13}{line['median_ms']:>10.2f}{line['min_ms']:>10.2f}"
              f"{line['max_ms']:>10.2f}{line['gflops']:>9.2f}{line['x_reference']:>8.2f}{line['x_matmul']:>10.2f}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda":
        return gpu_main(args)
    facts = machine_facts(args)
    print(f"mok bench: preset {args.preset}, seed {args.seed}")
    print(f"  CPU: {facts['cpu']} ({facts['logical_cpus']} logical CPUs); torch {facts['torch']}; "
          f"libmok {facts['libmok']}")
    print(f"  mok.backends(): {facts['mok_backends']}; mok.functional.backends(): {facts['functional_backends']}")
    print(f"  host executor workers per rank: {facts['host_workers_per_rank']}; composed and matmul-fp32 run on "
          "the torch threads")
    print("  x ref / x matmul: throughput relative to the reference / matmul-fp32 line of the same pass"
          + ("; composed and matmul-fp32 stay BF16 / fp32 under --mxfp8" if args.problem.mxfp8 else ""))
    runs = []
    for world in args.worlds:
        lines = summarise(run_world(world, args), args.problem)
        print_run(args.problem, world, args, lines)
        sys.stdout.flush()
        runs.append({"world": world, "threads": threads(args, world), "lines": lines})
    write_outputs(args, {"preset": args.preset, "problem": asdict(args.problem), "iters": args.iters,
                         "warmup": args.warmup, "seed": args.seed, "device": "cpu", "machine": facts, "runs": runs})
    bad = [line for run in runs for line in run["lines"] for value in line.values()
           if isinstance(value, float) and not (math.isfinite(value) and value > 0)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
