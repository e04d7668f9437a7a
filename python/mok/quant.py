"""MXFP8 codec: e4m3 data with one e8m0 (power-of-two) scale per block of 32 elements along the last dim.

The scales are stored in the layout the SM100 block-scaled MMA reads (CUTLASS 4.2's Sm1xxBlockScaledConfig<32>,
docs/mxfp8.md "The device scale-factor layout"), the bytes libmok's mokMxfp8Quantize writes: per [R, C] matrix a
flat uint8 of scale_bytes(R, C) bytes, rows padded to 128 and k blocks to 4 (padding scales 127, i.e. 2^0).

The rule (docs/mxfp8.md, DESIGN 1.2) is the one every libmok executor implements bit for bit:

- a block is 32 consecutive elements of the last dim; a last block shorter than 32 takes its scale over the
  elements it has;
- the scale is the smallest power of two s = 2^e with amax / s <= 448, e clamped to [-127, 127] (amax = 0 gives
  e = -127), stored as the byte e + 127;
- q = e4m3(clamp(x / s, -448, 448)), rounded to nearest even; x / s is exact because s is a power of two.

Everything here is vectorised torch code: the expert-parallel path quantises large activations with it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import torch

BLOCK = 32
E4M3_MAX = 448.0
E8M0_BIAS = 127
_E_MIN, _E_MAX = -127, 127
ROW_TILE, BLOCK_TILE, TILE_BYTES = 128, 4, 512  # the SM100 layout: 128 rows x 4 k blocks per 512-byte tile
PAD_SCALE = 127  # e8m0 of 2^0: a finite scale for padding (the MMA reads it; padding data is zero)


def scale_bytes(rows: int, cols: int) -> int:
    """Bytes of one [rows, cols] matrix's scales in the SM100 layout: ceil(rows/128) * ceil(ceil(cols/32)/4) tiles
    of 512 (rows padded to 128, k blocks to 4)."""
    return -(-rows // ROW_TILE) * -(-_num_blocks(cols) // BLOCK_TILE) * TILE_BYTES


@functools.lru_cache(maxsize=64)
def scale_offsets(rows: int, cols: int) -> torch.Tensor:
    """int64 [rows, ceil(cols/32)]: the byte of (row r, k block b)'s scale within its matrix's scale_bytes(rows, cols),
    ((r // 128) * k_tiles + b // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + b % 4 (core::MxScaleLayout)."""
    k_tiles = -(-_num_blocks(cols) // BLOCK_TILE)
    r = torch.arange(rows, dtype=torch.int64)[:, None]
    b = torch.arange(_num_blocks(cols), dtype=torch.int64)[None, :]
    tile = (r // ROW_TILE) * k_tiles + b // BLOCK_TILE
    return tile * TILE_BYTES + (r % 32) * 16 + ((r // 32) % 4) * 4 + b % BLOCK_TILE


@functools.lru_cache(maxsize=64)
def padding_offsets(rows: int, cols: int) -> torch.Tensor:
    """int64: the bytes of a [rows, cols] matrix's scales that hold no block's scale (padding rows and k blocks)."""
    used = torch.zeros(scale_bytes(rows, cols), dtype=torch.bool)
    used[scale_offsets(rows, cols).flatten()] = True
    return (~used).nonzero().flatten()


@dataclasses.dataclass(frozen=True, eq=False)  # tensors: compare by identity
class MXFP8Tensor:
    """One orientation of an MXFP8 tensor.

    data:       float8_e4m3fn, [..., R, C] (at least 2-D); blocks run along C (the last dim).
    scales:     uint8 e8m0 (the byte e + 127 for the scale 2^e), [..., scale_bytes(R, C)]: each [R, C] matrix's
                scales as one flat run of bytes in the SM100 layout (scale_offsets(R, C) gives the byte of each
                (row, k block); the others are padding and hold 127).
    transposed: True when this holds the column-wise quantisation of a [.., M, N] source, stored as [.., N, M].
    """

    data: torch.Tensor
    scales: torch.Tensor
    transposed: bool

    def __post_init__(self):
        if self.data.dtype != torch.float8_e4m3fn:
            raise TypeError(f"data must be torch.float8_e4m3fn, got {self.data.dtype}")
        if self.scales.dtype != torch.uint8:
            raise TypeError(f"scales must be torch.uint8 (e8m0), got {self.scales.dtype}")
        if self.data.dim() < 2:
            raise ValueError(f"data must be [..., R, C] (at least 2-D), got shape {tuple(self.data.shape)}")
        *batch, rows, cols = self.data.shape
        expected = (*batch, scale_bytes(rows, cols))
        if tuple(self.scales.shape) != expected:
            old = (*batch, rows, _num_blocks(cols))
            hint = (" (that is the row-major [.., R, ceil(C/32)] layout, which is not accepted: quantise with "
                    "mxfp8_quantize)" if tuple(self.scales.shape) == old else "")
            raise ValueError(
                f"scales must have shape {expected} for data of shape {tuple(self.data.shape)}: each [{rows}, {cols}] "
                f"matrix's scales in the SM100 block-scaled layout, ceil(R/128) * ceil(ceil(C/32)/4) * 512 bytes "
                f"(docs/mxfp8.md), got {tuple(self.scales.shape)}{hint}"
            )

    def block_scales(self) -> torch.Tensor:
        """The scale bytes as [..., R, ceil(C/32)], block (r, b) at [.., r, b]: read out of the SM100 layout."""
        rows, cols = self.data.shape[-2:]
        return self.scales[..., scale_offsets(rows, cols).to(self.scales.device)]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """float(q) * 2^e in the stored orientation. Exact in float32 and float64 (a 4-bit significand times a
        power of two) except that values within 1/16 of float32's largest finite overflow to inf in float32."""
        return mxfp8_dequantize(self, dtype)

    def __getitem__(self, index) -> MXFP8Tensor:
        """Index the leading (expert) dim: `q[e]` is expert e's [R, C] matrix."""
        if self.data.dim() < 3:
            raise IndexError("only a batched [E, R, C] MXFP8Tensor can be indexed")
        return MXFP8Tensor(self.data[index], self.scales[index], self.transposed)


class MXFP8Pair(NamedTuple):
    """Row-wise (blocks along N, [.., M, N]) and column-wise (blocks along M, stored [.., N, M]) forms."""

    rowwise: MXFP8Tensor | None
    colwise: MXFP8Tensor | None

    def expert(self, e: int) -> MXFP8Pair:
        """Expert e's forms of a batched [E, M, N] pair."""
        return MXFP8Pair(*(None if q is None else q[e] for q in self))


def mxfp8_quantize(t: torch.Tensor, rowwise: bool = True, colwise: bool = True, *, name: str = "t") -> MXFP8Pair:
    """Quantise a [M, N] or [E, M, N] bf16/fp32 tensor to MXFP8 in the requested orientations.

    rowwise: blocks along N; data [.., M, N], scales [.., scale_bytes(M, N)].
    colwise: blocks along M, stored transposed; data [.., N, M] contiguous, scales [.., scale_bytes(N, M)].
    Scales are in the SM100 layout (see MXFP8Tensor), padding bytes 127: the bytes mokMxfp8Quantize writes.
    NaN or Inf anywhere in `t` is a ValueError naming `name` (MXFP8 has no encoding for them).
    """
    _check_source(t, name)
    if not (rowwise or colwise):
        raise ValueError("mxfp8_quantize: at least one of rowwise, colwise must be True")
    row = _quantize_last_dim(t, name, transposed=False) if rowwise else None
    col = _quantize_last_dim(t.transpose(-1, -2), name, transposed=True) if colwise else None
    return MXFP8Pair(row, col)


def mxfp8_dequantize(q: MXFP8Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """float(q) * 2^e, in the orientation `q` is stored in (a colwise form comes back transposed). The scale byte 255
    (e8m0's NaN) makes its block NaN, as e4m3fn's NaN codes make their element NaN."""
    if not isinstance(q, MXFP8Tensor):
        raise TypeError(f"q must be an MXFP8Tensor, got {type(q).__name__}")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64 (exact results), got {dtype}")
    return _decode_blocks(_blocked(q.data.to(dtype)), q.block_scales(), dtype, q.data.shape[-1])


def mxfp8_fake_quantize(t: torch.Tensor, *, name: str = "t", nonfinite: str = "raise") -> torch.Tensor:
    """Quantise along the last dim and dequantise to float32: the values an MXFP8 GEMM multiplies.

    nonfinite="raise": NaN or Inf in `t` is a ValueError naming `name`, as in mxfp8_quantize. nonfinite="nan" (the
    layer's activations): a block holding a NaN or an Inf takes e8m0's NaN scale (0xFF) and comes back NaN in every
    element; the other blocks are quantised as usual. This is what libmok's core does inside the layer.
    """
    _check_source(t, name, ndims=None)
    if nonfinite not in ("raise", "nan"):
        raise ValueError(f"nonfinite must be 'raise' or 'nan', got {nonfinite!r}")
    if nonfinite == "raise":
        return _fake_quantize(t, name)
    x = _blocked(t.float())
    bad = ~torch.isfinite(x).all(dim=-1, keepdim=True)  # [..., blocks, 1]
    clean = _unblocked(torch.where(bad, 0.0, x), t.shape[-1])
    values = _blocked(_fake_quantize(clean, name))
    return _unblocked(torch.where(bad, torch.nan, values), t.shape[-1])


def e8m0_exponent(amax: torch.Tensor) -> torch.Tensor:
    """The scale exponent e (int32) for block maxima `amax` (float32, >= 0), computed exactly.

    amax = m * 2^x with m in [0.5, 1) (frexp). amax / 2^e <= 448 = 0.875 * 2^9 holds for e = x - 9 when m <= 0.875,
    else first for e = x - 8. No logarithm is rounded on the way.
    """
    mantissa, exponent = torch.frexp(amax)
    e = exponent - torch.where(mantissa <= 0.875, 9, 8).to(exponent.dtype)
    e = torch.where(amax == 0, torch.full_like(e, _E_MIN), e)
    return e.clamp(_E_MIN, _E_MAX).to(torch.int32)


def encode_e4m3(scaled: torch.Tensor) -> torch.Tensor:
    """e4m3 codes of already scaled float32 values: saturate to [-448, 448], then round to nearest even."""
    return scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)  # torch's cast rounds to nearest even


def _quantize_blocks(t: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """t [..., C] in blocks of 32 along C: (e4m3 codes [..., C], scale bytes e + 127 [..., ceil(C/32)])."""
    x = _blocked(t.float())  # bf16 -> fp32 is exact; zero padding does not change a block's amax
    amax = x.abs().amax(dim=-1, keepdim=True)
    if not bool(torch.isfinite(amax).all()):  # a block's amax is NaN or Inf exactly when the block holds one
        raise ValueError(f"{name} contains NaN or Inf; MXFP8 has no encoding for them")
    e = e8m0_exponent(amax)
    # x * 2^-e is exact in fp32 whenever the result is a normal float; smaller results are far below e4m3's
    # smallest subnormal (2^-9) and its rounding midpoint (2^-10), so they round to (signed) zero either way.
    data = _unblocked(encode_e4m3(x * _pow2(-e)), t.shape[-1])
    return data, (e.squeeze(-1) + E8M0_BIAS).to(torch.uint8)


def _quantize_last_dim(t: torch.Tensor, name: str, *, transposed: bool) -> MXFP8Tensor:
    data, blocks = _quantize_blocks(t, name)
    *batch, rows, cols = t.shape
    scales = torch.full((*batch, scale_bytes(rows, cols)), PAD_SCALE, dtype=torch.uint8, device=t.device)
    scales[..., scale_offsets(rows, cols).to(t.device)] = blocks  # the offsets are distinct: one byte each
    return MXFP8Tensor(data, scales, transposed)


def _fake_quantize(t: torch.Tensor, name: str) -> torch.Tensor:
    """The float32 values of t's quantisation along its last dim (any number of dims)."""
    data, blocks = _quantize_blocks(t, name)
    return _decode_blocks(_blocked(data.float()), blocks, torch.float32, t.shape[-1])


def _decode_blocks(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype, cols: int) -> torch.Tensor:
    """codes [..., nb, 32] (as dtype) times 2^(scales - 127) per block (scales uint8 [..., nb]); 255 is NaN."""
    scale = _pow2(scales.to(torch.int32).clamp(max=254) - E8M0_BIAS).to(dtype)
    scale = torch.where(scales == 255, torch.nan, scale)  # e8m0's NaN: the whole block is NaN
    return _unblocked(codes * scale[..., None], cols)


def _blocked(x: torch.Tensor) -> torch.Tensor:
    """[..., C] -> [..., ceil(C/32), 32], zero-padded."""
    blocks = _num_blocks(x.shape[-1])
    x = torch.nn.functional.pad(x, (0, blocks * BLOCK - x.shape[-1]))
    return x.reshape(*x.shape[:-1], blocks, BLOCK)


def _unblocked(x: torch.Tensor, cols: int) -> torch.Tensor:
    """[..., nb, 32] -> [..., cols], contiguous."""
    return x.reshape(*x.shape[:-2], x.shape[-2] * BLOCK)[..., :cols].contiguous()


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e as float32 for int32 e in [-127, 127], built from its bit pattern so it is exact (2^-127 is subnormal)."""
    bits = torch.where(e == -127, torch.full_like(e, 1 << 22), (e + 127) << 23)
    return bits.to(torch.int32).view(torch.float32)


def _num_blocks(cols: int) -> int:
    return -(-cols // BLOCK)


def _check_source(t, name: str, ndims=(2, 3)) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"{name} must be bfloat16 or float32 to quantise to MXFP8, got {t.dtype}")
    if ndims is not None and t.dim() not in ndims:
        raise ValueError(f"{name} must be 2-D [M, N] or 3-D [E, M, N], got shape {tuple(t.shape)}")
    if t.dim() < 1:
        raise ValueError(f"{name} must have at least one dim, got a scalar")
