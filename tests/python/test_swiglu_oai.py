"""The gpt-oss activation h = g' sigmoid(alpha g') (u' + 1) in reference.py: its float64 oracle against plain
torch autograd on the formula as gpt-oss writes it (clamp crossed, several alphas), and its bf16 / MXFP8 paths
against that oracle. The libmok executors are held against the same formula in tests/cpp (test_layer's
swiglu_oai cases, test_core_numeric's swiglu_oai_matches_its_formula). Then the layer's Python API with
activation="swiglu_oai" (mok.moe, mok.functional, mok.nn.MoE) on every CPU backend against the float64 oracle,
the backends against each other, two ranks against one process, and its argument checks."""
from __future__ import annotations

import re

import pytest
import torch
from backends import BACKENDS, needs_host
from dist_utils import assert_ranks_equal_one_process, ep_group, halves, run_group
from test_host_backend import assert_close_bf16
from test_layer import NAMES, TOL, assert_close_rel, compare, make_inputs

import mok
import mok.nn
from mok import functional, reference
from mok.experts import RoutedExperts, SharedExpert


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
    x, *rest = wide_inputs(12, 4, 2, 8.0)
    x[-1] *= 2 ** -8  # one token of small values (exact in bf16): g near 0, where sigmoid's slope matters most
    inputs = (x, *rest)
    g = x.double() @ inputs[3].gate[0].double().t()
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


# ----------------------------------------------------------------------------------------------------------------
# mok.moe, mok.functional and mok.nn with activation="swiglu_oai", on the libmok (host) and reference backends


def moe_run(inputs, *, backend, alpha, limit=None, mxfp8=False, group=None, activation="swiglu_oai"):
    """(out, {name: grad}) from mok.moe with autograd (grads of x, topk_weights and every bf16 weight)."""
    x, ids, weights, routed, shared, dout = inputs
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down)]
    if shared is not None:
        leaves += [t.detach().clone().requires_grad_(True) for t in (shared.gate, shared.up, shared.down)]
    r = RoutedExperts(*leaves[2:5])
    s = SharedExpert(*leaves[5:]) if shared is not None else None
    out = mok.moe(leaves[0], ids, leaves[1], r.to_mxfp8() if mxfp8 else r, s, swiglu_limit=limit, backend=backend,
                  activation=activation, alpha=alpha, group=group)
    out.backward(dout)
    return out.detach(), {n: t.grad for n, t in zip(NAMES, leaves, strict=False)}


# (mode, alpha): None is the default 1.702; 0.5 is far enough from it that a path which dropped alpha (and ran
# 1.702) is off by much more than the bf16 tolerance (checked by test_alpha_changes_the_layer).
CASES = [("bf16", None), ("bf16", 0.5), ("mxfp8", 1.702)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("mode", "alpha"), CASES)
def test_moe_against_oracle(seed, backend, mode, alpha):
    # No clamp (see test_bf16_paths_against_oracle); x scaled by 4 so g' and u' reach +-4.
    inputs = wide_inputs(40, 6, 3, 4.0)
    got = moe_run(inputs, backend=backend, alpha=alpha, mxfp8=mode == "mxfp8")
    want = reference_run(inputs, limit=None, alpha=1.702 if alpha is None else alpha)
    compare(got, want, TOL[mode], f"{backend} {mode} alpha {alpha} vs oracle")


def test_alpha_changes_the_layer(seed):
    """The oracle at alpha 0.5 and 1.702 differs by several TOL["bf16"] (about 0.12 relative, the shared expert's
    part diluting it), so test_moe_against_oracle's alpha=0.5 case fails on a path that ignores alpha."""
    inputs = wide_inputs(40, 6, 3, 4.0)
    a, _ = reference_run(inputs, limit=None, alpha=0.5)
    b, _ = reference_run(inputs, limit=None, alpha=1.702)
    assert float((a - b).norm() / b.norm()) > 3 * TOL["bf16"]


