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
                                                                wait_timeout_s=0.25, bwd_num_comm_sms=4)):
        assert ops._config(ops.config_to_floats(config)) == config


def pass_bits(rank: int, world: int, configs) -> tuple:
    """Forward and backward of one problem under each config: (out, grads) each, and the mok-worker threads the
    fresh workspace's layer made."""
    import mok.layer
    g = torch.Generator().manual_seed(100 + rank)
    tensors = [torch.randn(E_LOCAL, *shape, generator=g).to(torch.bfloat16) / 4 for shape in ((I, H), (I, H), (H, I))]
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, world * E_LOCAL, (T, K), generator=g, dtype=torch.int32)
    weights = torch.rand(T, K, generator=g)
    dout = torch.randn(T, H, generator=g).to(torch.bfloat16)
    results = []
    for config in configs:
        leaves = [t.clone().requires_grad_(True) for t in [x, weights, *tensors]]
        start = mok_threads()
        out = mok.layer.moe(leaves[0], ids, leaves[1], RoutedExperts(*leaves[2:]), config=config, backend="host",
                            group=ep_group())
        out.backward(dout)
        results.append((out.detach(), [t.grad for t in leaves], mok_threads() - start))
    return results


def split_worker(rank: int, world: int):
    base = functional.MoKConfig(host_comm_workers=1, host_compute_workers=3)
    return pass_bits(rank, world, [base, functional.MoKConfig(host_comm_workers=1, host_compute_workers=3,
                                                              fwd_num_comm_sms=2, bwd_num_comm_sms=3)])


@pytest.mark.parametrize("world", [1, 2])
def test_comm_splits_per_pass_give_the_same_bits(world):
    """fwd_num_comm_sms=2 / bwd_num_comm_sms=3 split the same 1 + 3 host workers differently per pass: the
    output and every gradient are bitwise those of the default split, on the same four threads."""
    for rank, (base, split) in enumerate(run_group(world, split_worker)):
        assert torch.equal(base[0], split[0]), f"world {world} rank {rank}: out"
        for i, (a, b) in enumerate(zip(base[1], split[1], strict=True)):
            assert torch.equal(a, b), f"world {world} rank {rank}: gradient {i}"
        assert split[2] <= 4, f"world {world} rank {rank}: the split made {split[2]} threads, not the layer's 4"


def test_comm_splits_reach_libmoks_config():
    """On backend="host" fwd_num_comm_sms / bwd_num_comm_sms become libmok's comm_workers /
    backward_comm_workers out of host_comm_workers + host_compute_workers threads (None: host_comm_workers),
    and libmok itself checks backward_comm_workers (the binding passes it on)."""
    from mok import _mok, host
    config = functional.MoKConfig(host_comm_workers=1, host_compute_workers=4, fwd_num_comm_sms=2, bwd_num_comm_sms=4)
    assert host._workers(config, 1) == {"comm_workers": 2, "compute_workers": 3, "backward_comm_workers": 4}
    default = functional.MoKConfig(host_comm_workers=2, host_compute_workers=3)
    assert host._workers(default, 1) == {"comm_workers": 2, "compute_workers": 3, "backward_comm_workers": 2}
    base = dict(world=1, rank=0, experts_per_rank=2, hidden=32, intermediate=16, top_k=2, max_tokens=8,
                expert_padding=8, minibatch=16, macrobatch=32, timeout_ms=1000, comm_workers=2, compute_workers=3)
    assert _mok.layer_sizes(dict(base, backward_comm_workers=4))[1] > 0
    with pytest.raises(ValueError, match=r"'config.backward_comm_workers' \(5\) must be 0"):
        _mok.layer_sizes(dict(base, backward_comm_workers=5))


@pytest.mark.parametrize("field", ["fwd_num_comm_sms", "bwd_num_comm_sms"])
def test_comm_splits_leave_a_compute_worker_on_host(field):
    from mok import host
    config = functional.MoKConfig(host_comm_workers=1, host_compute_workers=3, **{field: 4})
    with pytest.raises(ValueError, match=f"MoKConfig.{field} must be fewer than the host executor's 4 workers"):
        host._workers(config, 1)
    with pytest.raises(ValueError, match=f"MoKConfig.{field} must be None or between 1 and 256"):
        functional.MoKConfig(**{field: 0})
