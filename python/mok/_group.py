"""Run a function on every rank of a fresh gloo process group on this machine and collect what each returns.

Processes are forked (the parent has torch imported already: ~0.1 s per group instead of ~10 s with spawn);
rendezvous goes through a FileStore in a private temp dir, so parallel runs never collide on a port. The benchmark
and the tests use it; `python -m mok.demo` has its own, which reports progress.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import pickle
import sys
import tempfile
import time
import traceback

import torch
import torch._dynamo  # noqa: F401 - a custom op's first call imports it: once here, not once per forked rank
import torch.distributed as dist


def run_group(world: int, fn, *args, timeout_s: float, threads: int = 1):
    """Call fn(rank, world, *args) on `world` ranks of a new gloo group with `threads` torch threads each; return
    [result of rank 0, 1, ...]. An exception on any rank is re-raised here with that rank's traceback; a group not
    done within `timeout_s` is killed, and that is an error naming the rank."""
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="mok-group-") as tmp:
        procs = [ctx.Process(target=_worker, args=(rank, world, tmp, fn, args, timeout_s, threads))
                 for rank in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        late = [rank for rank, p in enumerate(procs) if p.is_alive()]
        for rank in late:
            procs[rank].kill()
            procs[rank].join()
        if late:
            raise RuntimeError(f"waiting for rank {late[0]} of {world} to finish ran out after {timeout_s} s")
        return [_load(tmp, rank, p.exitcode) for rank, p in enumerate(procs)]


def _worker(rank, world, tmp, fn, args, timeout_s, threads):
    torch.set_num_threads(threads)
    try:
        store = dist.FileStore(os.path.join(tmp, "store"), world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            result = ("ok", fn(rank, world, *args))
        finally:
            dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - every failure must reach the parent
        result = ("error", f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    with open(os.path.join(tmp, f"result{rank}"), "wb") as f:
        pickle.dump(result, f)
    sys.stdout.flush()
    os._exit(0)  # skip atexit handlers inherited from the forked parent


def _load(tmp, rank, exitcode):
    path = os.path.join(tmp, f"result{rank}")
    if not os.path.exists(path):
        raise RuntimeError(f"rank {rank} died without a result (exit code {exitcode})")
    with open(path, "rb") as f:
        status, value = pickle.load(f)
    if status == "error":
        raise RuntimeError(value)
    return value
