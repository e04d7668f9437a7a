"""mok.moe forward and every gradient: against the float64 oracle (reference.py), against plain torch autograd
on an independently written float64 layer, bitwise against reference.py's bf16/MXFP8 path, under routing
extremes, and run twice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mok.layer
from mok import reference
from mok.experts import RoutedExperts, SharedExpert

H, INTER, I_SHARED = 64, 48, 40
NAMES = ("x", "topk_weights", "gate", "up", "down", "shared_gate", "shared_up", "shared_down")

# Relative error ||got - want|| / ||want|| over a whole tensor. bf16 keeps 8 significant bits (relative rounding
# error <= 2^-9); g, u, h, y, dh, dg, du and dx_k are each stored bf16, so a few such roundings compound to
# about 1e-2 in the worst element and a few 1e-3 in norm: 2e-2 leaves room without hiding a wrong formula (those
# give errors of order 1). MXFP8 keeps 4 significant bits (relative error <= 2^-4 per element) on every GEMM
# operand: 1.5e-1 in norm.
TOL = {"bf16": 2e-2, "mxfp8": 1.5e-1}


def make_inputs(T, E, K, *, shared=True, ids=None):
    def bf16(*shape, fan_in=1):
        return (torch.randn(*shape) / fan_in ** 0.5).to(torch.bfloat16)

    x = bf16(T, H)
    if ids is None:
        ids = torch.randint(0, E, (T, K))
        ids = torch.where(torch.rand(T, K) < 0.2, -1, ids)
    weights = torch.rand(T, K) + 0.1
    routed = RoutedExperts(bf16(E, INTER, H, fan_in=H), bf16(E, INTER, H, fan_in=H),
                           bf16(E, H, INTER, fan_in=INTER))
    shared = SharedExpert(bf16(I_SHARED, H, fan_in=H), bf16(I_SHARED, H, fan_in=H),
                          bf16(H, I_SHARED, fan_in=I_SHARED)) if shared else None
    return x, ids, weights, routed, shared, bf16(T, H)


def layer_with_autograd(x, ids, weights, routed, shared, dout, *, mxfp8=False, swiglu_limit=None, backend=None):
    """(out, {name: grad}) from mok.moe and autograd."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down)]
    if shared is not None:
        leaves += [t.detach().clone().requires_grad_(True) for t in (shared.gate, shared.up, shared.down)]
    r = RoutedExperts(*leaves[2:5])
    s = SharedExpert(*leaves[5:]) if shared is not None else None
    out = mok.layer.moe(leaves[0], ids, leaves[1], r.to_mxfp8() if mxfp8 else r, s, swiglu_limit=swiglu_limit,
                        backend=backend)
    out.backward(dout)
    return out.detach(), {n: t.grad for n, t in zip(NAMES, leaves, strict=False)}


def oracle(x, ids, weights, routed, shared, dout, *, swiglu_limit=None):
    out, ctx = reference.forward(x, ids, weights, routed, shared, swiglu_limit=swiglu_limit, precision="float64")
    return out, reference.backward(ctx, dout)._asdict()


def autograd_float64(x, ids, weights, routed, shared, dout, *, swiglu_limit=None):
    """The layer written the obvious way in float64, differentiated by torch: an independent check of the
    oracle's hand-written backward."""
    leaves = [t.detach().double().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down)]
    if shared is not None:
        leaves += [t.detach().double().requires_grad_(True) for t in (shared.gate, shared.up, shared.down)]
    xd, wd, gate, up, down = leaves[:5]
    limit = float("inf") if swiglu_limit is None else swiglu_limit

    def swiglu_mlp(v, g_w, u_w, d_w):
        g, u = v @ g_w.t(), v @ u_w.t()
        return (F.silu(torch.clamp(g, max=limit)) * torch.clamp(u, -limit, limit)) @ d_w.t()

    out = torch.zeros_like(xd) if shared is None else swiglu_mlp(xd, *leaves[5:])
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e >= 0:
                out[t] = out[t] + wd[t, k] * swiglu_mlp(xd[t:t + 1], gate[e], up[e], down[e])[0]
    out.backward(dout.double())
    return out.detach(), {n: t.grad for n, t in zip(NAMES, leaves, strict=False)}


def assert_close_rel(got, want, tol, what):
    got, want = got.double(), want.double()
    scale = want.norm().clamp_min(1e-30)
    err = float((got - want).norm() / scale)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol}"


def compare(got, want, tol, what, names=NAMES):
    """(out, {name: grad}) against the same from another path: each of `names` within tol, or None on both."""
    out, grads = got
    out_w, grads_w = want
    assert_close_rel(out, out_w, tol, f"{what} out")
    for name in names:
        if grads_w.get(name) is None:
            assert grads.get(name) is None, f"{what} {name}: gradient where none is expected"
            continue
        assert_close_rel(grads[name], grads_w[name], tol, f"{what} d{name}")


