"""The gated shared expert (Qwen2-MoE): out = sigmoid(x . r) * shared(x) + sum_k w_k y_k, r = SharedExpert.router.
The oracle against a float64 autograd formula, mok.moe (host and reference backends, bf16 and MXFP8) against the
oracle (output, dx, dtopk_weights, every weight gradient and the router's), two ranks against one process, fp32
main_grad accumulation of the router's gradient, mok.nn.MoE(shared_expert_gate=True) under torch.compile, and the
router's argument checks."""

from __future__ import annotations

import pytest
import torch
from backends import BACKENDS
from dist_utils import ep_group, halves, run_group
from test_compile import assert_compiled_equals_eager
from test_layer import TOL, assert_close_rel, make_inputs
from test_layer import compare as compare_grads

import mok
import mok.nn
from mok import functional, reference
from mok.experts import RoutedExperts, SharedExpert

WEIGHTS = ("gate", "up", "down", "shared_gate", "shared_up", "shared_down", "shared_router")
NAMES = ("x", "topk_weights", *WEIGHTS)


def gated_inputs(T=24, E=4, K=2):
    """make_inputs plus a router r ~ N(0, 1/H): the gate's logits x . r are of order 1, so sigmoid spreads over
    (0.2, 0.8) across tokens and its slope is far from 0 (a gate ignored or taken as 1 moves out by O(1))."""
    x, ids, weights, routed, shared, dout = make_inputs(T, E, K)
    h = x.shape[1]
    router = (torch.randn(h) / h ** 0.5).to(torch.bfloat16)
    return x, ids, weights, routed, SharedExpert(shared.gate, shared.up, shared.down, router), dout


def leaves_of(inputs):
    x, ids, weights, routed, shared, dout = inputs
    tensors = (x, weights, routed.gate, routed.up, routed.down, shared.gate, shared.up, shared.down, shared.router)
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def autograd_float64(inputs):
    """The layer written out in float64 autograd."""
    x, ids, weights, routed, shared, dout = inputs
    leaves = [t.double().detach().requires_grad_(True) for t in leaves_of(inputs)]
    xd, wd, gate, up, down, sg, su, sd, r = leaves

    def expert(v, g, u, d):
        return (torch.nn.functional.silu(v @ g.t()) * (v @ u.t())) @ d.t()

    out = torch.sigmoid(xd @ r)[:, None] * expert(xd, sg, su, sd)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e >= 0:
                out[t] = out[t] + wd[t, k] * expert(xd[t:t + 1], gate[e], up[e], down[e])[0]
    out.backward(dout.double())
    return out.detach(), {n: t.grad for n, t in zip(NAMES, leaves, strict=True)}


def reference_run(inputs, mxfp8=False, routing_scale="output"):
    x, ids, weights, routed, shared, dout = inputs
    out, ctx = reference.forward(x, ids, weights, routed.to_mxfp8() if mxfp8 else routed, shared, precision="float64",
                                 routing_scale=routing_scale)
    return out, reference.backward(ctx, dout)._asdict()


def moe_run(inputs, *, backend, mxfp8=False, group=None, routing_scale="output"):
    """(out, {name: grad}) from mok.moe with autograd."""
    _, ids, _, _, _, dout = inputs
    leaves = leaves_of(inputs)
    routed = RoutedExperts(*leaves[2:5])
    out = mok.moe(leaves[0], ids, leaves[1], routed.to_mxfp8() if mxfp8 else routed, SharedExpert(*leaves[5:]),
                  backend=backend, group=group, routing_scale=routing_scale)
    out.backward(dout)
    return out.detach(), {n: t.grad for n, t in zip(NAMES, leaves, strict=True)}


def compare(got, want, tol, what):
    assert all(want[1][name] is not None for name in NAMES), f"{what}: the oracle lacks a gradient"
    compare_grads(got, want, tol, what, NAMES)


def test_oracle_against_float64_formula(seed):
    inputs = gated_inputs()
    # Both float64, the same formula, different summation orders: float64 rounding (1e-12 is ~2^-40).
    compare(reference_run(inputs), autograd_float64(inputs), 1e-12, "oracle vs formula")


def test_the_gate_matters(seed):
    """The gated output is far (> 5 TOL) from the ungated one and from half of it (a constant gate of 0.5): a path
    that dropped the gate or its per-token dependence would fail test_moe_against_oracle."""
    x, ids, weights, routed, shared, dout = gated_inputs()
    gated, _ = reference_run((x, ids, weights, routed, shared, dout))
    ungated = SharedExpert(shared.gate, shared.up, shared.down)
    out, ctx = reference.forward(x, ids, weights, routed, ungated, precision="float64")
    half = out - 0.5 * ctx.shared_activations.y
    for other, what in ((out, "ungated"), (half, "gate 0.5")):
        assert float((other - gated).norm() / gated.norm()) > 5 * TOL["bf16"], f"{what} is as good as gated"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
