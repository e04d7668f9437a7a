"""One MXFP8 codec: mok.quant (torch) and libmok's mokMxfp8Quantize (core/mxfp8.hpp, bound as mok._mok.mxfp8_quantize)
give the same bytes, data and scales, rowwise and colwise, from bf16 and fp32 sources.

The layer quantises weights with either (RoutedExperts.to_mxfp8 uses mok.quant, C callers use mokMxfp8Quantize) and
the reference (mok.reference) emulates activations with mok.quant, so any disagreement is a real bug. Inputs: fresh
random data with per-row and per-column scales spanning 2^+-20, partial last blocks in both directions, every e4m3
code, every rounding tie and its neighbours, every scale exponent from 2^-127 up to the largest an fp32 value
reaches, saturation onto 448, fp32 and bf16 subnormals, zero and negative-zero blocks, float32's largest values.
"""

from __future__ import annotations

import math

import pytest
import torch

from mok import _mok
from mok.quant import mxfp8_fake_quantize, mxfp8_quantize, scale_bytes, scale_offsets


def libmok_quantize(t: torch.Tensor):
    """(rowwise data, rowwise scales, colwise data, colwise scales) as uint8, in mok.quant's layouts: scales
    [*batch, scale_bytes] in the SM100 layout, every byte (padding included) first set to 0xFF, which neither
    codec writes for a finite source, so a byte libmok leaves unwritten shows up as a difference."""
    t = t.contiguous()
    *batch, rows, cols = t.shape
    b = math.prod(batch)
    row_data = torch.empty(*batch, rows, cols, dtype=torch.uint8)
    row_scales = torch.full((*batch, scale_bytes(rows, cols)), 0xFF, dtype=torch.uint8)
    col_data = torch.empty(*batch, cols, rows, dtype=torch.uint8)
    col_scales = torch.full((*batch, scale_bytes(cols, rows)), 0xFF, dtype=torch.uint8)
    _mok.mxfp8_quantize(t.data_ptr(), t.dtype == torch.float32, b, rows, cols, row_data.data_ptr(),
                        row_scales.data_ptr(), col_data.data_ptr(), col_scales.data_ptr())
    return row_data, row_scales, col_data, col_scales


def assert_same_bytes(t: torch.Tensor, what: str):
    """Every byte of both forms agrees; the first differing element is reported with its source value."""
    pair = mxfp8_quantize(t)
    ours = (pair.rowwise.data.view(torch.uint8), pair.rowwise.scales, pair.colwise.data.view(torch.uint8),
            pair.colwise.scales)
    sources = (t, None, t.transpose(-1, -2), None)
    for name, mine, theirs, source in zip(("rowwise data", "rowwise scales", "colwise data", "colwise scales"),
                                          ours, libmok_quantize(t), sources, strict=True):
        assert mine.shape == theirs.shape, f"{what}: {name} shapes {tuple(mine.shape)} vs {tuple(theirs.shape)}"
        differ = (mine != theirs).nonzero()
        if len(differ):
            at = tuple(differ[0].tolist())
            value = "" if source is None else f", source value {source[at].item()!r}"
            pytest.fail(f"{what} ({t.dtype}): {len(differ)} {name} bytes differ; first at {at}: mok.quant "
                        f"{mine[at].item():#04x}, libmok {theirs[at].item():#04x}{value}")


DTYPES = [torch.float32, torch.bfloat16]


def e4m3_values() -> list[float]:
    """Every finite non-negative e4m3 value (codes 0..126), by torch's decoding of the bytes."""
    return torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()


def grid() -> list[float]:
    """Every e4m3 value, every midpoint between neighbours (a tie: exact in bf16 too, one bit more than e4m3),
    and the fp32 values just beside each midpoint; both signs."""
    values = e4m3_values()
    out = list(values)
    for lo, hi in zip(values, values[1:], strict=False):
        mid = (lo + hi) / 2
        out += [mid, math.nextafter(mid, 0.0), math.nextafter(mid, math.inf)]
    out += [447.0, 447.5, 464.0 - 1e-3]  # round onto 448 (464 would be the next step: it is never reached)
    return out + [-v for v in out]


