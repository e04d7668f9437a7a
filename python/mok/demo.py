"""python -m mok.demo: an expert-parallel MoE layer, forward and backward, checked against the float64 oracle.

Starts --world processes on this machine as one gloo process group, gives each rank its own (ragged) share of
the tokens and its share of the experts, runs --steps training steps of `mok.moe` (forward + autograd backward),
then gathers every output and gradient on rank 0 and compares them with reference.py's float64 layer on all
tokens. Prints what it ran, the errors, and the time per step. Exit status 1 if an error is out of tolerance.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch._dynamo  # noqa: F401 - a custom op's first call imports it: once here, not once per forked rank
import torch.distributed as dist
import torch.multiprocessing as mp

import mok
from mok import functional, reference
from mok.experts import RoutedExperts, SharedExpert

# Relative error ||got - oracle|| / ||oracle|| allowed per tensor: bf16 storage of g, u, h, y and of the
# gradients compounds to a few 1e-3; MXFP8 operands carry 4 significant bits (up to 2^-4 relative each).
TOLERANCE = {"bf16": 2e-2, "mxfp8": 1.5e-1}
GRADS = ("x", "topk_weights", "gate", "up", "down", "shared_gate", "shared_up", "shared_down")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m mok.demo", description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=4, help="ranks (processes) in the expert-parallel group")
    p.add_argument("--backend", default=None, help=f"executor (default: best available; {functional.backends()})")
    p.add_argument("--tokens", type=int, default=256, help="mean tokens per rank (ranks get ragged counts)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=128)
    p.add_argument("--experts", type=int, default=None, help="global routed experts, a multiple of --world "
                   "(default: 4 per rank)")
    p.add_argument("--topk", type=int, default=4)
    p.add_argument("--shared-intermediate", type=int, default=256, help="0 for no shared expert")
    p.add_argument("--mxfp8", action="store_true", help="routed experts in MXFP8")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=None, help="default: a fresh one, printed")
    args = p.parse_args(argv)
    if not 1 <= args.world <= 72:
        p.error("--world must be between 1 and 72")
    if args.experts is None:
        args.experts = 4 * args.world
    if args.experts < 1 or args.experts % args.world:
        p.error(f"--experts must be a positive multiple of --world ({args.world})")
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little") >> 1
    return args


def token_counts(args) -> list[int]:
    """Ragged: each rank between 3/4 and 5/4 of --tokens."""
    g = torch.Generator().manual_seed(args.seed)
    low, high = args.tokens * 3 // 4, args.tokens * 5 // 4 + 1
    return torch.randint(low, high, (args.world,), generator=g).tolist()


def layer_inputs(seed: int, tokens: int, hidden: int, intermediate: int, shared: int, experts: int, topk: int):
    """The whole layer's inputs drawn from `seed`: x, topk ids and weights (softmax top-k of a random router),
    routed experts, the shared expert (None for shared = 0) and dout; bf16, weights scaled by 1/sqrt(fan-in)."""
    g = torch.Generator().manual_seed(seed)
    T, H, Ie, Is, E, K = tokens, hidden, intermediate, shared, experts, topk

    def bf16(*shape, fan_in=1):
        return (torch.randn(*shape, generator=g) / fan_in ** 0.5).to(torch.bfloat16)

    x = bf16(T, H)
    router = torch.randn(E, H, generator=g) / H ** 0.5
    weights, ids = (x.float() @ router.t()).softmax(-1).topk(K, dim=-1)  # softmax top-k routing
    routed = RoutedExperts(bf16(E, Ie, H, fan_in=H), bf16(E, Ie, H, fan_in=H), bf16(E, H, Ie, fan_in=Ie))
    shared = SharedExpert(bf16(Is, H, fan_in=H), bf16(Is, H, fan_in=H), bf16(H, Is, fan_in=Is)) if Is else None
    return x, ids.to(torch.int32), weights.contiguous(), routed, shared, bf16(T, H)


def problem(args):
    """The whole layer's inputs, drawn from the seed (every rank draws the same and takes its part)."""
    return layer_inputs(args.seed + 1, sum(token_counts(args)), args.hidden, args.intermediate,
                        args.shared_intermediate, args.experts, args.topk)


def rank_main(rank: int, args, store_path: str):
    torch.set_num_threads(1)  # the ranks share this machine's cores
    dist.init_process_group("gloo", store=dist.FileStore(store_path, args.world), rank=rank,
                            world_size=args.world)
    try:
        result = run_rank(rank, args)
        gathered = [None] * args.world
        dist.all_gather_object(gathered, result)
        if rank == 0:
            code = report(args, gathered)
            sys.stdout.flush()
            with open(store_path + ".status", "w") as f:
                f.write(str(code))
    finally:
        dist.destroy_process_group()


