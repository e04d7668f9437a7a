// A scaled block: kScaledDepth of an MXFP8 part (scaled_part: a and b e4m3 codes, K-major) as the SM100 block-scaled
// MMA reads it (tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale, CuTe's SM100_MMA_MXF8F6F4_SS, 32 of the depth an
// MMA; the scales through tcgen05.cp, CuTe's UTCCP, from shared memory into tensor memory). The products it sums are
// code times code times both scales: the operands' own values, with no bf16 in between.
//
// Codes: a's panel then b's, each kMmaRows rows of 128 codes under the 128-byte swizzle, K-major: the bytes a bf16
// block's panel takes, row r's 16-byte chunk c at chunk c xor (r mod 8). A piece is 16 codes.
// Scales: each operand's kMmaRows rows x kScaleBlocks blocks of the block in one kMxScaleTileBytes atom, a's then b's,
// row r's four scales one 32-bit word (tensor memory's), laid out as a tile of the operands' own scales
// (mxfp8_layout.hpp; CUTLASS's Sm1xxBlockScaledConfig<32> smem atom for a 128 x 128 x 128 tile is these 512 bytes).
// test_tensor_tile_cute holds both against CuTe; test_tensor_tile sums them as the MMA does.
#pragma once

#include <cstdint>

#include "core/mxfp8_layout.hpp"
#include "core/tensor_tile.hpp"

namespace mok::core {

constexpr int kScaleBlocks = kScaledDepth / kMxBlock;  // a scaled block's scales a row
constexpr int kCodeLine = kScaledDepth;                // a panel row's bytes: 128 codes
constexpr int kCodePieces = kCodeLine / kPieceBytes;   // a panel row's pieces
constexpr int kScaleAtomBytes = kMxScaleTileBytes;     // one operand's scales of a block
constexpr int kScaleWords = 2 * kMmaRows;              // a block's: a's rows' words, then b's
static_assert(kCodeLine * kMmaRows == kPanelValues * static_cast<int>(sizeof(bf16_t)),
              "a panel of codes takes a bf16 panel's bytes");
static_assert(kMmaRows == kMxScaleRowTile && kScaleBlocks == kMxScaleBlockTile, "a block's scales are one tile");
static_assert(2 * kMmaRows * kCodePieces == kBlockPieces, "a scaled block has a bf16 block's pieces");

// Where code (row, k) of a panel lies, in bytes from the panel's start.
MOK_HD inline int code_offset(int row, int k) {
  return row * kCodeLine + (((k / kPieceBytes) ^ (row % 8)) * kPieceBytes) + k % kPieceBytes;
}
// Where the scale of (row, block) lies in an operand's atom, in bytes.
MOK_HD inline int scale_offset(int row, int block) {
  return static_cast<int>(MxScaleLayout{kMmaRows, kScaleBlocks}.offset(row, block));
}

// The scales under which every e4m3 code's value (code times scale) is a bf16, normal or 0: from 2^-117, which takes
// the least e4m3 value (2^-9) to bf16's least normal (2^-126), to 2^119, which keeps the largest (448) below bf16's
// largest. A block's scales judge its values, 4 a row, where its codes would be 128: a chunk with a scale outside goes
// to gemm_element (as a bf16 block's chunk with a value that is no bf16), even where its codes would all be exact.
constexpr uint8_t kExactScaleLeast = 10, kExactScaleMost = 246;  // e8m0: 2^(s - 127)
MOK_HD inline bool exact_scale(uint8_t scale) {
  return scale >= kExactScaleLeast && scale <= kExactScaleMost;
}

// Piece `p` (0 <= p < kBlockPieces) of a scaled block into its panels of codes (`panels`: a's, then b's): row
// p / kCodePieces of a (then b), codes k to k + 15 from the block's k0. A piece inside the operand and on 16 bytes is
// one copy (`move`); one past the operand's rows or the part's depth is read code by code, zeros outside.
template <class Move = PieceMove>
MOK_HD inline void fill_codes(const Gemm& g, const MmaBlock& b, int p, uint8_t* panels, Move move = {}) {
  bool second = p >= kBlockPieces / 2;
  int local = second ? p - kBlockPieces / 2 : p;
  BlockOperand side = block_operand(g, b, second);
  const Operand& o = side.o;
  int row = local / kCodePieces, k = local % kCodePieces * kPieceBytes;
  int i = side.row0 + row, rows = side.rows, depth = side.depth, from = b.k0 + k;
  uint8_t* out = panels + (second ? kCodeLine * kMmaRows : 0) + code_offset(row, k);
  const uint8_t* codes = static_cast<const uint8_t*>(o.data) + static_cast<int64_t>(i) * o.row_stride + from;
  bool inside = i < rows && from + kPieceBytes <= depth;
  if (inside && on_piece(codes)) return move(reinterpret_cast<Piece*>(out), reinterpret_cast<const Piece*>(codes));
  for (int v = 0; v < kPieceBytes; ++v) out[v] = i < rows && from + v < depth ? codes[v] : uint8_t{0};
}

// Word `w` (0 <= w < kScaleWords) of a scaled block's scales into its atoms (`atoms`: a's, then b's): row w of a
// (then b)'s kScaleBlocks scales from the block's k0. A row past the operand's rows, or a block past the part's
// depth, takes kMxPadScale: its codes are zeros, and a finite scale keeps their products 0 (the operand's own bytes
// there may be another row's, or NaN). False when one of the operand's scales is not an exact_scale.
MOK_HD inline bool fill_scales(const Gemm& g, const MmaBlock& b, int w, uint8_t* atoms) {
  bool second = w >= kMmaRows;
  int row = second ? w - kMmaRows : w;
  BlockOperand side = block_operand(g, b, second);
  int i = side.row0 + row;
  int64_t blocks = mx_blocks(side.depth);
  uint8_t* atom = atoms + (second ? kScaleAtomBytes : 0);
  bool exact = true;
  for (int block = 0; block < kScaleBlocks; ++block) {
    int64_t at = b.k0 / kMxBlock + block;
    uint8_t scale = i < side.rows && at < blocks ? operand_scale(side.o, i, at) : kMxPadScale;
    atom[scale_offset(row, block)] = scale;
    exact = exact && exact_scale(scale);
  }
  return exact;
}

}  // namespace mok::core
