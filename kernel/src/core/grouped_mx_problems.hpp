// The block-scaled grouped GEMMs in MXFP8 mode (the forward's gate, up and down; the backward's dgrad_h) as plain
// data: per local expert, on top of its problem (grouped_problems.hpp), where its group reads the e4m3 codes of A
// and the e8m0 scales of A and B. A CUTLASS block-scaled ptr-array grouped GEMM takes per group a pointer to the
// first scale of each operand and the scales' layout for that group's (M, N, K) (Sm1xxBlockScaledConfig<32>, core's
// MxScaleLayout):
//   A: the ring's rows quantised along the row (pass_view.hpp's MxRing: x, h, dy), codes of ring row r at r * stride
//      (stride H for x and dy; 2 I for h, which keeps its codes in its bf16 ring's bytes), their scales one
//      [period, K] matrix in MxScaleLayout. The group's scales start at its first ring row's scale tile: the
//      group's layout of M rows then lands on ring rows first + m, because a row tile is k_tiles() tiles in
//      both (same K) and first is a whole number of row tiles (mx_tiles_whole).
//   B: the expert's weight [N, K] e4m3 (the rowwise form; dgrad_h's the colwise form of down, [I, H]), its scales
//      MxScaleLayout::of(N, K), matrix_bytes() apart.
// Everything here is MOK_HD: a device thread per expert fills the arrays from it, and the host tests hold it
// against CuTe (test_grouped_mx_scales_cute).
#pragma once

#include <cstdint>

#include "core/grouped_problems.hpp"
#include "core/mxfp8_layout.hpp"

namespace mok::core {

// Expert e's group: sizes and offsets as grouped_problem gives them, except A's offset, which counts the
// ring's e4m3 codes (ring row times lda); B's counts e4m3 codes and D's bf16 elements there already.
struct GroupedMxProblem {
  GroupedProblem p;
  int64_t lda;       // codes from one ring row to the next (the MxRing's stride)
  int64_t a_scales;  // bytes into the ring's row scales: the scale of (first ring row, k block 0)
  int64_t b_scales;  // bytes into the weights' scales: expert e's matrix
};

// The MXFP8 forward's kinds (gate, up, down).
MOK_HD inline bool mx_forward_kind(GroupedGemm kind) {
  return kind == GroupedGemm::gate || kind == GroupedGemm::up || kind == GroupedGemm::down;
}

// The kinds the block-scaled grouped GEMM serves: both operands K-major codes quantised along K. The forward's (the
// ring's rows, the rowwise weights) and dgrad_h (dy's rows, down's colwise form, which stores down transposed).
MOK_HD inline bool mx_block_scaled_kind(GroupedGemm kind) {
  return mx_forward_kind(kind) || kind == GroupedGemm::dgrad_h;
}

// The block-scaled kind's layout: grouped_layout's, but dgrad_h's B K-major ([I, H] codes of down's colwise form),
// where the BF16 kind reads down [H, I] as it lies.
MOK_HD inline GroupedLayout grouped_mx_layout(const LayerShape& s, GroupedGemm kind) {
  GroupedLayout l = grouped_layout(s, kind);
  if (kind == GroupedGemm::dgrad_h) {
    l.ldb = l.lda;
    l.b_k_major = true;
  }
  return l;
}

// The ring's row scales for a K-deep operand: one [period, K] matrix (shape.hpp's ring_row_scales when the
// period is the macrobatch).
MOK_HD inline MxScaleLayout mx_ring_scales(const RowPeriods& p, int64_t depth) {
  return MxScaleLayout::of(p.ring, depth);
}

// Every group's first ring row starts a scale row tile: segments start on multiples of expert_padding, the
// window on a multiple of the tile, and the ring's period holds whole tiles. A group starting inside a tile
// would need a pointer into the middle of a 512-byte tile, which the layout cannot express.
MOK_HD inline bool mx_tiles_whole(const LayerShape& s, const RowPeriods& p, const RowWindow& w) {
  return s.expert_padding % kMxScaleRowTile == 0 && p.ring % kMxScaleRowTile == 0 && w.row0 % kMxScaleRowTile == 0;
}

// Expert e's group of `kind` (mx_block_scaled_kind) over the window (window_fits and mx_tiles_whole must hold),
// A's codes `lda` apart. The empty problem reads nothing: offsets 0.
MOK_HD inline GroupedMxProblem grouped_mx_problem(const LayerShape& s, const Schedule& sched, GroupedGemm kind,
                                                  const RowPeriods& p, const RowWindow& w, int64_t lda, int e) {
  GroupedProblem q = grouped_problem(s, sched, kind, p, w, e);
  if (q.m == 0) return GroupedMxProblem{q, lda, 0, 0};
  int64_t ring = window_rows(sched, e, w).first % p.ring;
  q.a = ring * lda;
  int64_t a_scales = mx_ring_scales(p, q.k).offset(ring, 0);
  int64_t b_scales = MxScaleLayout::of(q.n, q.k).offset(e, 0, 0);
  return GroupedMxProblem{q, lda, a_scales, b_scales};
}

}  // namespace mok::core
