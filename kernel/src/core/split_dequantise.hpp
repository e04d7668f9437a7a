// MXFP8 through the BF16 grouped GEMMs (issue #12). A GEMM of an MXFP8 pass without a block-scaled grouped GEMM
// (the backward's but dgrad_h; every GEMM on a device without block-scaled MMA, sm_90a) is preceded by a
// dequantise step: it writes the value of each MXFP8 operand element the GEMM reads (stored_value: the e4m3 code times
// its block's e8m0 scale, the operand core's tasks read) as bf16 into two scratch buffers laid out as the BF16 kind
// reads the bf16 ring and weights (grouped_problems.hpp), and the BF16 grouped GEMM reads those.
//
// Exact: every value quantised from a bf16 value is a bf16 value (an e4m3 step at least as fine as bf16's at that
// magnitude leaves the bf16 value itself; a coarser one lies on bf16's grid; a block within 2^-4 of bf16's largest can
// round up to 2^128, infinity in fp32 and bf16 alike), and so is every code of a weight quantised from bf16
// (mokMxfp8Quantize); products of bf16 values are exact in fp32. So the GEMM is docs/semantics.md's MXFP8 GEMM, summed
// in the tensor cores' order. A weight form of values below 2^-126 off bf16's subnormal grid (quantised from tiny fp32
// weights, or written by hand) would be rounded (docs/gpu.md).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/compute_tasks.hpp"
#include "core/split_plan.hpp"

