"""backend="host" runs MoKConfig's worker counts: libmok's threads per rank (named mok-worker) are the config's
host_comm_workers + host_compute_workers, by default 1 + the CPUs this process may use shared among the group's
ranks; they are made once, with the layer, not per call."""

from __future__ import annotations

import os

import pytest
import torch
from dist_utils import ep_group, run_group

from mok import functional, ops
from mok.experts import RoutedExperts

H, I, E_LOCAL, K, T = 32, 16, 2, 2, 7


def mok_threads() -> int:
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                count += f.read().strip() == "mok-worker"
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return count


def layer_call(rank: int, world: int, config: functional.MoKConfig, calls: int) -> list[int]:
    """`calls` forwards on a fresh workspace; the mok-worker threads each adds (the layer's, made at its first)."""
    g = torch.Generator().manual_seed(rank)
    routed = RoutedExperts(*(torch.randn(E_LOCAL, *shape, generator=g).to(torch.bfloat16) / 4
                             for shape in ((I, H), (I, H), (H, I))))
    ws = functional.create_workspace(max_tokens=T, hidden=H, topk=K, num_local_experts=E_LOCAL, intermediate=I,
                                     config=config, backend="host", group=ep_group())
    start, counts = mok_threads(), []
    for _ in range(calls):
        x = torch.randn(T, H, generator=g).to(torch.bfloat16)
        ids = torch.randint(0, world * E_LOCAL, (T, K), generator=g, dtype=torch.int32)
        weights = torch.rand(T, K, generator=g)
        functional.forward(x, ids, weights, routed, workspace=ws, backend="host", need_context=False, group=ep_group())
        counts.append(mok_threads() - start)
    return counts


def worker(rank: int, world: int):
    default = layer_call(rank, world, functional.MoKConfig(), 3)
    custom = layer_call(rank, world, functional.MoKConfig(host_comm_workers=2, host_compute_workers=3), 3)
    return default, custom, len(os.sched_getaffinity(0))


@pytest.mark.parametrize("world", [1, 2])
def test_worker_counts_come_from_the_config_and_threads_are_made_once(world):
    for rank, (default, custom, cpus) in enumerate(run_group(world, worker)):
        expected = 1 + max(1, cpus // world)  # one comm worker, the rank's share of the CPUs for compute
        assert default == [expected] * 3, f"world {world} rank {rank}, {cpus} CPUs: threads added {default}"
        assert custom == [2 + 3] * 3, f"world {world} rank {rank}: threads added {custom}"


@pytest.mark.parametrize("field,value,error", [
    ("host_comm_workers", 0, ValueError), ("host_comm_workers", 65, ValueError),
    ("host_compute_workers", 0, ValueError), ("host_compute_workers", 257, ValueError),
    ("host_compute_workers", 1.5, TypeError),
])
def test_config_rejects_bad_worker_counts(field, value, error):
    with pytest.raises(error, match=f"MoKConfig.{field} must"):
        functional.MoKConfig(**{field: value})


def test_config_survives_the_ops_round_trip():
    """mok.ops passes a MoKConfig as floats (a None field as -1) and rebuilds the very same one."""
    for config in (functional.MoKConfig(), functional.MoKConfig(host_comm_workers=2, host_compute_workers=3,
                                                                wait_timeout_s=0.25)):
        assert ops._config(ops.config_to_floats(config)) == config