@needs_host
@pytest.mark.parametrize("mxfp8", [False, True])
def test_host_and_reference_agree(seed, mxfp8):
    # With a clamp crossed (L = 1.5, x scaled by 4): both backends round g and u to bf16 at the same points, so
    # the masks agree and only fp32 summation orders differ (assert_close_bf16's bounds).
    inputs = wide_inputs(40, 6, 3, 4.0)
    host = moe_run(inputs, backend="host", alpha=0.8, limit=1.5, mxfp8=mxfp8)
    ref = moe_run(inputs, backend="reference", alpha=0.8, limit=1.5, mxfp8=mxfp8)
    assert_close_bf16(host, ref, f"seed {seed}, mxfp8 {mxfp8}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_workspace_two_alphas_and_activations(seed, backend):
    """One explicit workspace, calls with another alpha or activation in turn: each call runs its own math (the
    host executor keys its libmok layer by activation and alpha, not only by the workspace)."""
    x, ids, weights, routed, shared, _ = wide_inputs(24, 4, 2, 4.0)
    ws = functional.create_workspace(max_tokens=24, hidden=x.shape[1], topk=2, num_local_experts=4,
                                     intermediate=routed.intermediate_size,
                                     shared_intermediate=shared.intermediate_size, backend=backend)
    for activation, alpha in (("swiglu_oai", 1.702), ("swiglu_oai", 0.5), ("swiglu", None), ("swiglu_oai", 0.5)):
        out, _ = functional.forward(x, ids, weights, routed, shared, workspace=ws, backend=backend,
                                    activation=activation, alpha=alpha, need_context=False)
        keywords = {} if alpha is None else dict(activation=activation, alpha=alpha)
        want, _ = reference.forward(x, ids, weights, routed, shared, precision="float64", **keywords)
        assert_close_rel(out, want, TOL["bf16"], f"{backend} {activation} alpha {alpha} out")


@pytest.mark.parametrize("backend", BACKENDS)
def test_nn_moe_runs_swiglu_oai(seed, backend):
    module = mok.nn.MoE(64, 32, 4, 2, shared_intermediate=16, activation="swiglu_oai", alpha=0.5, backend=backend)
    assert (module.activation, module.alpha) == ("swiglu_oai", 0.5)
    x = (torch.randn(20, 64) * 4).to(torch.bfloat16)
    routing = module.route(x)
    out = module(x)
    routed = RoutedExperts(module.gate.detach(), module.up.detach(), module.down.detach())
    shared = SharedExpert(module.shared_gate.detach(), module.shared_up.detach(), module.shared_down.detach())
    want, _ = reference.forward(x, routing.ids, routing.weights.detach(), routed, shared, precision="float64",
                                activation="swiglu_oai", alpha=0.5)
    assert_close_rel(out.detach(), want, TOL["bf16"], f"{backend} nn.MoE out")


BAD = [
    (dict(activation="gelu"), ValueError, 'activation must be "swiglu" or "swiglu_oai", got \'gelu\''),
    (dict(activation=1), TypeError, 'activation must be "swiglu" or "swiglu_oai", got int'),
    (dict(activation="swiglu", alpha=1.0), ValueError, 'alpha must be None with activation="swiglu"'),
    (dict(activation="swiglu_oai", alpha=0.0), ValueError, "alpha must be None or a finite float > 0"),
    (dict(activation="swiglu_oai", alpha=-1.0), ValueError, "alpha must be None or a finite float > 0"),
    (dict(activation="swiglu_oai", alpha=float("nan")), ValueError, "alpha must be None or a finite float > 0"),
    (dict(activation="swiglu_oai", alpha=float("inf")), ValueError, "alpha must be None or a finite float > 0"),
    (dict(activation="swiglu_oai", alpha="1.7"), TypeError, "alpha must be None or a positive float"),
    (dict(activation="swiglu_oai", alpha=True), TypeError, "alpha must be None or a positive float"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("bad", "kind", "message"), BAD)
def test_moe_rejects_bad_activation(backend, bad, kind, message):
    x, ids, weights, routed, shared, _ = make_inputs(4, 2, 1)
    with pytest.raises(kind, match=re.escape(message)):
        mok.moe(x, ids, weights, routed, shared, backend=backend, **bad)
    with pytest.raises(kind, match=re.escape(message)):
        functional.forward(x, ids, weights, routed, shared, backend=backend, **bad)


@pytest.mark.parametrize(("bad", "kind", "message"), BAD[:4])
def test_nn_moe_rejects_bad_activation(bad, kind, message):
    with pytest.raises(kind, match=re.escape(message)):
        mok.nn.MoE(16, 8, 2, 1, **bad)


# Two gloo ranks: each rank has half the tokens and half the experts; the result is the one-process run's rows,
# bitwise (both executors fix their reduction orders, see test_ep / test_host_backend).
def two_rank_worker(rank, world, seed, backend):
    torch.manual_seed(seed)
    x, ids, weights, routed, _, dout = wide_inputs(24, 4, 2, 4.0)
    tokens, experts = halves(rank)
    mine = RoutedExperts(routed.gate[experts], routed.up[experts], routed.down[experts])
    return moe_run((x[tokens], ids[tokens], weights[tokens], mine, None, dout[tokens]), backend=backend, alpha=0.5,
                   limit=1.5, group=ep_group())


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_ranks_equal_one_process(seed, backend):
    torch.manual_seed(seed)
    x, ids, weights, routed, _, dout = wide_inputs(24, 4, 2, 4.0)
    alone_out, alone = moe_run((x, ids, weights, routed, None, dout), backend=backend, alpha=0.5, limit=1.5)
    assert_ranks_equal_one_process(run_group(2, two_rank_worker, seed, backend), alone_out, alone)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_moe_equals_eager(seed, backend):
    """torch.compile(fullgraph=True) passes activation and alpha through the op's schema: the same bits."""
    torch._dynamo.reset()
    inputs = wide_inputs(24, 4, 2, 4.0)
    fn = torch.compile(mok.moe, fullgraph=True, backend="aot_eager")
    x, ids, weights, routed, shared, dout = inputs
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down,
                                                                 shared.gate, shared.up, shared.down)]
    out = fn(leaves[0], ids, leaves[1], RoutedExperts(*leaves[2:5]), SharedExpert(*leaves[5:]), swiglu_limit=1.5,
             backend=backend, activation="swiglu_oai", alpha=0.5)
    out.backward(dout)
    want_out, want = moe_run(inputs, backend=backend, alpha=0.5, limit=1.5)
    assert torch.equal(out.detach(), want_out)
    for name, leaf in zip(NAMES, leaves, strict=True):
        assert torch.equal(leaf.grad, want[name]), name


