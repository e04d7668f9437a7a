"""routing_scale="input" (Llama4): the routing weight w_k scales the row expert k reads, bf16(w_k x), and the expert
outputs add unweighted: out = shared(x) + sum_k y_k(bf16(w_k x)). reference.py's float64 oracle against plain torch
autograd on that formula; its bf16 / MXFP8 paths against the oracle; then mok.moe, mok.functional and mok.nn.MoE on
every CPU backend (libmok's host executor and the reference executor) against the oracle, with the forward's
context kept and recomputed, the backends against each other, two ranks against one process, and the argument
checks. The C++ oracle (tests/cpp/reference.hpp) holds libmok to the same rounding points in test_layer."""
from __future__ import annotations

import re

import pytest
import torch
from backends import BACKENDS, needs_host
from dist_utils import assert_ranks_equal_one_process, ep_group, halves, run_group
from test_host_backend import assert_close_bf16
from test_layer import NAMES, TOL, compare, make_inputs

import mok
import mok.nn
from mok import functional, reference
from mok.experts import RoutedExperts, SharedExpert


def swiglu_mlp(v, g_w, u_w, d_w):
    return (torch.nn.functional.silu(v @ g_w.t()) * (v @ u_w.t())) @ d_w.t()


def autograd_float64(x, ids, weights, routed, shared, dout):
    """Llama4's MoE as its model code computes it (float64 autograd leaves): each expert on w_k * x_t."""
    leaves = [t.detach().double().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down)]
    leaves += [t.detach().double().requires_grad_(True) for t in (shared.gate, shared.up, shared.down)]
    xd, wd, gate, up, down = leaves[:5]
    out = swiglu_mlp(xd, *leaves[5:])
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e >= 0:
                out[t] = out[t] + swiglu_mlp(wd[t, k] * xd[t:t + 1], gate[e], up[e], down[e])[0]
    out.backward(dout.double())
    return out.detach(), {n: t.grad for n, t in zip(NAMES, leaves, strict=True)}


def reference_run(inputs, *, precision="float64", mxfp8=False, routing_scale="input"):
    x, ids, weights, routed, shared, dout = inputs
    routed = routed.to_mxfp8() if mxfp8 else routed
    out, ctx = reference.forward(x, ids, weights, routed, shared, precision=precision, routing_scale=routing_scale)
    return out, reference.backward(ctx, dout)._asdict()


def wide_inputs(T, E, K):
    """make_inputs with weights spread over [0.1, 3]: the scaled rows differ from x by factors of up to 30, so a
    path that applied w_k on the output instead (or not at all) is off by order 1, and the expert's nonlinearity
    sees it (silu is not homogeneous)."""
    x, ids, _, routed, shared, dout = make_inputs(T, E, K)
    weights = torch.rand(T, K) * 2.9 + 0.1
    return x, ids, weights, routed, shared, dout


def test_oracle_against_llama4_formula(seed):
    inputs = wide_inputs(12, 4, 2)
    # Both float64, the same formula, different summation orders: float64 rounding (1e-12 is ~2^-40).
    compare(reference_run(inputs), autograd_float64(*inputs), 1e-12, "oracle vs Llama4 formula")


@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
def test_bf16_paths_against_oracle(seed, mode):
    inputs = wide_inputs(40, 6, 3)
    compare(reference_run(inputs, precision="bf16", mxfp8=mode == "mxfp8"), reference_run(inputs), TOL[mode],
            f"{mode} vs oracle")


def test_input_scale_differs_from_output_scale(seed):
    """The two scales give different layers by many TOL["bf16"] in out, dx and dtopk_weights, so the tests here
    fail on a path that ignores routing_scale."""
    inputs = wide_inputs(40, 6, 3)
    a_out, a = reference_run(inputs)
    b_out, b = reference_run(inputs, routing_scale="output")
    for what, p, q in (("out", a_out, b_out), ("dx", a["x"], b["x"]), ("dw", a["topk_weights"], b["topk_weights"])):
        assert float((p - q).norm() / q.norm()) > 5 * TOL["bf16"], what