namespace mok::core {

// The scratch: `a` ring-shaped, [macrobatch, max(H, I)] (ring row r at row r % macrobatch, as ring_row places it);
// `b` the local experts' weights as the bf16 weights lie ([E_local, N, K] in the kind's layout), or for a weight
// gradient a second ring-shaped buffer.
struct SplitDequantised {
  bf16_t* a;
  bf16_t* b;
};

MOK_HD inline size_t dequantised_a_values(const LayerShape& s) {
  size_t width = max_value(static_cast<size_t>(s.hidden), static_cast<size_t>(s.intermediate));
  return s.mxfp8 ? static_cast<size_t>(s.macrobatch) * width : 0;
}
MOK_HD inline size_t dequantised_b_values(const LayerShape& s) {
  size_t weights = static_cast<size_t>(s.experts_per_rank) * s.hidden * s.intermediate;
  return s.mxfp8 ? max_value(weights, dequantised_a_values(s)) : 0;
}

// A's ring operand over the tile from ring row row0, as core's tasks read it in MXFP8 mode: rows along their width
// (x for gate and up, h for down, dy for dgrad_h, dg and du for dgrad_x), or a weight gradient's down the tokens.
MOK_HD inline Operand dequantise_ring_a(const PassView& v, GroupedGemm kind, int64_t row0) {
  int h = v.s.hidden, in = v.s.intermediate;
  switch (kind) {
    case GroupedGemm::gate:
    case GroupedGemm::up: return ring_rows(v, v.ring_x, v.mx_x, row0, h);
    case GroupedGemm::down: return ring_rows(v, v.ring_h, v.mx_h, row0, in);
    case GroupedGemm::dgrad_h: return ring_rows(v, v.ring_dy, v.mx_dy, row0, h);
    case GroupedGemm::dgrad_x_gate: return ring_rows(v, v.ring_g, v.mx_g, row0, in);
    case GroupedGemm::dgrad_x_up: return ring_rows(v, v.ring_u, v.mx_u, row0, in);
    case GroupedGemm::wgrad_down: return ring_columns(v, v.ring_dy, v.mx_dy, row0, h);
    case GroupedGemm::wgrad_gate: return ring_columns(v, v.ring_g, v.mx_g, row0, in);
    case GroupedGemm::wgrad_up: return ring_columns(v, v.ring_u, v.mx_u, row0, in);
    case GroupedGemm::count: break;
  }
  return Operand{};
}

// A weight gradient's B down the tokens: h for dW_down, x for dW_gate and dW_up.
MOK_HD inline Operand dequantise_ring_b(const PassView& v, GroupedGemm kind, int64_t row0) {
  if (kind == GroupedGemm::wgrad_down) return ring_columns(v, v.ring_h, v.mx_h, row0, v.s.intermediate);
  return ring_columns(v, v.ring_x, v.mx_x, row0, v.s.hidden);
}

// Any other kind's B: expert e's weight, rowwise for the forward's GEMMs, colwise for the dgrads (as run_down,
// run_dgrad_h and run_dgrad_x read them): operand row n, depth k.
MOK_HD inline Operand dequantise_weight(const PassView& v, GroupedGemm kind, int e) {
  const LayerWeights& w = v.w;
  int h = v.s.hidden, in = v.s.intermediate;
  switch (kind) {
    case GroupedGemm::gate: return weight_rows(v, w.gate, w.gate_rowwise, e, in, h);
    case GroupedGemm::up: return weight_rows(v, w.up, w.up_rowwise, e, in, h);
    case GroupedGemm::down: return weight_rows(v, w.down, w.down_rowwise, e, h, in);
    case GroupedGemm::dgrad_h: return weight_columns(v, w.down, w.down_colwise, e, in, h);
    case GroupedGemm::dgrad_x_gate: return weight_columns(v, w.gate, w.gate_colwise, e, h, in);
    case GroupedGemm::dgrad_x_up: return weight_columns(v, w.up, w.up_colwise, e, h, in);
    default: break;
  }
  return Operand{};
}

// Schedule row `row` of a ring operand (`b`: the weight gradient's B, else A) into its ring row of `scratch`, columns
// col0, col0 + step, ... of its width (the kind's lda or ldb). Padding rows and rows past the schedule's end are in no
// problem: left alone.
MOK_HD inline void dequantise_ring_row(const PassView& v, GroupedGemm kind, bool b, int64_t row, int col0, int step,
                                       bf16_t* scratch) {
  if (routed_row_expert(v.s, v.sched, row) < 0) return;
  int64_t row0 = row - row % v.s.expert_padding;
  GroupedLayout l = grouped_layout(v.s, kind);
  int width = static_cast<int>(b ? l.ldb : l.lda);
  Operand o = b ? dequantise_ring_b(v, kind, row0) : dequantise_ring_a(v, kind, row0);
  bf16_t* out = ring_row(v, scratch, row, width);
  bool tokens = is_wgrad(kind);  // the operand's rows are the ring's columns, its depth the tokens
  for (int col = col0; col < width; col += step)
    out[col] = float_to_bf16(tokens ? stored_value(o, col, row - row0) : stored_value(o, row - row0, col));
}

// Elements of the weights a dequantise step writes: every local expert's B (none for a weight gradient).
MOK_HD inline int64_t dequantise_weight_items(const LayerShape& s, GroupedGemm kind) {
  return is_wgrad(kind) ? 0 : static_cast<int64_t>(s.experts_per_rank) * s.hidden * s.intermediate;
}

// Element i of the weights in the BF16 kind's layout (grouped_layout: K-major, (n, k) at n ldb + k; N-major, at
// k ldb + n), from the expert's MXFP8 form.
MOK_HD inline void dequantise_weight_item(const PassView& v, GroupedGemm kind, int64_t i, bf16_t* scratch) {
  GroupedLayout l = grouped_layout(v.s, kind);
  int64_t per_expert = static_cast<int64_t>(v.s.hidden) * v.s.intermediate, at = i % per_expert;
  int64_t major = at / l.ldb, minor = at % l.ldb;
  Operand o = dequantise_weight(v, kind, static_cast<int>(i / per_expert));
  scratch[i] = float_to_bf16(l.b_k_major ? stored_value(o, major, minor) : stored_value(o, minor, major));
}

}  // namespace mok::core