def disagreeing_worker(rank, world, seed, backend, field):
    """Rank 1 passes another alpha (or activation) than rank 0: every rank raises the group's reason."""
    torch.manual_seed(seed)
    x, ids, weights, routed, _, _ = wide_inputs(8, 4, 2, 1.0)
    mine = RoutedExperts(routed.gate[rank * 2:rank * 2 + 2], routed.up[rank * 2:rank * 2 + 2],
                         routed.down[rank * 2:rank * 2 + 2])
    keywords = dict(activation="swiglu_oai", alpha=0.5)
    if rank == 1:
        keywords = dict(activation="swiglu_oai", alpha=0.6) if field == "alpha" else dict(activation="swiglu")
    try:
        mok.moe(x, ids, weights, mine, None, group=ep_group(), backend=backend, **keywords)
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("field", ["alpha", "activation"])
def test_ranks_must_agree_on_activation(seed, backend, field):
    for rank, message in enumerate(run_group(2, disagreeing_worker, seed, backend, field)):
        assert message is not None and f"every rank of the group must have the same {field} ({field})" in message, \
            f"rank {rank}: {message}"


@needs_host
def test_binding_config_keys():
    """python/src/layer.cpp's config keys `activation` (by name) and `swiglu_alpha` reach libmok's checks."""
    from mok import _mok

    base = dict(world=1, rank=0, experts_per_rank=2, hidden=64, intermediate=32, top_k=1, max_tokens=4)
    assert _mok.layer_sizes(dict(base, activation="swiglu_oai", swiglu_alpha=1.702))[1] > 0
    for bad, message in ((dict(activation="gelu"), "config: 'activation' must be \"swiglu\" or \"swiglu_oai\""),
                         (dict(activation=1), "config: 'activation' must be \"swiglu\" or \"swiglu_oai\""),
                         (dict(activation="swiglu_oai", swiglu_alpha=0.0), "'config.swiglu_alpha' (0) must be finite")):
        with pytest.raises(ValueError, match=re.escape(message)):
            _mok.layer_sizes(dict(base, **bad))
