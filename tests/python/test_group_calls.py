"""mok's calls over a process group (issue 10): group=None in a larger world is an error (mok.LOCAL is this process
alone); a steady-state training step makes no torch.distributed call; every wait is bounded; a failed call does
not poison the workspace; mok.moe's backward runs on the forward's context."""

from __future__ import annotations

import os
import time
import warnings

import pytest
import torch
import torch.distributed as dist
from backends import needs_host
from dist_utils import run_group

import mok
from mok import _mok, functional, nn
from mok.experts import RoutedExperts

T, H, I, E_LOCAL, K = 24, 64, 32, 2, 2
TIMEOUT_S = 1.5  # short, so that the failure cases finish quickly; the passes themselves take milliseconds
CONFIG = functional.MoKConfig(expert_padding=32, minibatch_size=32, macrobatch_size=64, wait_timeout_s=TIMEOUT_S)
# torch.distributed functions that only read this process's state: everything else talks to the peers.
LOCAL_QUERIES = {"is_available", "is_initialized", "get_rank", "get_world_size", "get_backend", "get_global_rank",
                 "get_process_group_ranks", "get_group_rank", "is_gloo_available", "is_nccl_available",
                 "is_mpi_available", "is_ucc_available", "is_xccl_available", "is_torchelastic_launched",
                 "get_node_local_rank", "get_default_backend_for_device", "get_pg_count", "is_backend_available"}


def inputs(rank: int, world: int, seed: int, tokens: int = T, bad_id: bool = False):
    """This rank's tokens and experts; values of unit scale (bf16 outputs far from underflow)."""
    g = torch.Generator().manual_seed(seed * 97 + rank)
    x = torch.randn(tokens, H, generator=g).bfloat16()
    ids = torch.randint(0, world * E_LOCAL, (tokens, K), generator=g, dtype=torch.int64)
    if bad_id:
        ids[tokens // 2, 1] = world * E_LOCAL  # one id past the last expert
    weights = torch.rand(tokens, K, generator=g)
    routed = RoutedExperts(*(torch.randn(E_LOCAL, *s, generator=g).bfloat16() / 4 for s in ((I, H), (I, H), (H, I))))
    dout = torch.randn(tokens, H, generator=g).bfloat16()
    return x, ids, weights, routed, dout


def step(part, backend: str = "host", group=None, **kwargs):
    """mok.moe forward + autograd backward: (out, dx, d topk_weights, d gate)."""
    x, ids, weights, routed, dout = part
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down)]
    out = mok.moe(leaves[0], ids, leaves[1], RoutedExperts(*leaves[2:]), None, group=group or dist.group.WORLD,
                  config=CONFIG, backend=backend, **kwargs)
    out.backward(dout)
    return out.detach(), leaves[0].grad, leaves[1].grad, leaves[2].grad


def assert_close(host, ref, what: str):
    """host against the reference executor: fp32 sums in another order, one bf16 rounding (2^-8) apart, two for
    gradients that sum many of them."""
    for name, a, b in zip(("out", "dx", "dw", "dgate"), host, ref, strict=True):
        scale = float(b.float().abs().amax().clamp(min=1e-3))
        torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -6, atol=scale * 2 ** -7, msg=f"{what}: {name}")


def raised(call):
    try:
        call()
    except (TypeError, ValueError, RuntimeError, TimeoutError) as e:
        return type(e).__name__, str(e)
    return None


# ----------------------------------------------------------------------------------------------------------------
# group=None


