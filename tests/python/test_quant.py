"""mok.quant against an independent scalar MXFP8 codec written here with exact (Fraction) arithmetic.

The scalar codec decodes e4m3 by its bit formula, finds the scale by counting powers of two, and rounds by
comparing exact distances to the neighbouring e4m3 values, so it shares no code or trick with mok.quant.
"""

import math
from bisect import bisect_left
from fractions import Fraction
from itertools import pairwise

import pytest
import torch

from mok.quant import (
    MXFP8Tensor,
    e8m0_exponent,
    encode_e4m3,
    mxfp8_dequantize,
    mxfp8_quantize,
    scale_offsets,
)

# ---------------------------------------------------------------------------------------------------------------
# The scalar codec


def decode_e4m3(code: int):
    """Value of an e4m3fn byte (None for NaN): sign, 4 exponent bits (bias 7), 3 mantissa bits, no infinities."""
    sign = -1 if code & 0x80 else 1
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 15 and mantissa == 7:
        return None
    if exponent == 0:
        return sign * Fraction(mantissa, 8) * Fraction(2) ** -6
    return sign * (1 + Fraction(mantissa, 8)) * Fraction(2) ** (exponent - 7)


POSITIVE = [decode_e4m3(c) for c in range(0x7F)]  # codes 0..126 are the finite non-negative values, increasing


def encode_scalar(value: Fraction, negative: bool) -> int:
    """Nearest e4m3 code to |value| saturated at 448, ties to the even code (mantissa LSB 0)."""
    magnitude = min(abs(value), Fraction(448))
    i = bisect_left(POSITIVE, magnitude)
    if POSITIVE[i] == magnitude:
        code = i
    else:
        below, above = magnitude - POSITIVE[i - 1], POSITIVE[i] - magnitude
        code = i - 1 if below < above or (below == above and (i - 1) % 2 == 0) else i
    return code | (0x80 if negative else 0)


def scale_exponent_scalar(amax: Fraction) -> int:
    """Smallest e in [-127, 127] with amax / 2^e <= 448 (amax = 0: -127), by counting."""
    e = -127
    while e < 127 and amax / Fraction(2) ** e > 448:
        e += 1
    return e


def quantize_row_scalar(row):
    """(codes, exponents) of a list of floats: blocks of 32, the last one partial."""
    codes, exponents = [], []
    for start in range(0, len(row), 32):
        block = row[start : start + 32]
        e = scale_exponent_scalar(max(abs(Fraction(v)) for v in block))
        exponents.append(e)
        codes += [encode_scalar(Fraction(v) / Fraction(2) ** e, math.copysign(1, v) < 0) for v in block]
    return codes, exponents


