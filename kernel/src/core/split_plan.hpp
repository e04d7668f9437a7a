// The split executor's pass (issue #12) as data: the fixed sequence of launches one pass makes on one stream.
// It depends on the shape, the pass kind and the row-buffer periods only, never on the routing, so the host
// never reads the schedule and a pass is a CUDA graph of constant topology. Each launch covers a window of
// schedule rows sized for the worst case (max_recv_rows); a launch reads the schedule on the device and does
// nothing past its total_rows (an empty window costs a launch, not a sync).
//
// Stream order is the only synchronisation inside a rank: a launch starts after the one before it has
// finished, so a ring row is overwritten (by the next window's dispatch, or the next out-window's GEMM) only
// after every launch reading it is done, and no counter is needed between launches.
//
// Windows: ring window i is schedule rows [i P, (i + 1) P) cut at max_recv_rows, P the ring period. The GEMMs
// that write the output ring (down, dgrad_x_*) and the combine that empties it go in out-windows: the ring
// window cut wherever the output ring turns (rows_in_turn). Weight gradients add each ring window's product
// into fp32 sums in window order: canonical row order, no split-K, so a pass is deterministic.
// dx_k's two terms add in fp32 (DESIGN 1), as core's dgrad_x task adds them: dgrad_x_gate leaves its product in
// fp32, and dgrad_x_up adds its own to it and stores bf16 dx.
#pragma once

#include <cstdint>

#include "core/grouped_mx_problems.hpp"
#include "core/grouped_problems.hpp"
#include "core/shape.hpp"
#include "core/tasks.hpp"

