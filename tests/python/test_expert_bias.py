"""Routed-expert biases (gpt-oss): g = x W_gate^T + b_gate, u = x W_up^T + b_up, y = h W_down^T + b_down. The oracle
against a float64 autograd formula, and mok.moe (host and reference backends, bf16 and MXFP8) against the oracle:
the output, dx, dtopk_weights, every weight gradient and every bias gradient."""

from __future__ import annotations

import pytest
import torch
from backends import BACKENDS
from dist_utils import assert_ranks_equal_one_process, ep_group, halves, run_group
from test_compile import assert_compiled_equals_eager
from test_layer import TOL, assert_close_rel, make_inputs
from test_layer import compare as compare_grads

import mok
import mok.nn
from mok import reference
from mok.experts import RoutedExperts, SharedExpert

LIMIT, ALPHA = 7.0, 1.702  # gpt-oss's clamp and alpha
WEIGHTS = ("gate", "up", "down", "shared_gate", "shared_up", "shared_down")
BIASES = ("gate_bias", "up_bias", "down_bias")
NAMES = ("x", "topk_weights", *WEIGHTS, *BIASES)


def biased_inputs(T=24, E=4, K=2):
    """make_inputs plus biases drawn like the GEMM outputs they are added to (g, u of order 1 from x ~ N(0, 1)
    and weights ~ N(0, 1/H); y of order 0.5): dropping a bias moves its output by a relative O(1)."""
    x, ids, weights, routed, shared, dout = make_inputs(T, E, K)
    e, i, h = routed.gate.shape
    biases = [torch.randn(e, i).to(torch.bfloat16), torch.randn(e, i).to(torch.bfloat16),
              (0.5 * torch.randn(e, h)).to(torch.bfloat16)]
    return x, ids, weights, RoutedExperts(routed.gate, routed.up, routed.down, *biases), shared, dout


def expert_formula(v, gate, up, down, bg, bu, bd, act):
    g, u = v @ gate.t() + bg, v @ up.t() + bu
    return act(g, u) @ down.t() + bd


def swiglu_oai(g, u):
    g, u = g.clamp(max=LIMIT), u.clamp(-LIMIT, LIMIT)
    return g * torch.sigmoid(ALPHA * g) * (u + 1)


def swiglu(g, u):
    return torch.nn.functional.silu(g) * u


def autograd_float64(inputs, act):
    """The layer written out in float64 autograd: out = shared(x) + sum_k w_k expert_k(x)."""
    x, ids, weights, routed, shared, dout = inputs
    tensors = (x, weights, routed.gate, routed.up, routed.down, shared.gate, shared.up, shared.down,
               routed.gate_bias, routed.up_bias, routed.down_bias)
    leaves = [t.detach().double().requires_grad_(True) for t in tensors]
    xd, wd, gate, up, down, sg, su, sd, bg, bu, bd = leaves
    out = act(xd @ sg.t(), xd @ su.t()) @ sd.t()
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e >= 0:
                y = expert_formula(xd[t:t + 1], gate[e], up[e], down[e], bg[e], bu[e], bd[e], act)[0]
                out[t] = out[t] + wd[t, k] * y
    out.backward(dout.double())
    return out.detach(), {n: t.grad for n, t in zip(NAMES, leaves, strict=True)}


def reference_run(inputs, *, activation, precision="float64", mxfp8=False):
    x, ids, weights, routed, shared, dout = inputs
    routed = routed.to_mxfp8() if mxfp8 else routed
    out, ctx = reference.forward(x, ids, weights, routed, shared, precision=precision, activation=activation,
                                 swiglu_limit=LIMIT if activation == "swiglu_oai" else None)
    return out, reference.backward(ctx, dout)._asdict()