def assert_matches_scalar(source: torch.Tensor, q: MXFP8Tensor):
    """Every byte of q (data and scales) equals the scalar codec's, row by row of q's stored orientation, and
    q dequantises (in float64) to exactly decode(code) * 2^e."""
    rows = source.float().reshape(-1, source.shape[-1]).tolist()
    codes = q.data.view(torch.uint8).reshape(len(rows), -1).tolist()
    scales = q.block_scales().reshape(len(rows), -1).tolist()
    values = q.dequantize(torch.float64).reshape(len(rows), -1).tolist()
    for r, row in enumerate(rows):
        want_codes, want_exponents = quantize_row_scalar(row)
        assert scales[r] == [e + 127 for e in want_exponents], f"scales of row {r}"
        assert codes[r] == want_codes, f"codes of row {r}"
        want_values = [decode_e4m3(c) * Fraction(2) ** want_exponents[j // 32] for j, c in enumerate(want_codes)]
        assert values[r] == [float(v) for v in want_values], f"dequantised row {r}"


def pow2(k: int) -> float:
    return math.ldexp(1.0, k)


def sm100_bytes(rows: int, cols: int) -> int:
    """Bytes of a [rows, cols] matrix's scales in the SM100 layout: 128-row x 4-block tiles of 512 bytes."""
    return math.ceil(rows / 128) * math.ceil(math.ceil(cols / 32) / 4) * 512


def sm100_offset(r: int, b: int, k_tiles: int) -> int:
    """docs/mxfp8.md's formula, written out again (not mok.quant's): the byte of row r's k block b."""
    return ((r // 128) * k_tiles + b // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + b % 4


# ---------------------------------------------------------------------------------------------------------------
# e4m3


def test_all_256_codes_decode_by_the_bit_formula():
    decoded = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double().tolist()
    for code, got in enumerate(decoded):
        want = decode_e4m3(code)
        if want is None:
            assert math.isnan(got), f"code {code:#04x} must be NaN"
        else:
            assert got == want, f"code {code:#04x}"


def e4m3_grid():
    """Every finite e4m3 value, every midpoint between neighbours (a tie), and the fp32 values just beside each
    midpoint, both signs, plus values beyond 448 that must saturate."""
    values = [float(v) for v in POSITIVE]
    for lo, hi in pairwise(POSITIVE):
        mid = float((lo + hi) / 2)  # exact in fp32: one bit more than e4m3 has
        values += [mid, math.nextafter(mid, 0.0), math.nextafter(mid, math.inf)]
    values += [449.0, 464.0, 480.0, 1e6, 3e38]
    values = [float(torch.tensor(v, dtype=torch.float32)) for v in values]
    return values + [-v for v in values]


def test_encode_rounds_to_nearest_even_and_saturates():
    values = e4m3_grid()
    got = encode_e4m3(torch.tensor(values, dtype=torch.float32)).view(torch.uint8).tolist()
    want = [encode_scalar(Fraction(v), math.copysign(1, v) < 0) for v in values]
    assert got == want


def test_quantize_every_e4m3_value_and_tie_at_unit_scale():
    # A leading 448 in every block fixes the scale at 2^0, so the codes are the plain e4m3 rounding of the values.
    values = e4m3_grid()
    values = [v for v in values if abs(v) <= 448]
    per_row = 31
    rows = [[448.0] + values[i : i + per_row] for i in range(0, len(values), per_row)]
    rows[-1] += [448.0] * (32 - len(rows[-1]))
    t = torch.tensor(rows, dtype=torch.float32)
    q = mxfp8_quantize(t, colwise=False).rowwise
    assert q.scales.unique().tolist() == [127]
    assert_matches_scalar(t, q)


# ---------------------------------------------------------------------------------------------------------------
# e8m0 scales


def amax_edges():
    """amax 0, the smallest subnormals, every power of two in fp32's range, 448 * 2^k and its fp32 neighbours,
    and the largest finite bf16 and fp32."""
    edges = [0.0, pow2(-149), pow2(-133), 3 * pow2(-149)]
    edges += [pow2(k) for k in range(-149, 128)]
    for k in range(-140, 120):
        v = 448.0 * pow2(k)
        edges += [v, math.nextafter(v, 0.0), math.nextafter(v, math.inf)]
    edges += [float(torch.finfo(torch.bfloat16).max), float(torch.finfo(torch.float32).max)]
    return [float(torch.tensor(v, dtype=torch.float32)) for v in edges]


def test_scale_exponent_is_exact_at_every_edge():
    edges = amax_edges()
    got = e8m0_exponent(torch.tensor(edges, dtype=torch.float32)).tolist()
    want = [scale_exponent_scalar(Fraction(v)) for v in edges]
    assert got == want


def test_quantized_blocks_match_scalar_at_scale_edges(seed):
    # Each block: one amax edge (sign random) and 31 random smaller values, so each block exercises its own scale.
    edges = torch.tensor(amax_edges(), dtype=torch.float32)
    t = edges[:, None] * torch.rand(len(edges), 32) * torch.randn(len(edges), 32).sign()
    t[:, 0] = edges * torch.randn(len(edges)).sign()
    q = mxfp8_quantize(t, colwise=False).rowwise
    assert_matches_scalar(t, q)


def test_values_that_round_to_448_and_saturation(seed):
    # Block maxima just under 448 * 2^k keep the scale 2^k and round up to the top code 448 (0x7E): 432 is the tie
    # between 416 and 448 and goes to 448 by even mantissa. Past 448 the encoder saturates instead of giving NaN.
    k = int(torch.randint(-60, 60, ()))
    top = torch.tensor([432.0, 440.0, 447.0, 448.0]) * 2.0**k
    t = torch.cat([top[:, None], torch.rand(4, 31) * 2.0**k], dim=1)
    q = mxfp8_quantize(t, colwise=False).rowwise
    assert q.block_scales()[:, 0].tolist() == [127 + k] * 4
    assert q.data.view(torch.uint8)[:, 0].tolist() == [0x7E] * 4
    saturated = encode_e4m3(torch.tensor([449.0, 480.0, 1e30, math.inf, -math.inf])).view(torch.uint8)
    assert saturated.tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0xFE]


def test_amax_zero_block_gets_smallest_scale():
    q = mxfp8_quantize(torch.zeros(2, 40, dtype=torch.bfloat16)).rowwise
    assert q.block_scales().tolist() == [[0, 0], [0, 0]]  # e = -127
    assert q.dequantize().abs().sum() == 0


# ---------------------------------------------------------------------------------------------------------------
# Whole tensors, both orientations, partial blocks


def random_source(shape, dtype, seed_offset=0):
    """Random values whose magnitude varies by block-sized runs over 2^-40 .. 2^40, with a sprinkling of
    subnormal-range and exactly-zero entries, so blocks see very different scales."""
    t = torch.randn(shape) * torch.exp2(torch.randint(-40, 40, shape[:-1] + (1,)).float())
    t = t * (torch.rand(shape) > 0.05)  # some exact zeros inside blocks
    return t.to(dtype)


@pytest.mark.parametrize("shape", [(3, 70), (2, 4, 33), (5, 32), (1, 1)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_random_tensors_match_scalar_in_both_orientations(seed, shape, dtype):
    t = random_source(shape, dtype)
    pair = mxfp8_quantize(t)
    m, n = shape[-2:]
    assert pair.rowwise.data.shape == shape and not pair.rowwise.transposed
    assert pair.rowwise.scales.shape == (*shape[:-2], sm100_bytes(m, n))
    assert pair.colwise.data.shape == (*shape[:-2], n, m) and pair.colwise.transposed
    assert pair.colwise.scales.shape == (*shape[:-2], sm100_bytes(n, m))
    assert pair.colwise.data.is_contiguous()
    assert_matches_scalar(t, pair.rowwise)
    assert_matches_scalar(t.transpose(-1, -2), pair.colwise)


def test_partial_last_block_takes_its_own_scale(seed):
    # 40 columns: a full block of large values and a partial block of 8 small ones that must keep their precision.
    t = torch.cat([torch.rand(2, 32) * 1000 + 1, torch.rand(2, 8) * 1e-3 + 1e-4], dim=1)
    q = mxfp8_quantize(t, colwise=False).rowwise
    small = q.dequantize()[:, 32:]
    assert ((small - t[:, 32:]).abs() <= t[:, 32:].abs() * 2.0**-4).all()  # e4m3: half an ulp = 2^-4 relative
    assert_matches_scalar(t, q)


def test_dequantize_is_exact_decode_times_scale(seed):
    t = random_source((4, 70), torch.bfloat16)
    for q in mxfp8_quantize(t):
        got = mxfp8_dequantize(q, torch.float64).reshape(q.data.shape[0], -1).tolist()
        codes = q.data.view(torch.uint8).tolist()
        scales = q.block_scales().tolist()
        for r, row in enumerate(codes):
            want = [float(decode_e4m3(c) * Fraction(2) ** (scales[r][j // 32] - 127)) for j, c in enumerate(row)]
            assert got[r] == want
        assert torch.equal(q.dequantize(), mxfp8_dequantize(q, torch.float64).float())


def test_round_trip_is_exact_for_representable_blocks(seed):
    # Blocks of e4m3 values times one power of two per block come back bit for bit.
    codes = torch.randint(0, 0x7F, (6, 64), dtype=torch.uint8) | (torch.randint(0, 2, (6, 64), dtype=torch.uint8) << 7)
    values = codes.view(torch.float8_e4m3fn).float()
    k = torch.randint(-100, 100, (6, 2, 1)).float()
    t = (values.reshape(6, 2, 32) * torch.exp2(k)).reshape(6, 64)
    pair = mxfp8_quantize(t, colwise=False)
    assert torch.equal(pair.rowwise.dequantize(), t)


def test_round_trip_error_is_at_most_half_an_ulp(seed):
    t = random_source((8, 96), torch.float32)
    q = mxfp8_quantize(t, colwise=False).rowwise
    s = torch.exp2(q.block_scales().float() - 127).repeat_interleave(32, dim=1)
    # Normal e4m3 range: half an ulp is 2^-4 of the value; subnormal range: half of 2^-9, times the scale.
    bound = torch.maximum(t.abs() * 2.0**-4, s * 2.0**-10)
    assert ((q.dequantize() - t).abs() <= bound).all()


def test_largest_bf16_dequantizes_exactly_in_float64():
    # Documented edge: bf16's max rounds up to 256 * 2^120 = 2^128, past float32's largest finite.
    t = torch.full((1, 32), torch.finfo(torch.bfloat16).max, dtype=torch.bfloat16)
    q = mxfp8_quantize(t, colwise=False).rowwise
    assert q.dequantize(torch.float64)[0, 0].item() == 2.0**128
    assert q.dequantize()[0, 0].item() == math.inf


def test_empty_rows_quantize_to_empty_forms():
    pair = mxfp8_quantize(torch.zeros(0, 64, dtype=torch.bfloat16))
    assert pair.rowwise.data.shape == (0, 64) and pair.rowwise.scales.shape == (0,)  # no row tile
    assert pair.colwise.data.shape == (64, 0) and pair.colwise.scales.shape == (0,)  # no k block
    assert pair.rowwise.block_scales().shape == (0, 2) and pair.colwise.block_scales().shape == (64, 0)


def test_batched_form_indexes_per_expert(seed):
    t = random_source((3, 40, 70), torch.bfloat16)
    pair = mxfp8_quantize(t)
    for e in range(3):
        one = mxfp8_quantize(t[e])
        for a, b in zip(pair.expert(e), one, strict=True):
            assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))
            assert torch.equal(a.scales, b.scales) and a.transposed == b.transposed


# ---------------------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_nan_and_inf_are_rejected_naming_the_argument(seed, bad, dtype):
    t = torch.randn(4, 40, dtype=dtype)
    t[torch.randint(0, 4, ()), torch.randint(0, 40, ())] = bad
    with pytest.raises(ValueError, match="activations contains NaN or Inf"):
        mxfp8_quantize(t, name="activations")


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(TypeError, match="t must be bfloat16 or float32"):
        mxfp8_quantize(torch.ones(4, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"t must be 2-D \[M, N\] or 3-D"):
        mxfp8_quantize(torch.ones(4))
    with pytest.raises(ValueError, match=r"t must be 2-D \[M, N\] or 3-D"):
        mxfp8_quantize(torch.ones(2, 2, 2, 2))
    with pytest.raises(ValueError, match="at least one of rowwise, colwise"):
        mxfp8_quantize(torch.ones(4, 4), rowwise=False, colwise=False)
    with pytest.raises(TypeError, match="q must be an MXFP8Tensor"):
        mxfp8_dequantize(torch.ones(4, 4))
    q = mxfp8_quantize(torch.ones(4, 4), colwise=False).rowwise
    with pytest.raises(TypeError, match="dtype must be torch.float32 or torch.float64"):
        q.dequantize(torch.bfloat16)
    with pytest.raises(ValueError, match=r"scales must have shape \(512,\) .* SM100 block-scaled layout"):
        MXFP8Tensor(q.data, torch.zeros(4, 2, dtype=torch.uint8), False)
    with pytest.raises(TypeError, match="scales must be torch.uint8"):
        MXFP8Tensor(q.data, q.scales.int(), False)


# ---------------------------------------------------------------------------------------------------------------
# The SM100 scale layout


@pytest.mark.parametrize("shape", [(2, 300, 200), (1, 128, 256), (3, 40, 33)])
def test_scales_sit_in_the_sm100_layout_with_finite_padding(seed, shape):
    # Per-row and per-block scales spanning 2^+-40 give every (row, block) its own scale byte, so a scale read
    # from the wrong byte (strides swapped, row-major indexing, a tile counted along the wrong dim) differs.
    t = random_source(shape, torch.float32) * torch.exp2(torch.randint(-40, 40, (shape[-2], 1)).float())
    for q, source in zip(mxfp8_quantize(t), (t, t.transpose(-1, -2)), strict=True):
        batch, rows, cols = q.data.shape
        nb, size = -(-cols // 32), sm100_bytes(rows, cols)
        k_tiles = -(-nb // 4)
        assert q.scales.shape == (batch, size)
        flat = q.scales.tolist()
        for e in range(batch):
            want = {}
            for r, row in enumerate(source[e].tolist()):
                for b, exponent in enumerate(quantize_row_scalar(row)[1]):
                    want[sm100_offset(r, b, k_tiles)] = exponent + 127
            assert len(want) == rows * nb  # the formula is one to one
            got = {i: flat[e][i] for i in want}
            assert got == want, f"expert {e}: scales out of place"
            padding = [flat[e][i] for i in range(size) if i not in want]
            assert padding == [127] * (size - rows * nb), "padding scales must be 2^0"
        # scale_offsets agrees with the formula, and block_scales reads the layout back.
        offsets = [[sm100_offset(r, b, k_tiles) for b in range(nb)] for r in range(rows)]
        assert scale_offsets(rows, cols).tolist() == offsets
        assert torch.equal(q.block_scales(), q.scales[:, torch.tensor(offsets)])


def test_hand_computed_offsets():
    # [300, 200]: 3 row tiles, 7 k blocks in 2 k tiles. (130, 5): tile 1 * 2 + 1 = 3, row 130 = 4 * 32 + 2.
    assert scale_offsets(300, 200)[130, 5].item() == 3 * 512 + 2 * 16 + 0 * 4 + 1
    assert scale_offsets(300, 200)[95, 2].item() == 0 * 512 + 31 * 16 + 2 * 4 + 2
    assert sm100_bytes(300, 200) == 3 * 2 * 512


def test_row_major_scales_are_rejected_saying_which_layout(seed):
    pair = mxfp8_quantize(random_source((2, 40, 70), torch.bfloat16))
    q = pair.rowwise
    old = q.block_scales()  # [2, 40, 3]: the row-major layout mok.quant used to return
    with pytest.raises(ValueError, match=r"scales must have shape \(2, 512\) .* SM100 block-scaled layout.* "
                                         r"row-major \[\.\., R, ceil\(C/32\)\] layout, which is not accepted"):
        MXFP8Tensor(q.data, old, False)
    with pytest.raises(ValueError, match="SM100 block-scaled layout"):
        MXFP8Tensor(q.data[0], old[0], False)