def group_none_worker(rank: int, world: int, seed: int):
    x, ids, weights, routed, dout = inputs(rank, world, seed)
    calls = {
        "mok.moe": lambda: mok.moe(x, ids, weights, routed),
        "functional.forward": lambda: functional.forward(x, ids, weights, routed),
        "functional.build_schedule": lambda: functional.build_schedule(ids, E_LOCAL),
        "functional.get_workspace": lambda: functional.get_workspace(max_tokens=T, hidden=H, topk=K,
                                                                     num_local_experts=E_LOCAL, intermediate=I),
        "nn.MoE": lambda: nn.MoE(H, I, world * E_LOCAL, K),
    }
    errors = {name: raised(call) for name, call in calls.items()}
    # mok.LOCAL: this process alone, its experts the only ones (ids in [0, E_local)).
    local_ids = ids % E_LOCAL
    out = {b: mok.moe(x, local_ids, weights, routed, group=mok.LOCAL, backend=b) for b in ("host", "reference")}
    return errors, out


@needs_host
def test_group_none_with_a_larger_world_is_an_error(seed):
    for errors, out in run_group(2, group_none_worker, seed):
        for name, error in errors.items():
            assert error is not None, f"{name}(group=None) ran over the whole world"
            kind, message = error
            assert kind == "ValueError" and "expert-parallel process group" in message and "mok.LOCAL" in message, \
                f"{name}: {error}"
        # One bf16 rounding apart (host and reference sum in another order).
        torch.testing.assert_close(out["host"].float(), out["reference"].float(), rtol=2 ** -7, atol=2 ** -10)


# ----------------------------------------------------------------------------------------------------------------
# No collective in steady state


class Calls:
    """Counts calls of torch.distributed's communicating functions (the real ones run)."""

    def __init__(self):
        self.names, self.saved = [], []

    def __enter__(self):
        modules = (dist, dist.distributed_c10d)
        for name in dir(dist.distributed_c10d):
            fn = getattr(dist.distributed_c10d, name)
            if name.startswith("_") or name in LOCAL_QUERIES or not callable(fn) or isinstance(fn, type) or \
                    getattr(fn, "__module__", "") != "torch.distributed.distributed_c10d":
                continue
            for module in modules:
                if getattr(module, name, None) is fn:
                    self.saved.append((module, name, fn))
                    setattr(module, name, self.wrap(name, fn))
        return self

    def wrap(self, name, fn):
        def counted(*args, **kwargs):
            self.names.append(name)
            return fn(*args, **kwargs)
        return counted

    def __exit__(self, *exc):
        for module, name, fn in self.saved:
            setattr(module, name, fn)


def steady_worker(rank: int, world: int, seed: int):
    parts = [inputs(rank, world, seed + i, tokens=T - 3 * i) for i in range(3)]
    first = step(parts[0])  # makes the workspace: one bounded exchange
    with Calls() as calls:
        steady = [step(p) for p in parts]
    ref = [step(p, backend="reference") for p in parts]
    return calls.names, len(calls.saved), first, steady, ref


@needs_host
def test_a_steady_state_step_makes_no_torch_distributed_call(seed):
    for rank, (names, wrapped, first, steady, ref) in enumerate(run_group(2, steady_worker, seed)):
        assert wrapped > 20, f"only {wrapped} torch.distributed functions wrapped: the count would prove nothing"
        assert names == [], f"rank {rank}: steady-state forward + backward called torch.distributed.{names}"
        for a, b in zip(first, steady[0], strict=True):
            assert torch.equal(a, b), f"rank {rank}: the steady-state step differs from the first"
        for i, (h, r) in enumerate(zip(steady, ref, strict=True)):
            assert_close(h, r, f"rank {rank}, step {i}")


# ----------------------------------------------------------------------------------------------------------------
# Bounded waits


def absent_peer_worker(rank: int, world: int, seed: int, steady: bool):
    part = inputs(rank, world, seed)
    if steady:
        step(part)
    if rank == 1:
        time.sleep(TIMEOUT_S + 4)  # alive (its sockets open) but never calls (again) while rank 0 waits
        return None
    start = time.monotonic()
    error = raised(lambda: step(part))
    return error, time.monotonic() - start


