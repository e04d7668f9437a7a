"""Run a function on every rank of a fresh gloo process group and collect what each rank returns (mok._group).

Starting processes is the slow part on a small machine, so a test starts one group per world size and runs a
whole list of scenarios inside it.
"""

from __future__ import annotations

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