def run_rank(rank: int, args):
    x, ids, weights, routed, shared, dout = problem(args)
    counts = token_counts(args)
    tokens = slice(sum(counts[:rank]), sum(counts[:rank + 1]))
    local = args.experts // args.world
    experts = slice(rank * local, (rank + 1) * local)
    leaves = [t[tokens].clone().requires_grad_(True) for t in (x, weights)]
    leaves += [w[experts].clone().requires_grad_(True) for w in (routed.gate, routed.up, routed.down)]
    if shared is not None:
        leaves += [w.clone().requires_grad_(True) for w in (shared.gate, shared.up, shared.down)]
    my_routed = RoutedExperts(*leaves[2:5])
    my_shared = SharedExpert(*leaves[5:]) if shared is not None else None
    times = []
    for step in range(args.steps):
        for t in leaves:
            t.grad = None
        dist.barrier()
        start = time.perf_counter()
        routed_arg = my_routed.to_mxfp8() if args.mxfp8 else my_routed
        out = mok.moe(leaves[0], ids[tokens].contiguous(), leaves[1], routed_arg, my_shared, backend=args.backend,
                      group=dist.group.WORLD)
        out.backward(dout[tokens])
        times.append(time.perf_counter() - start)
        if rank == 0:
            progress(step + 1, args.steps, times[-1])
    return out.detach(), {n: t.grad for n, t in zip(GRADS, leaves, strict=False)}, times


def progress(done: int, total: int, seconds: float) -> None:
    bar = "#" * (30 * done // total)
    print(f"\r  steps [{bar:<30}] {done}/{total}  last {seconds * 1e3:7.1f} ms", end="", flush=True)
    if done == total:
        print()


def report(args, gathered) -> int:
    """Compare with the float64 oracle; print; return the exit status."""
    x, ids, weights, routed, shared, dout = problem(args)
    oracle_out, ctx = reference.forward(x, ids, weights, routed, shared, precision="float64")
    oracle = reference.backward(ctx, dout)._asdict()
    got = {"out": torch.cat([r[0] for r in gathered])}
    for name in ("x", "topk_weights", "gate", "up", "down"):
        got[name] = torch.cat([r[1][name] for r in gathered])  # tokens, then experts, in rank order
    if shared is not None:
        for name in GRADS[5:]:  # each rank's gradient is over its own tokens; the trainer sums them
            got[name] = sum(r[1][name].double() for r in gathered)
    want = {"out": oracle_out, **{n: oracle[n] for n in got if n != "out"}}
    tolerance = TOLERANCE["mxfp8" if args.mxfp8 else "bf16"]
    worst = 0.0
    print("  error against the float64 oracle (||got - oracle|| / ||oracle||, tolerance "
          f"{tolerance:g}):")
    for name in got:
        err = float((got[name].double() - want[name].double()).norm() / want[name].double().norm())
        worst = max(worst, err)
        print(f"    {name:<13} {err:9.2e}  {'ok' if err <= tolerance else 'TOO LARGE'}")
    per_step = [max(r[2][i] for r in gathered) for i in range(args.steps)]  # a step ends when the last rank does
    print(f"  time per step (forward + backward, slowest rank): median {statistics.median(per_step) * 1e3:.1f} ms, "
          f"first {per_step[0] * 1e3:.1f} ms")
    print("  result: " + ("PASS" if worst <= tolerance else "FAIL"))
    return 0 if worst <= tolerance else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    counts = token_counts(args)
    backend = args.backend or functional.select_backend(None, torch.device("cpu")).name
    print(f"mok demo: expert-parallel MoE layer on {args.world} processes (gloo), backend={backend}, "
          f"{'MXFP8' if args.mxfp8 else 'BF16'}, seed {args.seed}")
    print(f"  tokens per rank {counts} (total {sum(counts)}), H={args.hidden}, I={args.intermediate}, "
          f"{args.experts} experts ({args.experts // args.world} per rank), top-{args.topk}, shared expert "
          f"{'I_s=' + str(args.shared_intermediate) if args.shared_intermediate else 'none'}")
    with tempfile.TemporaryDirectory(prefix="mok-demo-") as tmp:
        store = os.path.join(tmp, "store")
        # fork: the ranks inherit the imported torch, torch._dynamo included (see the imports).
        ctx = mp.get_context("fork")
        procs = [ctx.Process(target=rank_main, args=(rank, args, store)) for rank in range(args.world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        failed = [rank for rank, p in enumerate(procs) if p.exitcode != 0]
        if failed:
            print(f"  ranks {failed} failed (exit codes {[procs[r].exitcode for r in failed]})", file=sys.stderr)
            return 2
        with open(store + ".status") as f:
            return int(f.read())


if __name__ == "__main__":
    sys.exit(main())
