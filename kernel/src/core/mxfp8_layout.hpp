// MXFP8 operands in the device's own bytes: e4m3 data [rows, depth] (row-major, a row stride of the
// caller's choice) and the e8m0 scales of its 1x32 blocks along depth in the layout the SM100
// block-scaled MMA reads (tcgen05.mma ... .block_scale, UTCCP from shared memory): CUTLASS 4.2's
// cutlass::detail::Sm1xxBlockScaledConfig<32> (tile_atom_to_shape_SFA / SFB), which in CuTe reads
//   (((32,4),row_tiles),((32,4),k_tiles)):(((16,4),512*k_tiles),((0,1),512))
// over (row, depth element). tests/cpp/test_sf_layout_cute.cpp holds this file against CuTe itself.
//
// In words: rows go in tiles of 128, k blocks (32 values each) in tiles of 4; one 128 x 4 tile is 512
// contiguous bytes, tiles of one row tile follow each other along k, then the next row tile. Inside a
// tile, row r = 32 * r_hi + r_lo (r_lo < 32, r_hi < 4) and k block b (< 4) sit at 16 * r_lo + 4 * r_hi + b:
// each 32-bit word (tensor memory's word size) holds the 4 scales of one row.
//
// Padding: the layout covers rows rounded up to 128 and k blocks rounded up to 4. The MMA reads every
// byte of a tile, so every padding byte must hold a finite scale: a NaN scale (0xFF) would make the
// padded rows or blocks NaN and, through 0 * NaN, every output they meet. The data of padding (rows
// beyond `rows`, values beyond `depth`) must read as zeros (a TMA box past the tensor's extent fills
// zeros; a buffer with room for more rows holds zeros there), so a finite scale makes their products
// exactly 0. The quantisers below write kMxPadScale (2^0) into every padding scale.
#pragma once

#include <cstdint>

#include "core/mxfp8.hpp"
#include "core/numeric.hpp"

namespace mok::core {

constexpr int kMxScaleRowTile = 128;    // rows per scale tile
constexpr int kMxScaleBlockTile = 4;    // k blocks per scale tile
constexpr int kMxScaleTileBytes = 512;  // 128 x 4 scales
constexpr uint8_t kMxPadScale = 127;    // e8m0 of 2^0: finite, so zero data stays zero

MOK_HD inline int64_t mx_ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The scales of one [rows, depth] operand, or of `batch` of them one after another.
struct MxScaleLayout {
  int64_t rows;
  int64_t k_blocks;  // ceil(depth / 32): a last, shorter block has a scale too

  MOK_HD static MxScaleLayout of(int64_t rows, int64_t depth) { return MxScaleLayout{rows, mx_blocks(depth)}; }

  MOK_HD int64_t row_tiles() const { return mx_ceil_div(rows, kMxScaleRowTile); }
  MOK_HD int64_t k_tiles() const { return mx_ceil_div(k_blocks, kMxScaleBlockTile); }
  MOK_HD int64_t padded_rows() const { return row_tiles() * kMxScaleRowTile; }
  MOK_HD int64_t padded_k_blocks() const { return k_tiles() * kMxScaleBlockTile; }

  // Bytes of one matrix's scales, padding included: the distance between matrices of a batch.
  MOK_HD int64_t matrix_bytes() const { return row_tiles() * k_tiles() * kMxScaleTileBytes; }
  MOK_HD int64_t batch_bytes(int64_t batch) const { return batch * matrix_bytes(); }

  // Where the scale of (row, k_block) lives; any row < padded_rows(), k_block < padded_k_blocks().
  MOK_HD int64_t offset(int64_t row, int64_t k_block) const {
    int64_t tile = (row / kMxScaleRowTile) * k_tiles() + k_block / kMxScaleBlockTile;
    int64_t in_row = row % 32, row_group = (row / 32) % 4, in_block = k_block % kMxScaleBlockTile;
    return tile * kMxScaleTileBytes + in_row * 16 + row_group * 4 + in_block;
  }
  MOK_HD int64_t offset(int64_t matrix, int64_t row, int64_t k_block) const {
    return matrix * matrix_bytes() + offset(row, k_block);
  }
};

// Row `row` of an operand: `layout`'s depth values from `src` (fp32 or bf16) quantised along depth into
// `data` (depth e4m3 codes) and their scales into `scales`, the row's padding k blocks included. Rows
// quantised by different workers write disjoint bytes.
template <class T>
MOK_HD void mx_quantize_row(const T* src, int64_t depth, MxScaleLayout layout, int64_t row, uint8_t* data,
                            uint8_t* scales) {
  for (int64_t b = 0; b < layout.k_blocks; ++b) {
    int n = depth - b * kMxBlock < kMxBlock ? static_cast<int>(depth - b * kMxBlock) : kMxBlock;
    scales[layout.offset(row, b)] = mx_quantize_block(src + b * kMxBlock, n, 1, data + b * kMxBlock, 1);
  }
  for (int64_t b = layout.k_blocks; b < layout.padded_k_blocks(); ++b) scales[layout.offset(row, b)] = kMxPadScale;
}

// The padding rows' scales (rows .. padded_rows()), every k block: what no row of mx_quantize_row writes.
MOK_HD inline void mx_fill_pad_rows(MxScaleLayout layout, uint8_t* scales) {
  for (int64_t r = layout.rows; r < layout.padded_rows(); ++r)
    for (int64_t b = 0; b < layout.padded_k_blocks(); ++b) scales[layout.offset(r, b)] = kMxPadScale;
}

// A [rows, depth] block of fp32 or bf16 values (row stride src_stride elements) quantised along depth:
// e4m3 codes into data (row stride data_stride bytes), and every byte of the layout's
// matrix_bytes() of scales, padding included.
template <class T>
MOK_HD void mx_quantize_rows(const T* src, int64_t src_stride, int64_t rows, int64_t depth, uint8_t* data,
                             int64_t data_stride, uint8_t* scales) {
  MxScaleLayout layout = MxScaleLayout::of(rows, depth);
  for (int64_t r = 0; r < rows; ++r)
    mx_quantize_row(src + r * src_stride, depth, layout, r, data + r * data_stride, scales);
  mx_fill_pad_rows(layout, scales);
}

// The value element (row, k) of such an operand stands for: code times scale (NaN if either is NaN).
MOK_HD inline float mx_decode(const uint8_t* data, int64_t data_stride, const uint8_t* scales,
                              const MxScaleLayout& layout, int64_t row, int64_t k) {
  return mx_value(data[row * data_stride + k], e8m0_decode(scales[layout.offset(row, k / kMxBlock)]));
}

}  // namespace mok::core
