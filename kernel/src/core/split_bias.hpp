// Expert biases in the split executor (issue #12). The grouped GEMMs add none, so in a layer with a bias the GEMM it
// belongs to (gate, up or down) writes its fp32 product (SplitTargets::biased for gate and up, ring-shaped; dx_partial
// for down, out-ring-shaped: unused in a forward) and an add_bias step right after it adds the expert's bias in fp32
// and rounds once to bf16 into the ring (g, u) or the output ring (y): docs/semantics.md's one rounded add after the
// last product, as core's store_bf16 epilogue (gemm.hpp, with_bias). A backward sums each bias gradient given down the
// expert's rows in canonical order, fp32 from 0 with one rounded add per row (the bias_gradients step, a window at a
// time, into the executor's own sums), reading the values the weight gradient's GEMM reads (add_columns: dy, dg, du
// as stored, in MXFP8 as quantised down the tokens), as the host executor's add_tile; zero_gradients and
// write_gradients zero and write those sums (split_gradient_parts).
#pragma once

#include <cstdint>

#include "core/compute_tasks.hpp"
#include "core/split_pass.hpp"
#include "core/split_plan.hpp"

namespace mok::core {

// The layer's biases as the plan takes them (SplitCall::biases).
MOK_HD inline uint8_t split_bias_mask(const LayerWeights& w) {
  uint8_t mask = 0;
  for (GroupedGemm kind : {GroupedGemm::gate, GroupedGemm::up, GroupedGemm::down})
    if (split_bias(w, kind)) mask |= split_bias_bit(kind);
  return mask;
}

// The SplitCall of a pass over view v with the caller's gradients g (bf16 weight gradients where g.gate is given).
MOK_HD inline SplitCall split_call(const PassView& v, const SplitGradients& g, bool block_scaled) {
  bool backward = is_backward(v.kind);
  return SplitCall{v.w.shared_router != nullptr, backward && g.gate != nullptr, block_scaled, split_bias_mask(v.w),
                   backward && (g.gate_bias || g.up_bias || g.down_bias)};
}

// Schedule row `row` of the add_bias step of `kind`: columns col0, col0 + step, ... of the GEMM's fp32 product plus
// the row's expert's bias, rounded to bf16 into the kind's D. Padding rows and rows past the schedule's end are in no
// problem: left alone.
MOK_HD inline void add_bias_row(const PassView& v, const SplitTargets& t, GroupedGemm kind, int64_t row, int col0,
                                int step) {
  int expert = routed_row_expert(v.s, v.sched, row);
  if (expert < 0) return;
  bool down = kind == GroupedGemm::down;
  int width = down ? v.s.hidden : v.s.intermediate;
  const float* sum =
      down ? t.dx_partial + (row % out_ring_rows(v.s)) * width : t.biased + (row % v.s.macrobatch) * width;
  bf16_t* out = down ? out_row(v, row) : ring_row(v, kind == GroupedGemm::gate ? v.ring_g : v.ring_u, row, width);
  const bf16_t* bias = expert_bias(split_bias(v.w, kind), expert, width, 0);
  for (int col = col0; col < width; col += step) out[col] = float_to_bf16(add_rn(sum[col], bf16_to_float(bias[col])));
}

// Items of a bias_gradients step: each local expert's columns of each bias gradient given (gate's I, up's I, down's H).
MOK_HD inline int64_t bias_gradient_items(const LayerShape& s, const SplitGradients& g) {
  int64_t columns =
      (g.gate_bias ? s.intermediate : 0) + (g.up_bias ? s.intermediate : 0) + (g.down_bias ? s.hidden : 0);
  return columns * s.experts_per_rank;
}

// Item i of the bias_gradients step over window w: one expert's sum of one column of one bias gradient, continued down
// the expert's rows in the window, tile by tile and each tile's rows in order: the expert's rows in canonical order,
// window after window, so the sum is the host's.
MOK_HD inline void bias_gradient_item(const PassView& v, const SplitTargets& t, const SplitGradients& g,
                                      const RowWindow& w, int64_t i) {
  int h = v.s.hidden, in = v.s.intermediate;
  int64_t columns = bias_gradient_items(v.s, g) / v.s.experts_per_rank;
  int expert = static_cast<int>(i / columns);
  i %= columns;
  int matrix = 1;  // add_tile's numbering: 0 down (dy), 1 gate (dg), 2 up (du)
  if (!g.gate_bias || i >= in) {
    i -= g.gate_bias ? in : 0;
    matrix = g.up_bias && i < in ? 2 : 0;
    i -= matrix == 0 && g.up_bias ? in : 0;
  }
  ExpertRows rows = window_rows(v.sched, expert, w);
  if (rows.rows == 0) return;
  int width = matrix == 0 ? h : in;
  float* sums = matrix == 0 ? t.bias_down : (matrix == 1 ? t.bias_gate : t.bias_up);
  // Each ring by name: a member picked at run time would take the view's address, and the device would stack it.
  auto column = [&](int64_t row0) {
    switch (matrix) {
      case 0: return ring_columns(v, v.ring_dy, v.mx_dy, row0, h);
      case 1: return ring_columns(v, v.ring_g, v.mx_g, row0, in);
      default: return ring_columns(v, v.ring_u, v.mx_u, row0, in);
    }
  };
  int64_t pad = v.s.expert_padding, at = static_cast<int64_t>(expert) * width + i;
  float sum = sums[at];  // in a register over the window's rows, as add_columns keeps its sum
  for (int64_t tile = rows.first / pad; tile * pad < rows.first + rows.rows; ++tile) {
    Operand a = column(tile * pad);
    int n = tile_rows(v.s, v.sched, tile, expert);
    for (int k = 0; k < n; ++k) sum = add_rn(sum, stored_value(a, i, k));
  }
  sums[at] = sum;
}

}  // namespace mok::core
