"""The gpt-oss activation h = g' sigmoid(alpha g') (u' + 1) in reference.py: its float64 oracle against plain
torch autograd on the formula as gpt-oss writes it (clamp crossed, several alphas), and its bf16 / MXFP8 paths
against that oracle. The libmok executors are held against the same formula in tests/cpp (test_layer's
swiglu_oai cases, test_core_numeric's swiglu_oai_matches_its_formula)."""
from __future__ import annotations

import pytest
import torch
from test_layer import NAMES, TOL, compare, make_inputs

from mok import reference


def gpt_oss_mlp(v, g_w, u_w, d_w, limit, alpha):
    """gpt-oss's expert written as its model code writes it (float64 autograd leaves)."""
    gate, up = v @ g_w.t(), v @ u_w.t()
    gate = gate.clamp(max=limit)
    up = up.clamp(-limit, limit)
    glu = gate * torch.sigmoid(gate * alpha)
    return ((up + 1) * glu) @ d_w.t()


def autograd_float64(x, ids, weights, routed, shared, dout, *, limit, alpha):
    leaves = [t.detach().double().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down)]
    leaves += [t.detach().double().requires_grad_(True) for t in (shared.gate, shared.up, shared.down)]
    xd, wd, gate, up, down = leaves[:5]
    out = gpt_oss_mlp(xd, *leaves[5:], limit, alpha)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e >= 0:
                out[t] = out[t] + wd[t, k] * gpt_oss_mlp(xd[t:t + 1], gate[e], up[e], down[e], limit, alpha)[0]
    out.backward(dout.double())
    return out.detach(), {n: t.grad for n, t in zip(NAMES, leaves, strict=False)}


def reference_run(inputs, *, limit, alpha, precision="float64", mxfp8=False):
    x, ids, weights, routed, shared, dout = inputs
    routed = routed.to_mxfp8() if mxfp8 else routed
    out, ctx = reference.forward(x, ids, weights, routed, shared, swiglu_limit=limit, precision=precision,
                                 activation="swiglu_oai", alpha=alpha)
    return out, reference.backward(ctx, dout)._asdict()


def wide_inputs(T, E, K, scale):
    """make_inputs with x scaled so g and u span several binades and cross the clamp."""
    x, ids, weights, routed, shared, dout = make_inputs(T, E, K)
    return (x.float() * scale).to(torch.bfloat16), ids, weights, routed, shared, dout


@pytest.mark.parametrize("alpha", [1.702, 0.5])
def test_oracle_against_gpt_oss_formula(seed, alpha):
    inputs = wide_inputs(12, 4, 2, 8.0)
    g = inputs[0].double() @ inputs[3].gate[0].double().t()
    assert (g > 1.5).any() and (g.abs() < 0.05).any(), "inputs must cross the clamp and reach small values"
    # Both float64, the same formula, different summation orders: float64 rounding (1e-12 is ~2^-40).
    compare(reference_run(inputs, limit=1.5, alpha=alpha), autograd_float64(*inputs, limit=1.5, alpha=alpha), 1e-12,
            "oracle vs gpt-oss formula")


@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
def test_bf16_paths_against_oracle(seed, mode):
    # No clamp here (a bf16 g rounding across L flips a mask: see test_layer); alpha 1.702 as gpt-oss. x scaled by
    # 4 so that g and u reach ~+-4, where alpha * g' and u' + 1 are far from swiglu's g' and u'.
    inputs = wide_inputs(40, 6, 3, 4.0)
    got = reference_run(inputs, limit=None, alpha=1.702, precision="bf16", mxfp8=mode == "mxfp8")
    want = reference_run(inputs, limit=None, alpha=1.702)
    compare(got, want, TOL[mode], f"{mode} vs oracle")


def test_swiglu_oai_differs_from_swiglu(seed):
    """The two activations give different layers (a path that ignored `activation` would pass the tests above
    only if they compared nothing): relative difference of order 1."""
    x, ids, weights, routed, shared, _ = wide_inputs(12, 4, 2, 4.0)
    oai, _ = reference.forward(x, ids, weights, routed, shared, precision="float64", activation="swiglu_oai")
    plain, _ = reference.forward(x, ids, weights, routed, shared, precision="float64")
    assert float((oai - plain).norm() / plain.norm()) > 0.1


@pytest.mark.parametrize("bad", [dict(activation="gelu"), dict(activation="swiglu_oai", alpha=0.0),
                                 dict(activation="swiglu_oai", alpha=float("nan"))])
def test_bad_activation_is_rejected(bad):
    x, ids, weights, routed, shared, _ = make_inputs(4, 2, 1)
    with pytest.raises(ValueError, match="activation must be one of|alpha must be a finite number > 0"):
        reference.forward(x, ids, weights, routed, shared, **bad)