def moe_run(inputs, *, backend, activation, mxfp8=False):
    """(out, {name: grad}) from mok.moe with autograd: grads of x, topk_weights, every weight and bias."""
    x, ids, weights, routed, shared, dout = inputs
    tensors = (x, weights, routed.gate, routed.up, routed.down, shared.gate, shared.up, shared.down,
               routed.gate_bias, routed.up_bias, routed.down_bias)
    leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
    r = RoutedExperts(*leaves[2:5], *leaves[8:])
    s = SharedExpert(*leaves[5:8])
    out = mok.moe(leaves[0], ids, leaves[1], r.to_mxfp8() if mxfp8 else r, s, backend=backend, activation=activation,
                  swiglu_limit=LIMIT if activation == "swiglu_oai" else None)
    out.backward(dout)
    return out.detach(), {n: t.grad for n, t in zip(NAMES, leaves, strict=True)}


def compare(got, want, tol, what):
    assert all(want[1][name] is not None for name in NAMES), f"{what}: the oracle lacks a gradient"
    compare_grads(got, want, tol, what, NAMES)


@pytest.mark.parametrize("activation", ["swiglu", "swiglu_oai"])
def test_oracle_against_float64_formula(seed, activation):
    inputs = biased_inputs()
    formula = autograd_float64(inputs, swiglu_oai if activation == "swiglu_oai" else swiglu)
    # Both float64, the same formula, different summation orders: float64 rounding (1e-12 is ~2^-40).
    compare(reference_run(inputs, activation=activation), formula, 1e-12, f"oracle {activation} vs formula")


def test_biases_matter(seed):
    """Each bias moves the layer's output or its own gradient's consumers by much more than TOL["bf16"]: a path
    that dropped one would fail test_moe_against_oracle."""
    inputs = biased_inputs()
    out, _ = reference_run(inputs, activation="swiglu_oai")
    x, ids, weights, routed, shared, dout = inputs
    for name in BIASES:
        kept = {n: getattr(routed, n) for n in BIASES if n != name}
        without = RoutedExperts(routed.gate, routed.up, routed.down, **kept)
        other, _ = reference_run((x, ids, weights, without, shared, dout), activation="swiglu_oai")
        assert float((other - out).norm() / out.norm()) > 5 * TOL["bf16"], f"{name} barely changes the output"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
@pytest.mark.parametrize("activation", ["swiglu", "swiglu_oai"])
def test_moe_against_oracle(seed, backend, mode, activation):
    inputs = biased_inputs()
    got = moe_run(inputs, backend=backend, activation=activation, mxfp8=mode == "mxfp8")
    want = reference_run(inputs, activation=activation)
    compare(got, want, TOL[mode], f"{backend} {mode} {activation} vs oracle")


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_bias_alone(seed, backend):
    """Each bias is optional on its own: only down_bias given; the others' gradients are None."""
    x, ids, weights, routed, shared, dout = biased_inputs()
    bias = routed.down_bias.detach().clone().requires_grad_(True)
    r = RoutedExperts(routed.gate, routed.up, routed.down, down_bias=bias)
    out = mok.moe(x, ids, weights, r, shared, backend=backend)
    out.backward(dout)
    want_out, ctx = reference.forward(x, ids, weights, r, shared, precision="float64")
    want = reference.backward(ctx, dout)
    assert want.gate_bias is None and want.up_bias is None
    assert_close_rel(out.detach(), want_out, TOL["bf16"], "out")
    assert_close_rel(bias.grad, want.down_bias, TOL["bf16"], "ddown_bias")