def blocks_at_scale(values: list[float], e: int, dtype) -> torch.Tensor:
    """Rows of 32: a leading 448 * 2^e fixes every block's scale at 2^e, then 31 of `values` times 2^e."""
    per = 31
    rows = [[448.0] + values[i:i + per] for i in range(0, len(values), per)]
    rows[-1] += [0.0] * (32 - len(rows[-1]))
    t = torch.tensor(rows, dtype=torch.float64) * 2.0 ** e
    return t.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_wide_range_partial_blocks(seed, dtype):
    # Per-row and per-column scales 2^[-20, 20] put blocks of very different magnitudes side by side (rowwise and
    # colwise blocks then see different amax); sizes leave a partial last block in both directions.
    for shape in [(1, 1), (31, 33), (64, 70), (3, 40, 96), (2, 65, 1)]:
        t = torch.randn(shape, dtype=torch.float64)
        rows = torch.randint(-20, 21, (*shape[:-1], 1)).double()
        cols = torch.randint(-20, 21, (*shape[:-2], 1, shape[-1])).double()
        t = (t * 2.0 ** rows * 2.0 ** cols).to(dtype)
        assert_same_bytes(t, f"random {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_code_and_tie_at_many_scales(dtype):
    # bf16 keeps 8 significant bits: every e4m3 value and midpoint is exact in it, the midpoint's neighbours
    # round onto a midpoint or a value (still inputs the two codecs must agree on).
    values = grid()
    for e in (-127, -126, -120, -100, -60, -9, -1, 0, 1, 20, 60, 100, 119):
        t = blocks_at_scale(values, e, dtype)
        if torch.isinf(t).any():
            continue
        assert_same_bytes(t, f"grid at 2^{e}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_scale_exponent(dtype):
    # amax exactly 448 * 2^e keeps scale 2^e; the next value up needs 2^(e+1); 2^e * 256 (m = 0.5) and
    # 2^e * 448 - 1 ulp sit on the other side of the frexp test. e from -127 to 120 (float32's largest is
    # 2^128 - 2^104: scale 2^120 at most).
    rows = []
    for e in range(-127, 121):
        top = 448.0 * 2.0 ** e
        for amax in (top, math.nextafter(top, math.inf), math.nextafter(top, 0.0), 256.0 * 2.0 ** e, 2.0 ** e):
            row = [amax, -amax / 3, amax / 1024, -(2.0 ** -149)] + [amax * (i - 14) / 29 for i in range(28)]
            rows.append(row)
    t = torch.tensor(rows, dtype=torch.float64).clamp(-torch.finfo(torch.float32).max,
                                                      torch.finfo(torch.float32).max).to(torch.float32).to(dtype)
    t = torch.where(torch.isinf(t), torch.zeros_like(t), t)  # bf16 rounds float32's largest up to inf
    assert_same_bytes(t, "scale exponents")


@pytest.mark.parametrize("dtype", DTYPES)
def test_subnormals_zeros_and_extremes(dtype):
    tiny = torch.finfo(dtype).tiny  # smallest normal
    sub = [tiny * 2.0 ** -k for k in range(1, 24 if dtype == torch.float32 else 8)]
    rows = [
        sub + [0.0] * (32 - len(sub)),                        # a block of only subnormals: scale 2^-127
        [-v for v in sub] + [-0.0] * (32 - len(sub)),         # negative subnormals and negative zeros
        [0.0] * 32,                                           # zero block: e = -127, all codes 0
        [-0.0] * 32,                                          # negative zeros keep their sign bit (0x80)
        [tiny] + sub + [0.0] * (31 - len(sub)),
        [torch.finfo(dtype).max, -torch.finfo(dtype).max] + [1.0, -1e-30, 3e30] + [0.0] * 27,
        [1.0] + [2.0 ** -k for k in range(8, 39)],            # values below e4m3's smallest step: to zero or not
    ]
    assert_same_bytes(torch.tensor(rows, dtype=torch.float64).to(dtype), "subnormals, zeros, extremes")


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_emulation_is_libmoks_round_trip(seed, dtype):
    # mok.reference's MXFP8 operands are mxfp8_fake_quantize(t): the values libmok's bytes decode to, bit for bit
    # (core's in-layer round trips equal that decode: tests/cpp/test_codec_agreement.cpp).
    wide = torch.randn(45, 70, dtype=torch.float64)
    wide = wide * 2.0 ** torch.randint(-20, 21, (45, 1)).double() * 2.0 ** torch.randint(-20, 21, (1, 70)).double()
    for t in (wide.to(dtype), blocks_at_scale(grid(), -3, dtype), blocks_at_scale(grid(), -127, dtype)):
        data, scales, _, _ = libmok_quantize(t)
        blocks = scales[scale_offsets(*t.shape)]  # [rows, ceil(cols/32)] out of the SM100 layout
        scale = torch.pow(2.0, blocks.double() - 127).repeat_interleave(32, dim=1)[:, :t.shape[1]]
        decoded = (data.view(torch.float8_e4m3fn).double() * scale).float()
        got = mxfp8_fake_quantize(t)
        same = torch.equal(got.view(torch.int32), decoded.view(torch.int32))
        assert same, f"{int((got.view(torch.int32) != decoded.view(torch.int32)).sum())} values differ"