def test_moe_against_oracle(seed, backend, mode):
    inputs = gated_inputs()
    compare(moe_run(inputs, backend=backend, mxfp8=mode == "mxfp8"), reference_run(inputs), TOL[mode],
            f"{backend} {mode} vs oracle")


@pytest.mark.parametrize("backend", BACKENDS)
def test_gate_with_input_scaling(seed, backend):
    """The gate and Llama4's input-side routing scale together (independent in core: the gate scales the shared
    term, the routing weights the experts' rows)."""
    inputs = gated_inputs()
    compare(moe_run(inputs, backend=backend, routing_scale="input"), reference_run(inputs, routing_scale="input"),
            TOL["bf16"], f"{backend} input scaling vs oracle")


def two_rank_worker(rank, world, seed, backend):
    torch.manual_seed(seed)
    x, ids, weights, routed, shared, dout = gated_inputs()
    tokens, experts = halves(rank)
    mine = RoutedExperts(*(getattr(routed, n)[experts] for n in ("gate", "up", "down")))
    return moe_run((x[tokens], ids[tokens], weights[tokens], mine, shared, dout[tokens]), backend=backend,
                   group=ep_group())


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_ranks_equal_one_process(seed, backend):
    """Two gloo ranks (half the tokens, half the experts each): out, dx and dtopk_weights are the one-process run's
    rows bitwise (a token's gate and shared output depend on that token alone); the shared expert's and the
    router's gradients are over the rank's own tokens, as any replicated weight's, and match the oracle there."""
    torch.manual_seed(seed)
    inputs = gated_inputs()
    x, ids, weights, routed, shared, dout = inputs
    alone_out, alone = moe_run(inputs, backend=backend)
    for rank, (out, grads) in enumerate(run_group(2, two_rank_worker, seed, backend)):
        tokens = slice(rank * 12, rank * 12 + 12)
        assert torch.equal(out, alone_out[tokens]), f"rank {rank}: out differs"
        for name in ("x", "topk_weights"):
            assert torch.equal(grads[name], alone[name][tokens]), f"rank {rank}: d{name} differs"
        _, want = reference_run((x[tokens], ids[tokens], weights[tokens], routed, shared, dout[tokens]))
        for name in ("shared_gate", "shared_up", "shared_down", "shared_router"):
            assert_close_rel(grads[name], want[name], TOL["bf16"], f"rank {rank} d{name}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_router_gradient_accumulates_into_main_grad(seed, backend):
    """MainGrads.shared_router (fp32, pre-filled with noise) gets the router's gradient added in fp32 and the
    returned bf16 one is None; the sum matches noise + the oracle's gradient."""
    x, ids, weights, routed, shared, dout = gated_inputs()
    noise = torch.randn(x.shape[1])
    main = functional.MainGrads(shared_router=noise.clone())
    _, ctx = functional.forward(x, ids, weights, routed, shared, backend=backend)
    grads = functional.backward(ctx, dout, main_grads=main)
    assert grads.shared_router is None and grads.shared_gate is not None
    _, want = reference_run((x, ids, weights, routed, shared, dout))
    assert_close_rel(main.shared_router - noise, want["shared_router"], TOL["bf16"], "main_grads.shared_router")


@pytest.mark.parametrize("mxfp8", [False, True])
def test_nn_moe_gated_compiles_to_eager_bits(seed, mxfp8):
    """mok.nn.MoE(shared_expert_gate=True): torch.compile(fullgraph) through the op schema (the router as the
    shared list's fourth tensor, its gradient out) is bitwise eager, and the router parameter gets a gradient."""
    torch._dynamo.reset()
    layer = mok.nn.MoE(32, 16, 4, 2, shared_intermediate=24, shared_expert_gate=True, mxfp8=mxfp8)
    grads = assert_compiled_equals_eager(layer, torch.randn(12, 32).to(torch.bfloat16), parameters=8)
    router = dict(zip((n for n, _ in layer.named_parameters()), grads, strict=True))["shared_router"]
    assert router.abs().sum() > 0


def test_router_is_checked():
    x, ids, weights, routed, shared, dout = make_inputs(4, 2, 1)
    h = x.shape[1]
    with pytest.raises(ValueError, match=rf"router must have shape \({h},\)"):
        SharedExpert(shared.gate, shared.up, shared.down, torch.zeros(h + 1, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="router must be bfloat16"):
        SharedExpert(shared.gate, shared.up, shared.down, torch.zeros(h))
    with pytest.raises(ValueError, match="router must be 1-D"):
        SharedExpert(shared.gate, shared.up, shared.down, torch.zeros(1, h, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="shared_expert_gate=True needs a shared expert"):
        mok.nn.MoE(h, 8, 2, 1, shared_expert_gate=True)
    _, ctx = functional.forward(x, ids, weights, routed, shared)
    with pytest.raises(ValueError, match="main_grads.shared_router must be None: the shared expert has no router"):
        functional.backward(ctx, dout, main_grads=functional.MainGrads(shared_router=torch.zeros(h)))
