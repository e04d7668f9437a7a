"""backend="host" (libmok's CPU executor through the C ABI, ranks as processes over shared memory) against
backend="reference", on test_ep's scenarios: ragged tokens (a rank with none), MXFP8, all rows to one expert,
unrouted tokens, K = 1 and K = 8, SwiGLU clamps, shared expert or not; and, on one process, intermediate sizes
below, at and above the hidden size.

The two executors store the same values at the same rounding points (docs/semantics.md) but sum fp32 products
in different orders, so a stored bf16 value may differ by one rounding step: compared at bf16's resolution.
Between world sizes the host executor itself is bitwise equal (its reduction orders are fixed by core/).
"""

from __future__ import annotations

import random

import pytest
import torch
from dist_utils import ep_group, run_group
from test_ep import E_LOCAL, GRAD_NAMES, H, Scenario, global_inputs, local_part, scenarios, token_counts

from mok import functional
from mok.experts import RoutedExperts, SharedExpert

# Small rows per expert segment and ring, so the host executor's ring wraps and several minibatches run.
CONFIG = functional.MoKConfig(expert_padding=32, minibatch_size=64, macrobatch_size=128, wait_timeout_s=60.0)


def run(backend: str, s, x, ids, weights, routed, shared, dout, group=None):
    routed = routed.to_mxfp8() if s.mxfp8 else routed
    group = ep_group() if group is None else group
    out, ctx = functional.forward(x, ids, weights, routed, shared, group=group, config=CONFIG, backend=backend,
                                  swiglu_limit=s.swiglu_limit)
    grads = functional.backward(ctx, dout)
    return out, {n: getattr(grads, n) for n in GRAD_NAMES}


def worker(rank: int, world: int, seed: int):
    results = {}
    for s in scenarios(seed):
        part = local_part(rank, world, s, global_inputs(s, world))
        results[s.name] = {b: run(b, s, *part) for b in ("host", "reference")}
    return results


def assert_close_bf16(host, ref, what: str):
    """One bf16 rounding step (2^-8 relative) on values whose fp32 sums differ only in order; gradients that
    sum many such values (dx over K slots, weight gradients over rows) get two steps."""
    out_h, grads_h = host
    out_r, grads_r = ref
    torch.testing.assert_close(out_h.float(), out_r.float(), rtol=2 ** -7, atol=2 ** -10, msg=f"{what}: out")
    for name in GRAD_NAMES:
        gh, gr = grads_h[name], grads_r[name]
        assert (gh is None) == (gr is None), f"{what}: {name} present in one executor only"
        if gh is not None:
            scale = gr.float().abs().amax().clamp(min=1e-3) if gr.numel() else 1.0
            torch.testing.assert_close(gh.float(), gr.float(), rtol=2 ** -6, atol=float(scale) * 2 ** -7,
                                       msg=f"{what}: gradient {name}")


def assert_bitwise(a, b, what: str):
    assert torch.equal(a[0], b[0]), f"{what}: out differs"
    for name in GRAD_NAMES:
        x, y = a[1][name], b[1][name]
        assert (x is None and y is None) or torch.equal(x, y), f"{what}: {name} differs"


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_host_matches_reference_and_is_world_invariant(world):
    seed = random.randrange(1 << 30)
    results = run_group(world, worker, seed)
    for s in scenarios(seed):
        for rank in range(world):
            got = results[rank][s.name]
            assert_close_bf16(got["host"], got["reference"], f"seed {seed}, world {world}, rank {rank}, {s.name}")
        if world > 1:
            # The routed part is the same computation on any number of ranks: compare with one process.
            alone = run("host", s, *global_inputs(s, world))
            counts = token_counts(world, s.seed)
            for rank in range(world):
                tokens = slice(sum(counts[:rank]), sum(counts[:rank + 1]))
                host = results[rank][s.name]["host"]
                what = f"seed {seed}, world {world} vs 1, rank {rank}, {s.name}"
                experts = slice(rank * E_LOCAL, (rank + 1) * E_LOCAL)
                assert torch.equal(host[0], alone[0][tokens]), f"{what}: out differs"
                for name, part in (("x", tokens), ("topk_weights", tokens), ("gate", experts), ("up", experts),
                                   ("down", experts)):
                    assert torch.equal(host[1][name], alone[1][name][part]), f"{what}: gradient {name} differs"


def shaped_inputs(T: int, inter: int, shared_inter: int, E: int = 4, K: int = 2):
    """Fresh random inputs with g, u and y of order 1, for one process."""

    def bf16(*shape, scale=1.0):
        return (torch.randn(*shape) * scale).to(torch.bfloat16)

    routed = RoutedExperts(bf16(E, inter, H, scale=H ** -0.5), bf16(E, inter, H, scale=H ** -0.5),
                           bf16(E, H, inter, scale=inter ** -0.5))
    shared = SharedExpert(bf16(shared_inter, H, scale=H ** -0.5), bf16(shared_inter, H, scale=H ** -0.5),
                          bf16(H, shared_inter, scale=shared_inter ** -0.5))
    ids = torch.randint(0, E, (T, K), dtype=torch.int32)
    return bf16(T, H), ids, torch.rand(T, K), routed, shared, bf16(T, H)


# Widths against H = 64 on both sides: the core's worker scratch holds rows of H and of I or I_s side by side, so
# a region sized by one and used with the other shows only when the other is the larger (Qwen1.5-MoE: I_s = 2.75 H).
@pytest.mark.parametrize(("inter", "shared_inter"), [(32, 32), (64, 64), (96, 65), (40, 176)],
                         ids=["narrower", "equal", "one_wider", "much_wider"])
@pytest.mark.parametrize("mxfp8", [False, True], ids=["bf16", "mxfp8"])
def test_host_matches_reference_for_widths_below_at_and_above_hidden(seed, inter, shared_inter, mxfp8):
    s = Scenario("widths", seed, mxfp8=mxfp8, swiglu_limit=1.5)
    inputs = shaped_inputs(40, inter, shared_inter)
    host, reference = (run(b, s, *inputs) for b in ("host", "reference"))
    assert_close_bf16(host, reference, f"seed {seed}, I {inter}, I_s {shared_inter}")
