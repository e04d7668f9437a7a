// A block's panels as TMA tensor loads (cp.async.bulk.tensor, 2-D, 128-byte swizzle): which operands a tensor map can
// describe, the map's fields, and the boxes that fill a panel, each at its coordinates and its place in the panel.
// TMA writes a box's rows of 128 bytes one after another, each 16-byte chunk moved to chunk (chunk xor line % 8) of its
// 1024-byte span: panel_offset's layout, K-major a box of 128 rows, MN-major two of 64 (test_tensor_tile holds the
// boxes, as TMA places them, against fill_piece's panels). The device encodes one template map on the host and sets
// an operand's fields in it (cuda/tensor_tile.cuh); this file says what they are.
#pragma once

#include <cstdint>

#include "core/tensor_tile.hpp"

namespace mok::core {

// The fused executor's maps: a worker's one for each operand of a tile GEMM's parts (parts[p]'s a at 2p, b at 2p + 1),
// each a CUtensorMap (128 bytes, on 64), rewritten for every tile whose operand TMA takes.
constexpr int kPanelMaps = 2 * static_cast<int>(sizeof(Gemm::parts) / sizeof(GemmPart));
constexpr int kTensorMapBytes = 128;

// A box's inner extent: the swizzle's 128 bytes of bf16, a panel row's depth (K-major) or 64 of its rows (MN-major).
constexpr int kBoxInner = 64;
static_assert(kBoxInner == kMmaDepth, "a K-major panel row is one swizzled line");
constexpr int kPanelBoxes = kMmaRows / kBoxInner;  // the most boxes a panel takes (MN-major)

// A 2-D tensor map of one operand of a part, as cuTensorMapEncodeTiled takes it (bf16, no interleave, the 128-byte
// swizzle, zeros out of bounds), dimension 0 the contiguous one. Its dimensions are the operand's own [rows, depth], so
// that a box reads 0 wherever panel_value does: past the tile's rows, and past the part's depth.
struct PanelMap {
  const bf16_t* base;
  uint64_t dims[2];       // values: K-major {depth, rows}, MN-major {rows, depth}
  uint64_t stride_bytes;  // from one index of dimension 1 to the next
  uint32_t box[2];        // values: {kBoxInner, kMmaRows} K-major, one box a panel; {kBoxInner, kMmaDepth} MN-major
};

// TMA's rules for a map (cuda.h, cuTensorMapEncodeTiled): a base on 16 bytes, dimensions from 1 to 2^32 (below it
// here: tensormap.replace takes a dimension in 32 bits), a stride a multiple of 16 bytes below 2^40 and no shorter than
// dimension 0's bytes.
MOK_HD inline bool tma_takes(const PanelMap& m) {
  constexpr uint64_t kMaxDim = (uint64_t{1} << 32) - 1, kMaxStride = uint64_t{1} << 40;
  bool dims = m.dims[0] >= 1 && m.dims[1] >= 1 && m.dims[0] <= kMaxDim && m.dims[1] <= kMaxDim;
  return on_piece(m.base) && dims && m.stride_bytes % 16 == 0 && m.stride_bytes < kMaxStride &&
         m.stride_bytes >= m.dims[0] * sizeof(bf16_t);
}

// The map of operand `o` of a part ([rows, depth], as the part's a or b): false when TMA cannot fill its panels (an
// e4m3 or quantised operand, whose values the threads make; a layout TMA does not take), which the threads then fill
// piece by piece (fill_piece).
MOK_HD inline bool panel_map(const Operand& o, int rows, int depth, PanelMap* map) {
  if (o.dtype != Dtype::bf16 || o.quantize || rows < 1 || depth < 1) return false;
  bool mn = panel_major(o) == PanelMajor::mn;
  int64_t contiguous = mn ? o.row_stride : o.depth_stride, stride = mn ? o.depth_stride : o.row_stride;
  if (contiguous != 1 || stride < 0) return false;
  uint64_t inner = static_cast<uint64_t>(mn ? rows : depth), outer = static_cast<uint64_t>(mn ? depth : rows);
  *map = PanelMap{static_cast<const bf16_t*>(o.data),
                  {inner, outer},
                  static_cast<uint64_t>(stride) * sizeof(bf16_t),
                  {static_cast<uint32_t>(kBoxInner), static_cast<uint32_t>(mn ? kMmaDepth : kMmaRows)}};
  return tma_takes(*map);
}

// The map of part `part`'s a (second false) or b.
MOK_HD inline bool part_map(const Gemm& g, int part, bool second, PanelMap* map) {
  const GemmPart& p = g.parts[part];
  return panel_map(second ? p.b : p.a, second ? g.cols : g.rows, p.depth, map);
}
// The operands of g whose panels TMA fills: bit 2 part + second, as the fused executor's maps (kPanelMaps).
MOK_HD inline uint32_t boxed_operands(const Gemm& g) {
  uint32_t boxed = 0;
  PanelMap map;
  for (int slot = 0; slot < 2 * g.num_parts; ++slot)
    if (part_map(g, slot / 2, slot % 2, &map)) boxed |= 1u << slot;
  return boxed;
}

// One box of a panel: its first value's coordinates in the map (dimension 0 first; TMA's are 32-bit) and where it
// starts in the panel, in values (on 1024 bytes, where the swizzle's pattern starts).
struct PanelBox {
  int32_t coords[2];
  int offset;
};

// The boxes that fill the panel of an operand of `major` for a block whose rows start at `row0` (the chunk's rows for
// a, its columns for b) and whose depth starts at `k0`; their count. K-major: one box, the panel's 128 rows. MN-major:
// two, rows row0 and row0 + 64, each its 64 rows at each of the block's 64 k (panel_offset's halves).
MOK_HD inline int panel_boxes(PanelMajor major, int row0, int k0, PanelBox* boxes) {
  if (major == PanelMajor::k) {
    boxes[0] = PanelBox{{k0, row0}, 0};
    return 1;
  }
  for (int half = 0; half < kPanelBoxes; ++half)
    boxes[half] = PanelBox{{row0 + half * kBoxInner, k0}, half * kBoxInner * kMmaDepth};
  return kPanelBoxes;
}
// The boxes of block b's panel of its part's a (second false) or b.
MOK_HD inline int block_boxes(const Gemm& g, const MmaBlock& b, bool second, PanelBox* boxes) {
  BlockOperand side = block_operand(g, b, second);
  return panel_boxes(panel_major(side.o), side.row0, b.k0, boxes);
}

// A tile's TMA loads as their one issuing thread keeps them, across tiles (a stage's load barrier runs on from tile to
// tile, one arrival a fill with loads): `loads` as PanelStages keeps the MMAs, a stage busy while its last fill's
// loads are not waited for, with the parity of the phase their bytes complete. The loads of the tile's fills
// [from, upto) waited for: fill q's in stage q % kPanelStages (sum_tile's order), each through
// wait.loaded(stage, parity), false when they did not land in time. Returns the fills landed: upto, or the first
// whose wait ran out (its stage still busy).
template <class Wait>
MOK_HD int land_loads(PanelStages& loads, int from, int upto, Wait& wait) {
  for (; from < upto; ++from) {
    int stage = from % kPanelStages;
    if (!loads.busy(stage)) continue;
    if (!wait.loaded(stage, loads.parity(stage))) return from;
    loads.waited(1u << stage);
  }
  return upto;
}

}  // namespace mok::core
