"""A rank of a host-executor group stops mid-pass: every rank's call returns an error naming the wait that ran
out, within the configured timeout; no process hangs. Fault injection: libmok's MOK_HOST_FAULT_STALL
("<rank>:<tasks>": that rank's first comm worker stops after taking <tasks> tasks)."""

from __future__ import annotations

import os
import time

import torch
from dist_utils import ep_group, run_group

from mok import functional
from mok.experts import RoutedExperts

TIMEOUT_S = 1.5
CONFIG = functional.MoKConfig(expert_padding=32, minibatch_size=32, macrobatch_size=64, wait_timeout_s=TIMEOUT_S)


def stalled_worker(rank: int, world: int, seed: int):
    os.environ["MOK_HOST_FAULT_STALL"] = "1:1"  # read when libmok creates the layer, below
    g = torch.Generator().manual_seed(seed + rank)
    T, H, I, E = 40, 64, 32, 2
    x = torch.randn(T, H, generator=g).bfloat16()
    ids = torch.randint(0, world * E, (T, 2), generator=g, dtype=torch.int32)
    routed = RoutedExperts(*(torch.randn(*s, generator=g).bfloat16() * 0.1 for s in ((E, I, H), (E, I, H),
                                                                                     (E, H, I))))
    start = time.monotonic()
    try:
        functional.forward(x, ids, torch.rand(T, 2, generator=g), routed, None, config=CONFIG, backend="host",
                           group=ep_group())
    except (TimeoutError, RuntimeError) as e:
        return type(e).__name__, str(e), time.monotonic() - start
    return "no error", "", time.monotonic() - start


def test_a_stalled_rank_makes_every_rank_fail_within_the_timeout():
    seed = int.from_bytes(os.urandom(4), "little")
    results = run_group(2, stalled_worker, seed)
    for rank, (kind, message, elapsed) in enumerate(results):
        print(f"rank {rank}: {kind} after {elapsed:.2f}s: {message}")  # what a user sees, in the CI log on failure
        assert kind in ("TimeoutError", "RuntimeError"), f"rank {rank} did not fail: {kind}"
        assert "mokTimeout" in message or "mokPeerAbort" in message, f"rank {rank}: {message}"
        assert "wait" in message, f"rank {rank}: the error must name the wait that ran out: {message}"
        # One timeout, plus the ranks' wind-down (each of which is itself bounded by the same timeout).
        assert elapsed < 3 * TIMEOUT_S + 2, f"rank {rank} took {elapsed:.1f}s with a {TIMEOUT_S}s timeout"
    assert any("mokTimeout" in m for _, m, _ in results), "the wait that ran out must be reported as a timeout"



SLOW_CONFIG = functional.MoKConfig(expert_padding=32, minibatch_size=32, macrobatch_size=64, wait_timeout_s=0.3)


def slow_rank_worker(rank: int, world: int, seed: int):
    # Rank 0's workers start each task 50 ms late (read when libmok creates the layer, below): with every route
    # to rank 0, its forward and backward last many timeouts while rank 1 waits for it.
    os.environ["MOK_HOST_FAULT_SLOW"] = "0:50000"
    g = torch.Generator().manual_seed(seed + rank)
    T, H, I, E = 40, 64, 32, 2
    x = torch.randn(T, H, generator=g).bfloat16()
    ids = torch.randint(0, E, (T, 2), generator=g, dtype=torch.int32)  # rank 0's experts only
    weights = torch.rand(T, 2, generator=g)
    dout = torch.randn(T, H, generator=g).bfloat16()
    routed = RoutedExperts(*(torch.randn(*s, generator=g).bfloat16() * 0.1 for s in ((E, I, H), (E, I, H),
                                                                                     (E, H, I))))
    results = {}
    for backend in ("reference", "host"):
        start = time.monotonic()
        out, ctx = functional.forward(x, ids, weights, routed, None, config=SLOW_CONFIG, backend=backend,
                                      group=ep_group())
        grads = functional.backward(ctx, dout)
        results[backend] = (out, grads.x, time.monotonic() - start)
    return results


def test_a_slow_rank_keeps_its_group_alive():
    """Before the waits watched progress, rank 1's closing barrier ran out after one wait_timeout_s (0.3 s) of rank
    0's compute and both ranks raised TimeoutError / RuntimeError."""
    seed = int.from_bytes(os.urandom(4), "little")
    results = run_group(2, slow_rank_worker, seed)
    for rank, r in enumerate(results):
        out, dx, elapsed = r["host"]
        want_out, want_dx, _ = r["reference"]
        print(f"rank {rank}: host forward + backward took {elapsed:.2f}s with a {SLOW_CONFIG.wait_timeout_s}s timeout")
        # The test means something only if rank 1 waited for many timeouts.
        assert elapsed > 4 * SLOW_CONFIG.wait_timeout_s, f"rank {rank}: {elapsed:.2f}s"
        # Same values at the same rounding points, fp32 sums in another order: one bf16 step (test_host_backend).
        torch.testing.assert_close(out.float(), want_out.float(), rtol=2 ** -7, atol=2 ** -10)
        torch.testing.assert_close(dx.float(), want_dx.float(), rtol=2 ** -6, atol=2 ** -8)