@needs_host
@pytest.mark.parametrize("steady", [False, True])
def test_a_rank_that_never_calls_fails_the_others_within_the_timeout(seed, steady):
    error, elapsed = run_group(2, absent_peer_worker, seed, steady)[0]
    assert error is not None, "rank 0's call returned without its peer"
    kind, message = error
    print(f"{kind} after {elapsed:.2f} s: {message}")
    assert kind == "TimeoutError" and "wait" in message, message
    assert ("agree" in message) if not steady else ("mokTimeout" in message), message
    assert elapsed < TIMEOUT_S + 2.0, f"took {elapsed:.1f} s with wait_timeout_s={TIMEOUT_S}"  # + wind-down


def mixed_backend_worker(rank: int, world: int, seed: int):
    start = time.monotonic()
    error = raised(lambda: step(inputs(rank, world, seed), backend="host" if rank == 0 else "reference"))
    return error, time.monotonic() - start


@needs_host
def test_host_on_one_rank_and_reference_on_another_fail_at_once(seed):
    for rank, (error, elapsed) in enumerate(run_group(2, mixed_backend_worker, seed)):
        assert error is not None and error[0] == "ValueError", f"rank {rank}: {error}"
        assert "same backend" in error[1] and "host" in error[1] and "reference" in error[1], error[1]
        assert elapsed < TIMEOUT_S, f"rank {rank} took {elapsed:.1f} s"


# ----------------------------------------------------------------------------------------------------------------
# Recovery after a failure


def recovery_worker(rank: int, world: int, seed: int):
    part = inputs(rank, world, seed)
    results = {}
    # A rank whose comm worker stalls: libmok reads the fault when it creates the layer (the first call).
    os.environ["MOK_HOST_FAULT_STALL"] = "1:1"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results["stall"] = raised(lambda: step(part))
    del os.environ["MOK_HOST_FAULT_STALL"]
    results["stall warned"] = any("next call creates new ones" in str(w.message) for w in caught)
    results["after stall"] = step(part)
    # An id out of range on rank 1 only, in steady state: every rank raises rank 1's reason.
    results["bad id"] = raised(lambda: step(inputs(rank, world, seed, bad_id=rank == 1)))
    results["after bad id"] = step(part)
    # More tokens on rank 0 than the workspace holds: every rank makes a larger one, the call just works.
    big = inputs(rank, world, seed + 1, tokens=4 * T if rank == 0 else T)
    results["more tokens"] = step(big)
    results["reference"] = step(part, backend="reference")
    results["more tokens reference"] = step(big, backend="reference")
    return results


@needs_host
def test_a_failed_call_does_not_poison_the_workspace(seed):
    for rank, r in enumerate(run_group(2, recovery_worker, seed)):
        assert r["stall"] is not None and "wait" in r["stall"][1], f"rank {rank}: the stalled call {r['stall']}"
        assert r["stall warned"], f"rank {rank}: no warning that the layer is created again"
        assert_close(r["after stall"], r["reference"], f"rank {rank}, the call after the stall")
        kind, message = r["bad id"]
        assert kind == "ValueError" and message.startswith("rank 1:") and "topk_ids" in message, r["bad id"]
        assert_close(r["after bad id"], r["reference"], f"rank {rank}, the call after the bad id")
        assert_close(r["more tokens"], r["more tokens reference"], f"rank {rank}, more tokens")


# ----------------------------------------------------------------------------------------------------------------
# The backward runs on the forward's context


class CountingLayer(_mok.Layer):
    """libmok's layer (every call goes through), counting its passes."""

    counts: dict = {}

    def _count(self, name):
        CountingLayer.counts[name] = CountingLayer.counts.get(name, 0) + 1

    def build_schedule(self, *args):
        self._count("schedule")
        return super().build_schedule(*args)

    def forward(self, *args):
        self._count("forward")
        return super().forward(*args)

    def recompute(self, *args):
        self._count("recompute")
        return super().recompute(*args)

    def backward(self, *args):
        self._count("backward")
        return super().backward(*args)

    def restore_context(self, *args):
        self._count("restore")
        return super().restore_context(*args)