def moe_run(inputs, *, backend, mxfp8=False, group=None, keep_context=True, shared=True):
    """(out, {name: grad}) from mok.moe with routing_scale="input" and autograd (x, topk_weights, every weight)."""
    x, ids, weights, routed, shared_expert, dout = inputs
    shared_expert = shared_expert if shared else None
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down)]
    if shared_expert is not None:
        leaves += [t.detach().clone().requires_grad_(True)
                   for t in (shared_expert.gate, shared_expert.up, shared_expert.down)]
    r = RoutedExperts(*leaves[2:5])
    s = SharedExpert(*leaves[5:]) if shared_expert is not None else None
    out = mok.moe(leaves[0], ids, leaves[1], r.to_mxfp8() if mxfp8 else r, s, backend=backend, group=group,
                  keep_context=keep_context, routing_scale="input")
    out.backward(dout)
    return out.detach(), {n: t.grad for n, t in zip(NAMES, leaves, strict=False)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
@pytest.mark.parametrize("keep_context", [True, False])
def test_moe_against_oracle(seed, backend, mode, keep_context):
    # keep_context=False: the backward op recomputes the context (libmok's mokLayerRecomputeWeighted on host).
    inputs = wide_inputs(40, 6, 3)
    got = moe_run(inputs, backend=backend, mxfp8=mode == "mxfp8", keep_context=keep_context)
    compare(got, reference_run(inputs), TOL[mode], f"{backend} {mode} keep_context {keep_context} vs oracle")


@needs_host
@pytest.mark.parametrize("mxfp8", [False, True])
def test_host_and_reference_agree(seed, mxfp8):
    # Both round at the same points (bf16(w_k x), the stored y_k, dx_k), so only fp32 summation orders differ.
    inputs = wide_inputs(40, 6, 3)
    host = moe_run(inputs, backend="host", mxfp8=mxfp8)
    ref = moe_run(inputs, backend="reference", mxfp8=mxfp8)
    assert_close_bf16(host, ref, f"seed {seed}, mxfp8 {mxfp8}")


@needs_host
def test_recompute_equals_kept_context_bitwise(seed):
    """The recomputed context (host: mokLayerRecomputeWeighted) is bitwise the forward's: the same gradients."""
    inputs = wide_inputs(40, 6, 3)
    kept = moe_run(inputs, backend="host")
    recomputed = moe_run(inputs, backend="host", keep_context=False)
    assert torch.equal(kept[0], recomputed[0])
    for name in NAMES:
        assert torch.equal(kept[1][name], recomputed[1][name]), name


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_workspace_both_scales(seed, backend):
    """One explicit workspace, calls with either scale in turn: each runs its own math (the host executor keys its
    libmok layer by routing_scale too)."""
    x, ids, weights, routed, shared, _ = wide_inputs(24, 4, 2)
    ws = functional.create_workspace(max_tokens=24, hidden=x.shape[1], topk=2, num_local_experts=4,
                                     intermediate=routed.intermediate_size,
                                     shared_intermediate=shared.intermediate_size, backend=backend)
    for scale in ("input", "output", "input"):
        out, _ = functional.forward(x, ids, weights, routed, shared, workspace=ws, backend=backend,
                                    routing_scale=scale, need_context=False)
        want, _ = reference.forward(x, ids, weights, routed, shared, precision="float64", routing_scale=scale)
        err = float((out.double() - want).norm() / want.norm())
        assert err <= TOL["bf16"], f"{backend} {scale}: relative error {err:.3g}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_nn_moe_routing_scale(seed, backend):
    module = mok.nn.MoE(64, 32, 4, 2, shared_intermediate=16, score="sigmoid", routing_scale="input",
                        backend=backend)
    x = torch.randn(20, 64).to(torch.bfloat16)
    routing = module.route(x)
    out = module(x)
    routed = RoutedExperts(module.gate.detach(), module.up.detach(), module.down.detach())
    shared = SharedExpert(module.shared_gate.detach(), module.shared_up.detach(), module.shared_down.detach())
    want, _ = reference.forward(x, routing.ids, routing.weights.detach(), routed, shared, precision="float64",
                                routing_scale="input")
    assert float((out.detach().double() - want).norm() / want.norm()) <= TOL["bf16"]


BAD = [("inputs", ValueError, 'routing_scale must be "output" or "input", got \'inputs\''),
       (1, TypeError, 'routing_scale must be "output" or "input", got int'),
       (None, TypeError, 'routing_scale must be "output" or "input", got NoneType')]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("bad", "kind", "message"), BAD)
def test_bad_routing_scale_is_rejected(backend, bad, kind, message):
    x, ids, weights, routed, shared, _ = make_inputs(4, 2, 1)
    with pytest.raises(kind, match=re.escape(message)):
        mok.moe(x, ids, weights, routed, shared, backend=backend, routing_scale=bad)
    with pytest.raises(kind, match=re.escape(message)):
        functional.forward(x, ids, weights, routed, shared, backend=backend, routing_scale=bad)
    with pytest.raises(kind, match=re.escape(message)):
        mok.nn.MoE(16, 8, 2, 1, routing_scale=bad)


# Two gloo ranks, each with half the tokens and half the experts: the one-process run's rows, bitwise (both
# executors fix their reduction orders, see test_ep / test_host_backend).
def two_rank_worker(rank, world, seed, backend, mxfp8):
    torch.manual_seed(seed)
    x, ids, weights, routed, _, dout = wide_inputs(24, 4, 2)
    tokens, experts = halves(rank)
    mine = RoutedExperts(routed.gate[experts], routed.up[experts], routed.down[experts])
    return moe_run((x[tokens], ids[tokens], weights[tokens], mine, None, dout[tokens]), backend=backend, mxfp8=mxfp8,
                   group=ep_group(), shared=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mxfp8", [False, True])
def test_two_ranks_equal_one_process(seed, backend, mxfp8):
    torch.manual_seed(seed)
    x, ids, weights, routed, _, dout = wide_inputs(24, 4, 2)
    alone_out, alone = moe_run((x, ids, weights, routed, None, dout), backend=backend, mxfp8=mxfp8, shared=False)
    assert_ranks_equal_one_process(run_group(2, two_rank_worker, seed, backend, mxfp8), alone_out, alone)