def test_bias_shape_is_checked():
    x, ids, weights, routed, shared, _ = make_inputs(4, 2, 1)
    e, i, h = routed.gate.shape
    with pytest.raises(ValueError, match="gate_bias must have shape"):
        RoutedExperts(routed.gate, routed.up, routed.down, gate_bias=torch.zeros(e, h + 1, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="down_bias must be bfloat16"):
        RoutedExperts(routed.gate, routed.up, routed.down, down_bias=torch.zeros(e, h))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nn_moe_expert_bias_gets_gradients(seed, backend):
    """mok.nn.MoE(expert_bias=True): its bias parameters reach mok.moe (the output moves when they do) and get
    the oracle's gradients."""
    torch.manual_seed(0)
    layer = mok.nn.MoE(32, 16, 4, 2, expert_bias=True, activation="swiglu_oai", backend=backend)
    x = torch.randn(12, 32).to(torch.bfloat16)
    before = layer(x).detach()
    with torch.no_grad():
        for name in BIASES:
            getattr(layer, name).copy_(torch.randn_like(getattr(layer, name), dtype=torch.float32))
    out = layer(x)
    assert float((out.detach() - before).norm() / before.norm()) > 0.1
    dout = torch.randn_like(out)
    out.backward(dout)
    ids, weights, _, _ = layer.route(x)
    routed = RoutedExperts(layer.gate.detach(), layer.up.detach(), layer.down.detach(),
                           *(getattr(layer, n).detach() for n in BIASES))
    _, ctx = reference.forward(x, ids, weights.detach(), routed, None, precision="float64", activation="swiglu_oai")
    want = reference.backward(ctx, dout)
    for name in BIASES:
        assert_close_rel(getattr(layer, name).grad, getattr(want, name), TOL["bf16"], f"d{name}")


@pytest.mark.parametrize("mxfp8", [False, True])
def test_compiled_moe_with_biases_equals_eager(seed, mxfp8):
    """torch.compile(fullgraph) through the custom op's schema (biases in the routed list, their gradients out):
    bitwise what eager gives, on the default backend."""
    torch._dynamo.reset()
    layer = mok.nn.MoE(32, 16, 4, 2, expert_bias=True, mxfp8=mxfp8, activation="swiglu_oai", swiglu_limit=LIMIT)
    with torch.no_grad():
        for name in BIASES:
            getattr(layer, name).copy_(torch.randn_like(getattr(layer, name), dtype=torch.float32))
    assert_compiled_equals_eager(layer, torch.randn(12, 32).to(torch.bfloat16), parameters=7)


ROUTED = ("x", "topk_weights", "gate", "up", "down", *BIASES)


def routed_only_run(inputs, backend, group=None):
    """mok.moe with biases and no shared expert: (out, {name: grad}) for ROUTED."""
    x, ids, weights, routed, dout = inputs
    tensors = (x, weights, routed.gate, routed.up, routed.down, routed.gate_bias, routed.up_bias, routed.down_bias)
    leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
    out = mok.moe(leaves[0], ids, leaves[1], RoutedExperts(*leaves[2:]), None, backend=backend, group=group,
                  activation="swiglu_oai", swiglu_limit=LIMIT)
    out.backward(dout)
    return out.detach(), {n: t.grad for n, t in zip(ROUTED, leaves, strict=True)}


def rank_slice(routed, experts):
    return RoutedExperts(*(getattr(routed, n)[experts] for n in ("gate", "up", "down", *BIASES)))


def two_rank_worker(rank, world, seed, backend):
    torch.manual_seed(seed)
    x, ids, weights, routed, _, dout = biased_inputs()
    tokens, experts = halves(rank)
    return routed_only_run((x[tokens], ids[tokens], weights[tokens], rank_slice(routed, experts), dout[tokens]),
                           backend, group=ep_group())


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_ranks_equal_one_process(seed, backend):
    """Two gloo ranks (half the tokens, half the experts each) give the one-process run's rows and experts
    bitwise, bias gradients included (each expert's rows are summed in the same canonical order)."""
    torch.manual_seed(seed)
    x, ids, weights, routed, _, dout = biased_inputs()
    alone_out, alone = routed_only_run((x, ids, weights, routed, dout), backend)
    assert_ranks_equal_one_process(run_group(2, two_rank_worker, seed, backend), alone_out, alone,
                                   ("gate", "up", "down", *BIASES))