def kept_context_worker(rank: int, world: int, seed: int):
    part = inputs(rank, world, seed)
    _mok.Layer = CountingLayer
    counts = {}
    for name, keep in (("kept", True), ("recompute", False)):
        step(part, keep_context=keep)  # the first step makes the workspace
        CountingLayer.counts = {}
        result = step(part, keep_context=keep)
        counts[name] = dict(CountingLayer.counts), result
    # Activation checkpointing: the forward runs again inside the backward.
    x, ids, weights, routed, dout = part
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down)]

    def layer(x, w, gate, up, down):
        return mok.moe(x, ids, w, RoutedExperts(gate, up, down), None, group=dist.group.WORLD, config=CONFIG,
                       backend="host")

    CountingLayer.counts = {}
    out = torch.utils.checkpoint.checkpoint(layer, *leaves, use_reentrant=False)
    out.backward(dout)
    counts["checkpoint"] = dict(CountingLayer.counts), (out.detach(), leaves[0].grad, leaves[1].grad, leaves[2].grad)
    return counts


@needs_host
def test_the_backward_uses_the_forward_context(seed):
    for rank, counts in enumerate(run_group(2, kept_context_worker, seed)):
        kept, kept_result = counts["kept"]
        assert kept == {"schedule": 1, "forward": 1, "backward": 1}, f"rank {rank}: a kept-context step ran {kept}"
        again, again_result = counts["recompute"]
        assert again == {"schedule": 2, "forward": 1, "recompute": 1, "backward": 1}, \
            f"rank {rank}: a keep_context=False step ran {again}"
        checkpointed, checkpoint_result = counts["checkpoint"]
        # Non-reentrant checkpointing keeps the first forward's autograd node, so its backward finds that forward's
        # context no longer libmok's latest (the re-run replaced it) and puts it back: one schedule and a restore.
        assert checkpointed == {"schedule": 3, "forward": 2, "restore": 1, "backward": 1}, \
            f"rank {rank}: a checkpointed step ran {checkpointed}"
        for a, b, c in zip(kept_result, again_result, checkpoint_result, strict=True):
            assert torch.equal(a, b) and torch.equal(a, c), f"rank {rank}: kept, recomputed and checkpointed differ"


def two_layers_worker(rank: int, world: int, seed: int):
    """Two layers of one shape (one workspace, one libmok layer) in a row, as in any model: the first layer's
    backward runs after the second's forward and backward replaced libmok's context."""
    layers = inputs(rank, world, seed), inputs(rank, world, seed + 1)

    def two_steps(keep_context: bool):
        leaves = [[t.detach().clone().requires_grad_(True) for t in (x, w, r.gate, r.up, r.down)]
                  for x, _, w, r, _ in layers]
        y = leaves[0][0]
        for index, ((_, ids, _, _, _), (x, w, *experts)) in enumerate(zip(layers, leaves, strict=True)):
            y = mok.moe(y if index == 0 else y + x, ids, w, RoutedExperts(*experts), None, group=dist.group.WORLD,
                        config=CONFIG, backend="host", keep_context=keep_context)
        y.backward(layers[1][4])
        return [t.grad for layer in leaves for t in layer]

    _mok.Layer = CountingLayer
    two_steps(True)  # the first step makes the workspace
    CountingLayer.counts = {}
    kept = two_steps(True)
    counts = dict(CountingLayer.counts)
    return counts, kept, two_steps(False)


@needs_host
def test_layers_of_one_shape_run_no_recompute(seed):
    for rank, (counts, kept, recomputed) in enumerate(run_group(2, two_layers_worker, seed)):
        # Each backward on its own forward's context: the first layer's is put back (a schedule and a restore, two
        # copies), never recomputed; and bitwise what recomputing every context gives.
        assert counts == {"schedule": 3, "forward": 2, "restore": 1, "backward": 2}, f"rank {rank}: ran {counts}"
        for a, b in zip(kept, recomputed, strict=True):
            assert a is not None and torch.equal(a, b), f"rank {rank}: restored and recomputed contexts differ"
