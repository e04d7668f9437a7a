// The shared expert in the split pass: a layer of one expert of width I_s over this rank's own tokens, run by the
// routed experts' grouped GEMM kinds, layouts and problems (grouped_problems.hpp) over a one-expert schedule whose
// only segment is the rank's tokens, and by core's row functions (tile.hpp, compute_tasks.hpp) for SwiGLU and the
// gate. Its rows are tokens: no ring, no peer, one window of every token the layer may hold, so its buffers are
// token-indexed ([shared_rows(s), width]) and the pass reads the count of this call's tokens where it runs.
//
// The sums are the host executor's (run_shared) term for term: each output element in the same order, the gate's
// dot and router gradient over tokens in order, and each weight gradient one fp32 sum over the tokens in order from
// 0 (the host carries it across its chunks) added once to main_grad.
#pragma once

#include <cstdint>

#include "core/compute_tasks.hpp"
#include "core/home_sums.hpp"
#include "core/split_pass.hpp"
#include "core/split_plan.hpp"

namespace mok::core {

// Rows of every shared buffer: the layer's most tokens, padded to the tile height.
MOK_HD inline int64_t shared_rows(const LayerShape& s) {
  return static_cast<int64_t>(align_up(static_cast<size_t>(s.max_tokens), static_cast<size_t>(s.expert_padding)));
}

// The shared expert as a layer of one expert of width I_s (the grouped problems read only these fields).
MOK_HD inline LayerShape shared_expert_shape(const LayerShape& s) {
  LayerShape shared = s;
  shared.experts_per_rank = 1;
  shared.intermediate = s.shared_intermediate;
  return shared;
}

MOK_HD inline RowPeriods shared_periods(const LayerShape& s) {
  return RowPeriods{shared_rows(s), shared_rows(s)};
}

// The one window every shared launch covers.
MOK_HD inline RowWindow shared_window(const LayerShape& s) {
  return RowWindow{0, shared_rows(s)};
}

// The split executor's shared buffers: g, u, h, dh [shared_rows, I_s] bf16 (dg, du in g, u after the SwiGLU
// backward); in the gated backward the scaled dout [shared_rows, H] bf16 and dlogit [shared_rows] fp32; dx's first
// term [shared_rows, H] fp32; schedule [2] int32, the one expert's row count and first row.
struct SplitShared {
  bf16_t *g, *u, *h, *dh, *scaled;
  float *dlogit, *dx_partial;
  int32_t* schedule;
};

// The one-expert schedule over `tokens` rows (the executor writes its two entries before the pass's GEMMs).
MOK_HD inline void write_shared_schedule(int32_t* schedule, int tokens) {
  schedule[0] = tokens;
  schedule[1] = 0;
}

MOK_HD inline Schedule shared_schedule(const LayerShape& s, const SplitShared& b, int tokens) {
  int64_t rows = static_cast<int64_t>(align_up(static_cast<size_t>(tokens), static_cast<size_t>(s.expert_padding)));
  return Schedule{b.schedule, nullptr, rows};
}

// The dout the shared expert's backward reads: the gated one's bf16(s_t dout_t), else the layer's dout.
MOK_HD inline const bf16_t* shared_dout(const PassView& v, const SplitShared& b) {
  return v.w.shared_router ? b.scaled : peer_array<const bf16_t>(v, v.s.rank, v.peer.dout);
}

// The shared expert's operands for each kind (the table of split_gemm_operands, with the shared buffers): the
// output (forward) and its input gradient (backward) go to the view's shared_out, which the home sums read.
MOK_HD inline SplitGemmOperands shared_gemm_operands(const PassView& v, GroupedGemm kind, const SplitShared& b,
                                                     const SplitTargets& t) {
  const LayerWeights& w = v.w;
  const bf16_t* x = peer_array<const bf16_t>(v, v.s.rank, v.peer.x);
  switch (kind) {
    case GroupedGemm::gate: return {x, w.shared_gate, b.g, nullptr, nullptr, SplitResult::store_bf16};
    case GroupedGemm::up: return {x, w.shared_up, b.u, nullptr, nullptr, SplitResult::store_bf16};
    case GroupedGemm::down: return {b.h, w.shared_down, v.shared_out, nullptr, nullptr, SplitResult::store_bf16};
    case GroupedGemm::dgrad_h:
      return {shared_dout(v, b), w.shared_down, b.dh, nullptr, nullptr, SplitResult::store_bf16};
    case GroupedGemm::dgrad_x_gate: return {b.g, w.shared_gate, nullptr, b.dx_partial, nullptr, SplitResult::store_f32};
    case GroupedGemm::dgrad_x_up:
      return {b.u, w.shared_up, v.shared_out, nullptr, b.dx_partial, SplitResult::add_source_bf16};
    case GroupedGemm::wgrad_down:
      return {shared_dout(v, b), b.h, nullptr, t.wgrad_shared_down, nullptr, SplitResult::accumulate_f32};
    case GroupedGemm::wgrad_gate: return {b.g, x, nullptr, t.wgrad_shared_gate, nullptr, SplitResult::accumulate_f32};
    case GroupedGemm::wgrad_up: return {b.u, x, nullptr, t.wgrad_shared_up, nullptr, SplitResult::accumulate_f32};
    case GroupedGemm::count: break;
  }
  return {nullptr, nullptr, nullptr, nullptr, nullptr, SplitResult::store_bf16};
}

// ---- the row steps, one token each (a device thread per token, or the host's loop) ----

MOK_HD inline void shared_swiglu_row(const PassView& v, const SplitShared& b, int64_t t) {
  int64_t is = v.s.shared_intermediate;
  swiglu_row(layer_swiglu(v.s, v.sigmoid_table), b.g + t * is, b.u + t * is, static_cast<int>(is), b.h + t * is);
}

// dg, du in place of g, u from dh (h stays: dW_down reads it).
MOK_HD inline void shared_swiglu_backward_row(const PassView& v, const SplitShared& b, int64_t t) {
  int64_t is = v.s.shared_intermediate;
  swiglu_gradient_row(layer_swiglu(v.s, v.sigmoid_table), b.g + t * is, b.u + t * is, b.dh + t * is,
                      static_cast<int>(is));
}

// The gated backward before dh: from the forward's shared output in shared_out, the scaled dout and dlogit.
MOK_HD inline void shared_gate_backward_row(const PassView& v, const SplitShared& b, int64_t t) {
  int64_t h = v.s.hidden;
  const bf16_t* x = peer_array<const bf16_t>(v, v.s.rank, v.peer.x) + t * h;
  const bf16_t* dout = peer_array<const bf16_t>(v, v.s.rank, v.peer.dout) + t * h;
  b.dlogit[t] =
      gate_backward_row(x, v.w.shared_router, dout, v.shared_out + t * h, static_cast<int>(h), b.scaled + t * h);
}

// The gated backward after dx: the gate's term of dx, bf16(dx + dlogit r).
MOK_HD inline void shared_gate_dx_row(const PassView& v, const SplitShared& b, int64_t t) {
  int h = v.s.hidden;
  add_gate_dx_row(b.dlogit[t], v.w.shared_router, h, v.shared_out + t * h);
}

// The router's gradient: element i of the sum of dlogit_t x_t[i] over the tokens in order from 0, added once to dr
// (as the host executor sums it in its accumulator and then adds that to main_grad).
MOK_HD inline void shared_router_gradient_element(const PassView& v, const SplitShared& b, int i, float* dr) {
  int64_t h = v.s.hidden;
  const bf16_t* x = peer_array<const bf16_t>(v, v.s.rank, v.peer.x);
  float sum = 0.0f;
  for (int64_t t = 0; t < v.tokens; ++t) sum = add_rn(sum, mul_rn(b.dlogit[t], bf16_to_float(x[t * h + i])));
  dr[i] = add_rn(dr[i], sum);
}

// ---- what an executor must hold for a pass ----

// Whether the executor's buffers hold everything the pass of v.kind uses: with a shared expert its buffers (the
// gated one's scaled dout and dlogit too), and in a backward dx's first term, each weight gradient's sum and, with
// bf16 gradients, its destination; with expert biases their fp32 products' buffers, and each bias gradient's sum. A
// null one the pass would write through is refused before any launch.
// The first buffer the pass would use that is null, by its field's name ("shared.dh", "wgrad_up",
// "gradients.shared_router", ...); nullptr when there is none.
MOK_HD inline const char* split_missing_buffer(const PassView& v, const SplitCall& call, const SplitTargets& t,
                                               const SplitGradients& g, const SplitShared& sh) {
  bool backward = is_backward(v.kind), shared = v.s.shared_intermediate > 0, gated = shared && call.gated;
  bool gate_up_biased = (call.biases & (split_bias_bit(GroupedGemm::gate) | split_bias_bit(GroupedGemm::up))) != 0;
  bool down_biased = (call.biases & split_bias_bit(GroupedGemm::down)) != 0;
  const struct {
    const void* at;
    const char* name;
    bool used;
  } buffers[] = {{sh.g, "shared.g", shared},
                 {sh.u, "shared.u", shared},
                 {sh.h, "shared.h", shared},
                 {sh.schedule, "shared.schedule", shared},
                 {sh.dh, "shared.dh", shared && backward},
                 {sh.dx_partial, "shared.dx_partial", shared && backward},
                 {sh.scaled, "shared.scaled", gated && backward},
                 {sh.dlogit, "shared.dlogit", gated && backward},
                 {t.dx_partial, "dx_partial", backward || down_biased},
                 {t.biased, "biased", gate_up_biased},
                 {t.bias_gate, "bias_gate", backward && g.gate_bias},
                 {t.bias_up, "bias_up", backward && g.up_bias},
                 {t.bias_down, "bias_down", backward && g.down_bias}};
  for (const auto& b : buffers)
    if (b.used && !b.at) return b.name;
  // The weight gradients' parts in SplitTargets' order: the routed experts', the shared expert's, its router's.
  const char* sums[] = {"wgrad_gate",      "wgrad_up",          "wgrad_down",         "wgrad_shared_gate",
                        "wgrad_shared_up", "wgrad_shared_down", "wgrad_shared_router"};
  const char* grads[] = {"gradients.gate",         "gradients.up",        "gradients.down",
                         "gradients.shared_gate",  "gradients.shared_up", "gradients.shared_down",
                         "gradients.shared_router"};
  SplitGradients weights = g;  // the weight gradients' parts alone, their sums needed with main_grad too
  weights.gate_bias = weights.up_bias = weights.down_bias = nullptr;
  GradientParts parts = split_gradient_parts(v.s, call.gated, true, t, weights);
  for (int i = 0; backward && i < parts.count; ++i) {
    if (!parts.part[i].sums) return sums[i];
    if (call.bf16_gradients && !parts.part[i].grad) return grads[i];
  }
  return nullptr;
}

MOK_HD inline bool split_buffers_complete(const PassView& v, const SplitCall& call, const SplitTargets& t,
                                          const SplitGradients& g, const SplitShared& sh) {
  return split_missing_buffer(v, call, t, g, sh) == nullptr;
}

// ---- a shared row step as items: what a device thread (or the host's loop) does for item i ----

// Items of `step`: tokens for the per-token steps, H for the router gradient, one for the schedule.
MOK_HD inline int64_t shared_step_items(const PassView& v, SplitStep step) {
  if (step == SplitStep::shared_schedule) return 1;
  return step == SplitStep::shared_router_gradient ? v.s.hidden : v.tokens;
}

// Item i of a shared row step; `router` is the router gradient's fp32 sum [H] (shared_router_gradient only).
MOK_HD inline void shared_step_item(const PassView& v, const SplitShared& b, float* router, SplitStep step, int64_t i) {
  switch (step) {
    case SplitStep::shared_schedule: write_shared_schedule(b.schedule, v.tokens); break;
    case SplitStep::shared_swiglu: shared_swiglu_row(v, b, i); break;
    case SplitStep::shared_swiglu_backward: shared_swiglu_backward_row(v, b, i); break;
    case SplitStep::shared_gate_backward: shared_gate_backward_row(v, b, i); break;
    case SplitStep::shared_gate_dx: shared_gate_dx_row(v, b, i); break;
    case SplitStep::shared_router_gradient: shared_router_gradient_element(v, b, static_cast<int>(i), router); break;
    default: break;
  }
}

}  // namespace mok::core