namespace mok::core {

enum class SplitStep : int32_t {
  dispatch,         // pull the window's rows into the x ring (and dy in backward), quantised in MXFP8 mode
  gemm,             // one grouped GEMM of `gemm` over the window (grouped_problems.hpp)
  swiglu,           // h from g and u over the window's rows
  swiglu_backward,  // dg, du (and h for dW_down) from dh, g and u
  combine,          // push the window's finished rows (y, or dx in backward) into their home ranks' slots
  barrier,          // the group's closing barrier: every peer has written this rank's slots
  home_sums,        // out, or dx and dw, summed in k order (home_sums.hpp)
  zero_gradients,   // a backward with bf16 weight gradients or a bias gradient: the executor's own fp32 sums set to 0
  write_gradients,  // ... and written out once every product is in (split_pass.hpp, split_gradient_parts)
  dequantise,       // MXFP8: the operands of the `gemm` that follows, as bf16 (split_dequantise.hpp)
  add_bias,         // an expert bias added to the `gemm` before it (gate, up, down), rounded to bf16 (split_bias.hpp)
  bias_gradients,   // the window's rows added to the bias gradients' sums (split_bias.hpp)
  // The shared expert over this rank's tokens (split_shared.hpp); its GEMMs are gemm launches marked shared.
  shared_schedule,         // its one-expert schedule: this call's tokens
  shared_swiglu,           // h from g and u
  shared_swiglu_backward,  // dg, du from dh
  shared_gate_backward,    // gated: the scaled dout and dlogit from the forward's shared output
  shared_gate_dx,          // gated: the gate's term of dx
  shared_router_gradient,  // gated: the router's gradient, tokens in order
  count
};

MOK_HD inline const char* split_step_name(SplitStep step) {
  switch (step) {
    case SplitStep::dispatch: return "dispatch";
    case SplitStep::gemm: return "gemm";
    case SplitStep::swiglu: return "swiglu";
    case SplitStep::swiglu_backward: return "swiglu_backward";
    case SplitStep::combine: return "combine";
    case SplitStep::barrier: return "barrier";
    case SplitStep::home_sums: return "home_sums";
    case SplitStep::zero_gradients: return "zero_gradients";
    case SplitStep::write_gradients: return "write_gradients";
    case SplitStep::dequantise: return "dequantise";
    case SplitStep::add_bias: return "add_bias";
    case SplitStep::bias_gradients: return "bias_gradients";
    case SplitStep::shared_schedule: return "shared_schedule";
    case SplitStep::shared_swiglu: return "shared_swiglu";
    case SplitStep::shared_swiglu_backward: return "shared_swiglu_backward";
    case SplitStep::shared_gate_backward: return "shared_gate_backward";
    case SplitStep::shared_gate_dx: return "shared_gate_dx";
    case SplitStep::shared_router_gradient: return "shared_router_gradient";
    case SplitStep::count: break;
  }
  return "none";
}

struct SplitLaunch {
  SplitStep step;
  GroupedGemm gemm;  // the grouped GEMM of a gemm step (GroupedGemm::count otherwise)
  RowWindow window;  // schedule rows (empty for barrier, home_sums and the shared expert's launches)
  bool shared;       // a gemm step of the shared expert (split_shared.hpp: its one window, its buffers)
};

// A backward that keeps the forward's x, g and u needs them all in one ring turn for every routing.
MOK_HD inline bool split_keeps_ring(const LayerShape& s, const RowPeriods& p) {
  return max_recv_rows(s) <= p.ring;
}

// A forward GEMM's bit in SplitCall::biases (gate 1, up 2, down 4; 0 for any other kind).
MOK_HD inline uint8_t split_bias_bit(GroupedGemm kind) {
  return mx_forward_kind(kind) ? static_cast<uint8_t>(1u << static_cast<int>(kind)) : 0;
}

// Whether `kind`'s GEMM in a pass of this layer reads dequantised operands (split_dequantise.hpp): in MXFP8 every kind
// but the block-scaled ones (mx_block_scaled_kind: the forward's, dgrad_h), and those too where the device has no
// block-scaled MMA (`block_scaled` false: sm_90a) or where an expert bias needs the fp32 product (`biased`: the
// block-scaled unit writes bf16). The shared expert is bf16 in both precisions.
MOK_HD inline bool split_dequantises(const LayerShape& s, GroupedGemm kind, bool block_scaled, bool biased) {
  return s.mxfp8 && (!block_scaled || !mx_block_scaled_kind(kind) || biased);
}

// Appends to a caller's array, or only counts with a null one (the same walk sizes and fills it). A routed GEMM that
// reads dequantised operands gets its dequantise step first, one with an expert bias its add_bias step after.
struct SplitPlanWriter {
  SplitLaunch* out;
  int64_t count;
  LayerShape shape;
  bool block_scaled;
  uint8_t biases;
  MOK_HD void add(SplitStep step, GroupedGemm gemm, RowWindow window, bool shared) {
    if (out) out[count] = SplitLaunch{step, gemm, window, shared};
    ++count;
  }
  MOK_HD void add(SplitStep step, RowWindow window) { add(step, GroupedGemm::count, window, false); }
  MOK_HD void add(GroupedGemm gemm, RowWindow window) {
    bool biased = (biases & split_bias_bit(gemm)) != 0;
    if (split_dequantises(shape, gemm, block_scaled, biased)) add(SplitStep::dequantise, gemm, window, false);
    add(SplitStep::gemm, gemm, window, false);
    if (biased) add(SplitStep::add_bias, gemm, window, false);
  }
  MOK_HD void add(SplitStep step) { add(step, GroupedGemm::count, RowWindow{0, 0}, false); }
  MOK_HD void add_shared(GroupedGemm gemm) { add(SplitStep::gemm, gemm, RowWindow{0, 0}, true); }
};

// The out-windows of ring window w: the GEMMs `first` (and `second`, unless count) into the output ring,
// then the combine that pushes those rows home.
MOK_HD inline void add_out_windows(SplitPlanWriter& plan, const RowPeriods& p, const RowWindow& w, GroupedGemm first,
                                   GroupedGemm second) {
  int64_t end = w.row0 + w.rows;
  for (int64_t row0 = w.row0; row0 < end;) {
    int64_t left = rows_in_turn(first, p, row0), rows = left < end - row0 ? left : end - row0;
    RowWindow out{row0, rows};
    plan.add(first, out);
    if (second != GroupedGemm::count) plan.add(second, out);
    plan.add(SplitStep::combine, out);
    row0 += rows;
  }
}

MOK_HD inline void add_forward_window(SplitPlanWriter& plan, const RowPeriods& p, const RowWindow& w) {
  plan.add(SplitStep::dispatch, w);
  plan.add(GroupedGemm::gate, w);
  plan.add(GroupedGemm::up, w);
  plan.add(SplitStep::swiglu, w);
  add_out_windows(plan, p, w, GroupedGemm::down, GroupedGemm::count);
}

MOK_HD inline void add_backward_window(SplitPlanWriter& plan, const RowPeriods& p, const RowWindow& w, bool kept,
                                       bool bias_gradients) {
  plan.add(SplitStep::dispatch, w);
  if (!kept) {
    plan.add(GroupedGemm::gate, w);
    plan.add(GroupedGemm::up, w);
  }
  plan.add(GroupedGemm::dgrad_h, w);
  plan.add(SplitStep::swiglu_backward, w);
  if (bias_gradients) plan.add(SplitStep::bias_gradients, w);
  plan.add(GroupedGemm::wgrad_down, w);
  plan.add(GroupedGemm::wgrad_gate, w);
  plan.add(GroupedGemm::wgrad_up, w);
  add_out_windows(plan, p, w, GroupedGemm::dgrad_x_gate, GroupedGemm::dgrad_x_up);
}

// The shared expert's launches (split_shared.hpp), as run_shared's steps: g and u (recomputed in the backward, as
// the host executor does), h; forward the output; backward dh from dout (the gated one from bf16(s dout), which
// needs the forward's output first), dg and du, dx's two terms (and the gate's), then the weight gradients.
MOK_HD inline void add_shared_launches(SplitPlanWriter& plan, bool backward, bool gated) {
  plan.add(SplitStep::shared_schedule);
  plan.add_shared(GroupedGemm::gate);
  plan.add_shared(GroupedGemm::up);
  plan.add(SplitStep::shared_swiglu);
  if (!backward || gated) plan.add_shared(GroupedGemm::down);
  if (!backward) return;
  if (gated) plan.add(SplitStep::shared_gate_backward);
  plan.add_shared(GroupedGemm::dgrad_h);
  plan.add(SplitStep::shared_swiglu_backward);
  plan.add_shared(GroupedGemm::dgrad_x_gate);
  plan.add_shared(GroupedGemm::dgrad_x_up);
  if (gated) {
    plan.add(SplitStep::shared_gate_dx);
    plan.add(SplitStep::shared_router_gradient);
  }
  plan.add_shared(GroupedGemm::wgrad_down);
  plan.add_shared(GroupedGemm::wgrad_gate);
  plan.add_shared(GroupedGemm::wgrad_up);
}

// What of a call the plan depends on besides the shape: whether the shared expert has a router
// (weights.shared_router), whether a backward writes bf16 weight gradients (no fp32 main_grad), in MXFP8 whether
// the device has block-scaled MMA (split_dequantises), which forward GEMMs add an expert bias
// (split_bias_bit's), and whether a backward writes a bias gradient.
struct SplitCall {
  bool gated;
  bool bf16_gradients;
  bool block_scaled;
  uint8_t biases;
  bool bias_gradients;
};

// The launches of one pass of `kind`, in stream order, into `out` (null: count only); returns their number,
// or -1 when the pass cannot be planned: a period that is not a positive multiple of the tile height, or
// backward_kept where the ring cannot keep every routing's rows (split_keeps_ring).
MOK_HD inline int64_t split_plan(const LayerShape& s, PassKind kind, const RowPeriods& p, const SplitCall& call,
                                 SplitLaunch* out) {
  int64_t pad = s.expert_padding;
  if (pad <= 0 || p.ring <= 0 || p.out <= 0 || p.ring % pad || p.out % pad) return -1;
  bool kept = kind == PassKind::backward_kept;
  if (kept && !split_keeps_ring(s, p)) return -1;
  SplitPlanWriter plan{out, 0, s, call.block_scaled, call.biases};
  bool bias_gradients = is_backward(kind) && call.bias_gradients;
  bool own_sums = (is_backward(kind) && call.bf16_gradients) || bias_gradients;  // zeroed first, written last
  if (own_sums) plan.add(SplitStep::zero_gradients);
  // The shared expert needs nothing from peers; recompute rebuilds only the routed experts' y slots.
  if (s.shared_intermediate > 0 && kind != PassKind::recompute)
    add_shared_launches(plan, is_backward(kind), call.gated);
  int64_t rows = max_recv_rows(s);
  for (int64_t row0 = 0; row0 < rows; row0 += p.ring) {
    RowWindow w{row0, rows - row0 < p.ring ? rows - row0 : p.ring};
    if (is_backward(kind))
      add_backward_window(plan, p, w, kept, bias_gradients);
    else
      add_forward_window(plan, p, w);
  }
  if (own_sums) plan.add(SplitStep::write_gradients);
  plan.add(SplitStep::barrier);
  if (kind != PassKind::recompute) plan.add(SplitStep::home_sums);
  return plan.count;
}

}  // namespace mok::core
