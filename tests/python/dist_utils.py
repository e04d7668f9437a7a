"""Run a function on every rank of a fresh gloo process group and collect what each rank returns.

Starting processes is the slow part on a small machine, so a test starts one group per world size and runs a
whole list of scenarios inside it. Processes are forked (the parent has torch imported already: ~0.1 s per
group instead of ~10 s with spawn); rendezvous goes through a FileStore in a private temp dir, so parallel
test runs never collide on a port.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import tempfile
import traceback

import torch
import torch._dynamo  # noqa: F401 - a custom op's first call imports it: once here, not once per forked rank
import torch.distributed as dist

TIMEOUT_S = 120


def run_group(world: int, fn, *args):
    """Call fn(rank, world, *args) on `world` ranks of a new gloo group; return [result of rank 0, 1, ...].

    An exception on any rank is re-raised here with that rank's traceback."""
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="mok-ep-") as tmp:
        procs = [ctx.Process(target=_worker, args=(rank, world, tmp, fn, args)) for rank in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(TIMEOUT_S)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        return [_load(tmp, rank, p.exitcode) for rank, p in enumerate(procs)]


def _worker(rank, world, tmp, fn, args):
    torch.set_num_threads(1)  # W ranks share 2 cores; more threads only contend
    try:
        store = dist.FileStore(os.path.join(tmp, "store"), world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        try:
            result = ("ok", fn(rank, world, *args))
        finally:
            dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - every failure must reach the parent
        result = ("error", f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    with open(os.path.join(tmp, f"result{rank}"), "wb") as f:
        pickle.dump(result, f)
    os._exit(0)  # skip atexit handlers inherited from the forked pytest process


def _load(tmp, rank, exitcode):
    path = os.path.join(tmp, f"result{rank}")
    if not os.path.exists(path):
        raise RuntimeError(f"rank {rank} died without a result (exit code {exitcode})")
    with open(path, "rb") as f:
        status, value = pickle.load(f)
    if status == "error":
        raise RuntimeError(value)
    return value
