"""NaN propagates (docs/semantics.md, "NaN"): a NaN in x or dout gives NaN exactly where IEEE arithmetic puts it, in
the reference and in the host executor alike, with and without the SwiGLU clamp, the shared expert and MXFP8; an
MXFP8 activation block that holds a NaN or an Inf becomes NaN as a whole. Weights are still checked: mxfp8_quantize
rejects NaN (test_quant.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from mok import functional
from mok import reference as ref
from mok.experts import RoutedExperts, SharedExpert
from mok.quant import MXFP8Tensor, mxfp8_dequantize, mxfp8_fake_quantize, mxfp8_quantize, scale_offsets

H, INTER, I_SHARED, E, T, K = 64, 40, 48, 8, 40, 2
GRADS = ("x", "topk_weights", "gate", "up", "down", "shared_gate", "shared_up", "shared_down")
# Small rows per segment and ring, so the host executor's ring wraps and several minibatches run.
CONFIG = functional.MoKConfig(expert_padding=32, minibatch_size=64, macrobatch_size=128, wait_timeout_s=60.0)


def problem(shared: bool):
    """Fresh random inputs (g, u and y of order 1) with every route used; 8 experts, so some see no NaN row."""

    def bf16(*shape, scale=1.0):
        return (torch.randn(*shape) * scale).bfloat16()

    x, dout = bf16(T, H), bf16(T, H)
    ids = torch.randint(0, E, (T, K), dtype=torch.int32)
    weights = torch.rand(T, K)
    routed = RoutedExperts(bf16(E, INTER, H, scale=H**-0.5), bf16(E, INTER, H, scale=H**-0.5),
                           bf16(E, H, INTER, scale=INTER**-0.5))
    sh = SharedExpert(bf16(I_SHARED, H, scale=H**-0.5), bf16(I_SHARED, H, scale=H**-0.5),
                      bf16(H, I_SHARED, scale=I_SHARED**-0.5)) if shared else None
    return x, ids, weights, routed, sh, dout


def run(backend, x, ids, weights, routed, shared, dout, *, mxfp8, limit):
    routed = routed.to_mxfp8() if mxfp8 else routed
    out, ctx = functional.forward(x, ids, weights, routed, shared, config=CONFIG, backend=backend, swiglu_limit=limit)
    grads = functional.backward(ctx, dout)
    return out, {n: getattr(grads, n) for n in GRADS}


def plant_nan(t: torch.Tensor) -> int:
    """One NaN in a random element of a random row; returns the row."""
    row = int(torch.randint(0, t.shape[0], ()))
    t[row, int(torch.randint(0, t.shape[1], ()))] = math.nan
    return row


# ---------------------------------------------------------------------------------------------------------------
# Building blocks


@pytest.mark.parametrize("limit", [None, 0.5, 2.0])
def test_swiglu_propagates_nan_in_g_u_and_dh(seed, limit):
    g, u, dh = (torch.randn(300) * 2 for _ in range(3))
    which = torch.arange(300) % 3  # NaN in g, u, dh in turn
    g[which == 0], u[which == 1], dh[which == 2] = math.nan, math.nan, math.nan
    h = ref.swiglu(g, u, limit)
    dg, du = ref.swiglu_backward(g, u, dh, limit)
    L = math.inf if limit is None else limit
    g_stopped, u_stopped = g > L, (u > L) | (u < -L)  # False at a NaN: a NaN is never clamped
    assert torch.equal(h.isnan(), which != 2)
    # A gradient the clamp stops is 0 whatever dh is (torch.where); any other is NaN where a NaN enters it.
    assert torch.equal(dg.isnan(), ~g_stopped) and bool((dg[g_stopped] == 0).all())
    assert torch.equal(du.isnan(), ~u_stopped & (which != 1)) and bool((du[u_stopped] == 0).all())


def test_mxfp8_block_with_nan_or_inf_is_nan_in_layer(seed):
    t = torch.randn(6, 70).bfloat16()
    t[1, 40], t[3, 5], t[4, 69] = math.nan, math.inf, -math.inf  # blocks (1, 1), (3, 0), (4, 2)
    got = mxfp8_fake_quantize(t, nonfinite="nan")
    clean = t.clone()
    clean[1, 40] = clean[3, 5] = clean[4, 69] = 0
    want = mxfp8_fake_quantize(clean)
    bad = torch.zeros(6, 70, dtype=torch.bool)
    bad[1, 32:64], bad[3, 0:32], bad[4, 64:70] = True, True, True
    assert torch.equal(got.isnan(), bad)
    assert torch.equal(got[~bad], want[~bad])  # every other block exactly as without the bad element
    with pytest.raises(ValueError, match="t contains NaN or Inf"):  # the default, as for weights
        mxfp8_fake_quantize(t)


def test_dequantized_nan_scale_is_a_nan_block(seed):
    # A caller's MXFP8 data may carry e8m0's NaN scale 255: the block decodes to NaN (2^128 would give inf, or
    # NaN only where the code is 0), as the core's e8m0_decode does; other blocks are unchanged.
    q = mxfp8_quantize(torch.randn(4, 70), colwise=False).rowwise
    scales = q.scales.clone()
    scales[scale_offsets(4, 70)[2, 1]] = 255  # row 2's second block, in the SM100 layout
    got = mxfp8_dequantize(MXFP8Tensor(q.data, scales, q.transposed))
    bad = torch.zeros(4, 70, dtype=torch.bool)
    bad[2, 32:64] = True
    assert torch.equal(got.isnan(), bad)
    assert torch.equal(got[~bad], q.dequantize()[~bad])


# ---------------------------------------------------------------------------------------------------------------
# The layer


def nan_rows(t: torch.Tensor) -> torch.Tensor:
    """Per leading index (token, expert), whether anything in it is NaN."""
    return t.isnan().reshape(t.shape[0], -1).any(dim=1)


@pytest.mark.parametrize("shared", [False, True], ids=["no_shared", "shared"])
@pytest.mark.parametrize("limit", [None, 0.5], ids=["no_clamp", "clamp"])
@pytest.mark.parametrize("mxfp8", [False, True], ids=["bf16", "mxfp8"])
def test_reference_nan_in_x_reaches_everything_its_token_touches(seed, mxfp8, limit, shared):
    # x[t, c] = NaN makes g, u and h of each of t's rows NaN in full (every GEMM output sums the NaN), hence y_k,
    # out_t, dtopk_weights[t], dg, du (never clamped: a NaN is not > L), dx_t, and every weight gradient of an
    # expert t reaches (each element sums a NaN row times a finite one). Nothing else.
    x, ids, weights, routed, sh, dout = problem(shared)
    t = plant_nan(x)
    out, grads = run("reference", x, ids, weights, routed, sh, dout, mxfp8=mxfp8, limit=limit)
    token = torch.arange(T) == t
    touched = torch.zeros(E, dtype=torch.bool)
    touched[ids[t].long()] = True
    assert torch.equal(out.isnan(), token[:, None].expand(T, H)), "out"
    assert torch.equal(grads["x"].isnan(), token[:, None].expand(T, H)), "dx"
    assert torch.equal(grads["topk_weights"].isnan(), token[:, None].expand(T, K)), "dtopk_weights"
    for n in ("gate", "up", "down"):
        assert torch.equal(grads[n].isnan(), touched[:, None, None].expand_as(grads[n])), n
    for n in ("shared_gate", "shared_up", "shared_down"):
        assert (grads[n] is None) if not shared else bool(grads[n].isnan().all()), n
    assert not any(g.isinf().any() for g in grads.values() if g is not None) and not out.isinf().any()
    # mok.reference's own forward/backward (the oracle the backend's per-expert calls are checked with) agrees.
    direct_out, ctx = ref.forward(x, ids, weights, routed.to_mxfp8() if mxfp8 else routed, sh, swiglu_limit=limit)
    direct = ref.backward(ctx, dout)
    assert torch.equal(direct_out.isnan(), out.isnan())
    for n in GRADS:
        assert (grads[n] is None) or torch.equal(getattr(direct, n).isnan(), grads[n].isnan()), n


@pytest.mark.parametrize("limit", [None, 0.5], ids=["no_clamp", "clamp"])
@pytest.mark.parametrize("mxfp8", [False, True], ids=["bf16", "mxfp8"])
def test_reference_nan_in_dout_reaches_the_gradients_of_its_token(seed, mxfp8, limit):
    # dout[t, c] = NaN: dtopk_weights[t] and dx_t are NaN, out is not; in the experts t reaches, dW_down's row c is
    # NaN (dy[., c] is, and only it), and dW_gate, dW_up have NaN rows except where t's g, u were clamped (0 there).
    x, ids, weights, routed, sh, dout = problem(True)
    t = plant_nan(dout)
    c = int(dout[t].isnan().nonzero())
    out, grads = run("reference", x, ids, weights, routed, sh, dout, mxfp8=mxfp8, limit=limit)
    token = torch.arange(T) == t
    touched = torch.zeros(E, dtype=torch.bool)
    touched[ids[t].long()] = True
    assert not out.isnan().any()
    assert torch.equal(grads["x"].isnan(), token[:, None].expand(T, H)), "dx"
    assert torch.equal(grads["topk_weights"].isnan(), token[:, None].expand(T, K)), "dtopk_weights"
    row_c = torch.arange(H) == c
    assert torch.equal(grads["down"].isnan(), (touched[:, None, None] & row_c[None, :, None]).expand(E, H, INTER))
    assert torch.equal(grads["shared_down"].isnan(), row_c[:, None].expand(H, I_SHARED))
    for n in ("gate", "up"):
        assert torch.equal(nan_rows(grads[n]), touched), n
        if limit is None:  # nothing is clamped: all of each touched expert's gradient
            assert torch.equal(grads[n].isnan(), touched[:, None, None].expand_as(grads[n])), n


@pytest.mark.parametrize("where", ["x", "dout"])
@pytest.mark.parametrize("shared", [False, True], ids=["no_shared", "shared"])
@pytest.mark.parametrize("limit", [None, 0.5], ids=["no_clamp", "clamp"])
@pytest.mark.parametrize("mxfp8", [False, True], ids=["bf16", "mxfp8"])
def test_host_gives_nan_where_the_reference_does(seed, mxfp8, limit, shared, where):
    x, ids, weights, routed, sh, dout = problem(shared)
    plant_nan(x if where == "x" else dout)
    plant_nan(x if where == "x" else dout)  # a second row: one NaN must not hide another's
    args = (x, ids, weights, routed, sh, dout)
    out_h, grads_h = run("host", *args, mxfp8=mxfp8, limit=limit)
    out_r, grads_r = run("reference", *args, mxfp8=mxfp8, limit=limit)
    assert out_r.isnan().any() == (where == "x")  # the NaN reached the math (nothing to compare otherwise)
    # NaN positions equal; finite values as in test_host_backend: one bf16 rounding step (2^-8) on values whose
    # fp32 sums differ only in order, two for gradients that sum many of them.
    torch.testing.assert_close(out_h.float(), out_r.float(), rtol=2**-7, atol=2**-10, equal_nan=True, msg="out")
    for n in GRADS:
        gh, gr = grads_h[n], grads_r[n]
        assert (gh is None) == (gr is None), n
        if gh is None:
            continue
        assert gr.isnan().any(), n
        finite = gr[~gr.isnan()].float()
        scale = float(finite.abs().amax().clamp(min=1e-3)) if finite.numel() else 1.0
        torch.testing.assert_close(gh.float(), gr.float(), rtol=2**-6, atol=scale * 2**-7, equal_nan=True,
                                   msg=f"gradient {n}")
