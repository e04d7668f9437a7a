"""Run a function on every rank of a fresh gloo process group and collect what each rank returns (mok._group).

Starting processes is the slow part on a small machine, so a test starts one group per world size and runs a
whole list of scenarios inside it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import mok
from mok._group import run_group as _run_group

TIMEOUT_S = 120  # per rank, joined in turn: a group of W ranks gets W times this


def run_group(world: int, fn, *args):
    """Call fn(rank, world, *args) on `world` ranks of a new gloo group (one torch thread each: W ranks share few
    cores); return [result of rank 0, 1, ...]. An exception on any rank is re-raised here with its traceback."""
    return _run_group(world, fn, *args, timeout_s=TIMEOUT_S * world, threads=1)


def ep_group():
    """The expert-parallel group of a test: the whole gloo group inside run_group, this process alone outside."""
    return dist.group.WORLD if dist.is_initialized() else mok.LOCAL


def halves(rank: int, tokens: int = 12, experts: int = 2) -> tuple[slice, slice]:
    """Rank `rank`'s tokens and experts when two ranks split a problem's tokens and experts in halves."""
    return slice(rank * tokens, (rank + 1) * tokens), slice(rank * experts, (rank + 1) * experts)


def assert_ranks_equal_one_process(results, alone_out, alone: dict, expert_names=("gate", "up", "down")) -> None:
    """Each rank's (out, {name: grad}) is the one-process run's rows (out, dx, dtopk_weights) and experts (every
    name in expert_names), bitwise."""
    for rank, (out, grads) in enumerate(results):
        tokens, experts = halves(rank)
        assert torch.equal(out, alone_out[tokens]), f"rank {rank}: out differs"
        for name in ("x", "topk_weights"):
            assert torch.equal(grads[name], alone[name][tokens]), f"rank {rank}: d{name} differs"
        for name in expert_names:
            assert torch.equal(grads[name], alone[name][experts]), f"rank {rank}: d{name} differs"
