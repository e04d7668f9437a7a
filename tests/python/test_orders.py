"""The orders and orientations docs/semantics.md fixes, in mok.reference (the oracle mok.ep and every executor are
held to), made observable: inputs whose per-token scales span 2^+-16 and whose routes cancel (a token sent twice
to one expert with weights w and -w, |w| up to 2^20), so that a sum taken in another order or a block taken along
another dim gives another result.

- combine (out_t and dx_t): bit for bit against a scalar fp32 loop in the documented order (shared term first,
  then k = 0..K-1, each product rounded before it is added);
- MXFP8 weight gradients: their operands are quantised along the tokens (32-row blocks from the segment's first
  row, a partial last block): against float64 sums of operands quantised that way by libmok's own codec, within
  the fp32 summation bound (any summation order is allowed there: the reference's GEMM order is the BLAS's).
"""

from __future__ import annotations

import numpy as np
import torch

from mok import _mok, reference
from mok.experts import RoutedExperts
from mok.quant import mxfp8_fake_quantize, scale_bytes, scale_offsets

F32 = np.float32


def wide_bf16(rows: int, cols: int, low: int = -16, high: int = 16) -> torch.Tensor:
    """Random bf16 [rows, cols], each row scaled by its own 2^[low, high]."""
    scale = 2.0 ** torch.randint(low, high + 1, (rows, 1)).double()
    return (torch.randn(rows, cols, dtype=torch.float64) * scale).to(torch.bfloat16)


def routes(T: int, K: int, E: int):
    """ids with some -1 routes and, on a third of the tokens, k = 0 and k = 1 on one expert; weights of both signs
    spanning 2^+-12, and on those pairs w and -w with |w| in 2^[8, 20]."""
    ids = torch.randint(0, E, (T, K))
    ids = torch.where(torch.rand(T, K) < 0.2, -1, ids)
    weights = torch.rand(T, K).add(0.5) * 2.0 ** torch.randint(-12, 13, (T, K)).float()
    weights = torch.where(torch.rand(T, K) < 0.5, -weights, weights)
    pairs = torch.rand(T) < 1 / 3
    ids[pairs, 0] = ids[pairs, 0].clamp(min=0)
    ids[pairs, 1] = ids[pairs, 0]
    big = torch.rand(T).add(0.5) * 2.0 ** torch.randint(8, 21, (T,)).float()
    weights[pairs, 0], weights[pairs, 1] = big[pairs], -big[pairs]
    return ids, weights, pairs


def combine_scalar(slots, ids, weights, first):
    """The documented per-token sum, one fp32 scalar operation at a time."""
    T, K, H = slots.shape
    s, f = slots.float().numpy(), first.float().numpy()
    w = None if weights is None else weights.numpy()
    out = np.empty((T, H), dtype=F32)
    for t in range(T):
        for h in range(H):
            acc = F32(f[t, h])
            for k in range(K):
                if ids[t, k] >= 0:
                    acc = F32(acc + (s[t, k, h] if w is None else F32(w[t, k] * s[t, k, h])))
            out[t, h] = acc
    return torch.from_numpy(out).to(torch.bfloat16)


def test_combine_shared_first_then_k_in_order_bitwise(seed):
    T, K, H = 48, 4, 24
    ids, weights, pairs = routes(T, K, E=3)
    slots = wide_bf16(T * K, H).reshape(T, K, H)
    slots[pairs, 1] = slots[pairs, 0]  # the pair's terms w * y and -w * y cancel exactly
    first = wide_bf16(T, H)
    for w in (weights, None):  # out_t (weighted), dx_t (w = 1: the pair's dx_k are then equal, not opposite)
        got = reference.combine(slots, ids, w, first)
        want = combine_scalar(slots, ids, w, first)
        differ = (got.float() != want.float()).nonzero()
        count = len(differ)
        assert count == 0, (f"{'out' if w is not None else 'dx'}: {count} of {got.numel()} values "
                                 f"differ; first at {tuple(differ[0].tolist())}: got {got[tuple(differ[0])]}, "
                                 f"want {want[tuple(differ[0])]}")


def along_tokens(t: torch.Tensor) -> torch.Tensor:
    """float64 values of t [R, C] quantised in blocks of 32 rows (libmok's codec, column-wise form [C, R])."""
    t = t.contiguous()
    R, C = t.shape
    data = torch.empty(C, R, dtype=torch.uint8)
    scales = torch.empty(scale_bytes(C, R), dtype=torch.uint8)  # the SM100 layout of the [C, R] form
    row_data, row_scales = torch.empty(R, C, dtype=torch.uint8), torch.empty(scale_bytes(R, C), dtype=torch.uint8)
    _mok.mxfp8_quantize(t.data_ptr(), t.dtype == torch.float32, 1, R, C, row_data.data_ptr(), row_scales.data_ptr(),
                        data.data_ptr(), scales.data_ptr())
    values = data.view(torch.float8_e4m3fn).double()
    blocks = scales[scale_offsets(C, R)]  # [C, ceil(R/32)]
    scale = torch.pow(2.0, blocks.double() - 127).repeat_interleave(32, dim=1)[:, :R]
    return (values * scale).t()


def assert_fp32_sum_of(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor, what: str):
    """got = a^T b summed over the R rows in fp32 (any order): |got - exact| <= gamma_R * sum_r |a_r| |b_r|,
    gamma_R = R u / (1 - R u), u = 2^-24 (a product of MXFP8 values is exact in fp32)."""
    R = a.shape[0]
    u = 2.0 ** -24
    bound = (R * u / (1 - R * u)) * (a.abs().t() @ b.abs())
    error = (got.double() - a.t() @ b).abs()
    worst = (error - bound).argmax()
    within = bool((error <= bound).all())
    assert within, (f"{what}: error {error.flatten()[worst]:.3g} beyond the fp32 bound "
                                          f"{bound.flatten()[worst]:.3g} at flat index {int(worst)}")


def test_mxfp8_weight_gradients_quantise_along_tokens(seed):
    # 45 rows: a full and a partial 32-row block. Tokens span 2^+-16, so a block taken along H (or a row order
    # that moves tokens between blocks) changes the scales every value is quantised with.
    T, H, INTER = 45, 40, 24
    x = wide_bf16(T, H)
    dy = wide_bf16(T, H, -12, 12)
    h = wide_bf16(T, INTER)
    u = wide_bf16(T, INTER)
    g = torch.zeros(T, INTER, dtype=torch.bfloat16)  # a = 0: s = 1/2, dsilu = 1/2, so dg = bf16(dh * b / 2)
    # W_down [H, I] with ones on its diagonal: dh = bf16(dy_q W_down) = dy_q[:, :I] (dy quantised along H), exact.
    down = torch.eye(H, INTER).to(torch.bfloat16)
    gate_up = (torch.randn(INTER, H) * H ** -0.5).to(torch.bfloat16)
    weights = RoutedExperts(gate_up[None], gate_up[None].clone(), down[None]).to_mxfp8().expert(0)
    act = reference.ExpertActivations(g, u, h, None)
    grads = reference.expert_backward(x, weights, act, dy)

    dy_q = mxfp8_fake_quantize(dy).double()  # along H: the dgrad operand (test_codec_agreement)
    dg = (dy_q[:, :INTER] * u.double() * 0.5).to(torch.bfloat16)  # one rounding: dh * b is exact in fp32
    assert_fp32_sum_of(grads.down, along_tokens(dy), along_tokens(h), "dW_down = dy^T h")
    assert_fp32_sum_of(grads.gate, along_tokens(dg), along_tokens(x), "dW_gate = dg^T x")