@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
def test_against_float64_oracle(seed, mode):
    # No SwiGLU clamp here: where a stored bf16 g or u rounds across +-L the clamp's mask flips and one row's
    # whole gradient term switches, an O(1) difference from the oracle that no tolerance can tell from a bug.
    # The clamp is checked bitwise against reference.py below and against plain autograd in float64.
    inputs = make_inputs(40, 6, 3)
    got = layer_with_autograd(*inputs, mxfp8=mode == "mxfp8")
    compare(got, oracle(*inputs), TOL[mode], f"{mode} vs oracle")


def test_oracle_against_plain_autograd(seed):
    inputs = make_inputs(12, 4, 2)
    # Both float64, same formulas, different summation orders: agree to float64 rounding (1e-12 is ~2^-40).
    compare(oracle(*inputs, swiglu_limit=0.7), autograd_float64(*inputs, swiglu_limit=0.7), 1e-12, "oracle")


def test_against_plain_autograd(seed):
    inputs = make_inputs(12, 4, 2)
    compare(layer_with_autograd(*inputs), autograd_float64(*inputs), TOL["bf16"], "bf16 vs autograd")


@pytest.mark.parametrize("mxfp8", [False, True])
@pytest.mark.parametrize("swiglu_limit", [None, 0.5])
def test_bitwise_equal_to_reference_path(seed, mxfp8, swiglu_limit):
    """Without a shared expert (which mok.moe runs in fixed-size row chunks) the layer is reference.py's bf16 /
    MXFP8 path exactly: same rows, same order, same rounding points."""
    x, ids, weights, routed, _, dout = make_inputs(50, 5, 4, shared=False)
    out, grads = layer_with_autograd(x, ids, weights, routed, None, dout, mxfp8=mxfp8, swiglu_limit=swiglu_limit,
                                     backend="reference")
    ref_out, ctx = reference.forward(x, ids, weights, routed.to_mxfp8() if mxfp8 else routed,
                                     swiglu_limit=swiglu_limit)
    ref_grads = reference.backward(ctx, dout)
    assert torch.equal(out, ref_out)
    for name in NAMES[:5]:
        want = getattr(ref_grads, name)
        assert torch.equal(grads[name], want.to(grads[name].dtype)), name


def routing(kind: str, T: int, E: int, K: int) -> torch.Tensor:
    ids = torch.randint(0, E, (T, K))
    if kind == "one_expert":
        return torch.full((T, K), E - 1)  # every other expert has no rows
    if kind == "half_experts_empty":
        return ids % (E // 2)
    if kind == "unrouted_tokens":
        ids[: T // 2] = -1  # tokens whose every route is -1: only the shared expert sees them
        return ids
    return ids


@pytest.mark.parametrize("kind,K", [("one_expert", 2), ("half_experts_empty", 3), ("unrouted_tokens", 2),
                                    ("random", 1), ("random", 8)])
def test_routing_extremes(seed, kind, K):
    T, E = 24, 8
    inputs = make_inputs(T, E, K, ids=routing(kind, T, E, K))
    got = layer_with_autograd(*inputs)
    compare(got, oracle(*inputs), TOL["bf16"], kind)
    ids = inputs[1]
    unrouted = ids < 0
    assert torch.all(got[1]["topk_weights"][unrouted] == 0), "a -1 route must get a zero weight gradient"
    empty = [e for e in range(E) if not bool((ids == e).any())]
    for name in ("gate", "up", "down"):
        assert torch.all(got[1][name][empty] == 0), f"an expert with no rows must get a zero d{name}"


def test_all_routes_unused_gives_shared_expert_only(seed):
    x, ids, weights, routed, shared, dout = make_inputs(16, 4, 2, ids=torch.full((16, 2), -1))
    out, grads = layer_with_autograd(x, ids, weights, routed, shared, dout)
    shared_out, _ = reference.forward(x, ids, weights, routed, shared)
    assert torch.equal(out, shared_out) or float((out.float() - shared_out.float()).abs().max()) <= 2 ** -7
    assert torch.all(grads["gate"] == 0) and torch.all(grads["topk_weights"] == 0)


@pytest.mark.parametrize("mxfp8", [False, True])
def test_deterministic(seed, mxfp8):
    inputs = make_inputs(70, 6, 4)
    first = layer_with_autograd(*inputs, mxfp8=mxfp8, swiglu_limit=1.0)
    second = layer_with_autograd(*inputs, mxfp8=mxfp8, swiglu_limit=1.0)
    assert torch.equal(first[0], second[0])
    for name in NAMES:
        assert torch.equal(first[1][name], second[1][name]), name


def test_zero_tokens(seed):
    x, ids, weights, routed, shared, dout = make_inputs(0, 4, 2)
    out, grads = layer_with_autograd(x, ids, weights, routed, shared, dout)
    assert out.shape == (0, H)
    assert all(torch.all(grads[n] == 0) for n in NAMES[2:])
