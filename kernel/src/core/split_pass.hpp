// The split executor's pass over one rank's view (issue #12): split_plan's launches walked in stream order,
// each handed to an executor's Steps, and what every grouped GEMM of the pass reads and writes. An executor
// supplies only how a step computes (kernel launches on a stream, or host loops); which buffer a GEMM reads,
// which tiles a row step covers and the order of the steps are here, once. tests/cpp/test_split_pass runs the
// whole pass with host steps over the host executor's memory and holds it to the host executor's bytes.
//
// The split executor computes with the stock grouped GEMMs of docs/gpu.md (split_supports says which layers): BF16
// operands, or in MXFP8 mode the block-scaled ones (the forward's, dgrad_h) where the device has them and every other
// GEMM over dequantised operands (split_dequantise.hpp); expert biases in their own steps (split_bias.hpp); the shared
// expert's steps are split_shared.hpp's, bf16 in both modes.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/compute_tasks.hpp"
#include "core/gemm.hpp"
#include "core/grouped_mx_problems.hpp"
#include "core/split_dequantise.hpp"
#include "core/split_plan.hpp"

namespace mok::core {

// The multiple of which every width a routed expert's GEMM row or leading dimension spans (H, I) must be: 8 bf16, as
// TMA moves 16-byte rows; in MXFP8 whole 32-code scale blocks, as the block-scaled launcher takes them. The shared
// expert's I_s is bf16 in both precisions: a multiple of 8.
MOK_HD inline int split_width_multiple(const LayerShape& s) {
  return s.mxfp8 ? kMxBlock : 8;
}

// Whether the split pass computes this layer: the widths above, and in MXFP8 every group of a block-scaled GEMM
// starting a 128-row scale tile (mx_tiles_whole: expert_padding a multiple of 128, so the ring, the output ring and
// every window are too).
MOK_HD inline bool split_supports(const LayerShape& s) {
  int m = split_width_multiple(s);
  bool widths = s.hidden % m == 0 && s.intermediate % m == 0 && s.shared_intermediate % 8 == 0;
  bool tiles = !s.mxfp8 || s.expert_padding % kMxScaleRowTile == 0;
  return widths && tiles;
}

// How far a split pass whose GEMMs sum in another order than core's (a GPU's tensor cores) may be from the host
// executor's bytes: the normwise relative difference of out, dx, dw and each weight gradient (less what main_grad
// held). The bf16 roundings are the same and at the same points. The fp32 sums differ in order (a different order
// moves a sum by at most K 2^-22 of its terms, which flips a bf16 rounding by one unit, 2^-8 relative, only where
// the sum lies that close to a rounding boundary) and in two groupings: the GPU's dgrad_x_up adds its product to
// dx's partial once where core continues the partial's sum, and a weight gradient adds each window's product to
// main_grad where the host adds the whole pass's: one more fp32 rounding each, 2^-24 relative. test_split_pass measures
// the pass with every GEMM summed in reverse order against the host in the self-test's BF16 layers (a gated shared
// expert into fp32 main_grad, an ungated one with bf16 gradients): at most 3.0e-4 over seeds 1 to 40 (dx; 2.8e-4 in
// the bf16 layer), 4.8e-4 at most seen on another seed (out), 16x under this bound; and its MXFP8 forward (where a
// g or u a unit off can move h's e4m3 code or its block's scale): out at most 1.3e-4 over seeds 1 to 16, and its
// backward (block-scaled or dequantised forward GEMMs alike) at most 2.3e-4 over seeds 1 to 16; which leaves
// room for an adder that truncates (twice a rounding one's error). The self-test's one_rank stage holds the GPU's pass
// to it; a wrong row, operand or window is an error of order one.
constexpr double kSplitOrderTolerance = 1.0 / 128;

// The measure kSplitOrderTolerance bounds: ||got - want|| / ||want - start|| over n bf16 or fp32 values (start: what
// main_grad held), NaN where only one of a pair is NaN (a value the pass never wrote keeps a fill's NaN).
template <class T>
double normwise_difference(const T* got, const T* want, size_t n, double start = 0) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16_t>, "bf16 or fp32 values");
  auto value = [](T v) {
    if constexpr (std::is_same_v<T, float>)
      return static_cast<double>(v);
    else
      return static_cast<double>(bf16_to_float(v));
  };
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) {
    double g = value(got[i]), w = value(want[i]);
    if (std::isnan(g) != std::isnan(w)) return NAN;
    if (std::isnan(w)) continue;
    diff += (g - w) * (g - w);
    norm += (w - start) * (w - start);
  }
  return std::sqrt(diff / (norm > 0 ? norm : 1));
}

// ---- the row steps: which tiles of a window a launch covers ----

// Tiles [first, end) of the window that hold schedule rows (windows start and end on tile boundaries).
struct SplitTiles {
  int64_t first, end;
};

MOK_HD inline SplitTiles split_window_tiles(const PassView& v, const RowWindow& w) {
  int64_t end = w.row0 + w.rows < v.sched.total_rows ? w.row0 + w.rows : v.sched.total_rows;
  int64_t pad = v.s.expert_padding;
  return SplitTiles{w.row0 / pad, end > w.row0 ? end / pad : w.row0 / pad};
}

// A tile's rows for the row stages (core/compute_tasks.hpp), as its task of `kind` sees them.
MOK_HD inline TileInfo split_tile(const PassView& v, TaskKind kind, int64_t tile) {
  return tile_info(v, Task{kind, 0, static_cast<int32_t>(tile)}, v.s.intermediate);
}

// ---- the grouped GEMMs: every kind's operands in the view's buffers ----

// The split executor's own fp32 buffers, beside the view's: dx's first term (dgrad_x_gate's product, read by
// dgrad_x_up as its source), [out ring rows, H]; the weight gradients' sums [E, I, H], [E, I, H], [E, H, I],
// the shared expert's [I_s, H], [I_s, H], [H, I_s] and its router's [H] (the caller's fp32 main_grad in an
// accumulating backward); with expert biases (split_bias.hpp) gate's and up's fp32 products before their bias,
// ring-shaped [macrobatch, I] (down's go to dx_partial), and the bias gradients' sums [E, I], [E, I], [E, H].
struct SplitTargets {
  float* dx_partial;
  float *wgrad_gate, *wgrad_up, *wgrad_down;
  float *wgrad_shared_gate, *wgrad_shared_up, *wgrad_shared_down, *wgrad_shared_router;
  float* biased;
  float *bias_gate, *bias_up, *bias_down;
};

// ---- a backward's bf16 weight gradients, and the bias gradients ----

// Without main_grad (accumulate off) each weight gradient is bf16 of an fp32 sum over the whole pass, as the host
// executor writes it: the targets are then the split executor's own sums, zeroed before the first weight-gradient
// GEMM (the plan's zero_gradients) and written out as bf16 once every product is in (write_gradients). The caller's
// bf16 gradients: the routed experts' [E, I, H], [E, I, H], [E, H, I], the shared expert's and its router's. The bias
// gradients [E, I], [E, I], [E, H] (each optional: null, none) always go through the executor's own sums, and are
// written as bf16 or added into the caller's fp32 (bias_accumulate), as the host executor writes them.
struct SplitGradients {
  bf16_t *gate, *up, *down;
  bf16_t *shared_gate, *shared_up, *shared_down, *shared_router;
  void *gate_bias, *up_bias, *down_bias;
  bool bias_accumulate;
};

// One sum and its destination: bf16, or fp32 it is added into (accumulate).
struct GradientPart {
  float* sums;
  void* grad;
  int64_t n;
  bool accumulate;
};

// The layer's parts: with bf16 weight gradients the routed experts', the shared expert's with one, its router's when
// gated; then each bias gradient given.
struct GradientParts {
  GradientPart part[10];
  int count;
};

MOK_HD inline GradientParts split_gradient_parts(const LayerShape& s, bool gated, bool bf16_gradients,
                                                 const SplitTargets& t, const SplitGradients& g) {
  int64_t routed = static_cast<int64_t>(s.experts_per_rank) * s.hidden * s.intermediate;
  int64_t shared = static_cast<int64_t>(s.shared_intermediate) * s.hidden;
  int64_t ei = static_cast<int64_t>(s.experts_per_rank) * s.intermediate, eh = ei / s.intermediate * s.hidden;
  GradientParts p{};
  if (bf16_gradients) {
    p.part[p.count++] = GradientPart{t.wgrad_gate, g.gate, routed, false};
    p.part[p.count++] = GradientPart{t.wgrad_up, g.up, routed, false};
    p.part[p.count++] = GradientPart{t.wgrad_down, g.down, routed, false};
    if (shared > 0) {
      p.part[p.count++] = GradientPart{t.wgrad_shared_gate, g.shared_gate, shared, false};
      p.part[p.count++] = GradientPart{t.wgrad_shared_up, g.shared_up, shared, false};
      p.part[p.count++] = GradientPart{t.wgrad_shared_down, g.shared_down, shared, false};
      if (gated) p.part[p.count++] = GradientPart{t.wgrad_shared_router, g.shared_router, s.hidden, false};
    }
  }
  if (g.gate_bias) p.part[p.count++] = GradientPart{t.bias_gate, g.gate_bias, ei, g.bias_accumulate};
  if (g.up_bias) p.part[p.count++] = GradientPart{t.bias_up, g.up_bias, ei, g.bias_accumulate};
  if (g.down_bias) p.part[p.count++] = GradientPart{t.bias_down, g.down_bias, eh, g.bias_accumulate};
  return p;
}

// Elements of all parts: the items of zero_gradients and write_gradients (a device thread each).
MOK_HD inline int64_t gradient_items(const GradientParts& p) {
  int64_t n = 0;
  for (int i = 0; i < p.count; ++i) n += p.part[i].n;
  return n;
}

// Item i: its sum zeroed, or written out (as bf16, or added into the caller's fp32).
MOK_HD inline void gradient_item(const GradientParts& p, int64_t i, bool write) {
  int at = 0;
  while (at < p.count && i >= p.part[at].n) i -= p.part[at++].n;
  if (at == p.count) return;
  const GradientPart& part = p.part[at];
  if (!write)
    part.sums[i] = 0.0f;
  else if (part.accumulate)
    static_cast<float*>(part.grad)[i] = add_rn(static_cast<float*>(part.grad)[i], part.sums[i]);
  else
    static_cast<bf16_t*>(part.grad)[i] = float_to_bf16(part.sums[i]);
}

// What D receives from the GEMM's product P = A B^T over the window's rows of each expert.
enum class SplitResult : int8_t {
  store_bf16,       // D (bf16) = bf16(P): gate, up, down, dgrad_h
  store_f32,        // D (fp32) = P: dgrad_x_gate, dx's first term
  add_source_bf16,  // D (bf16) = bf16(C + P), C fp32: dgrad_x_up, one rounding of dx's two terms
  accumulate_f32,   // D (fp32) = D + P: the weight gradients, one window after another in schedule order
};

// One grouped GEMM's buffers, offsets from grouped_problem: a and b bf16; d bf16 or d_fp32; c_fp32 the source.
struct SplitGemmOperands {
  const bf16_t* a;
  const bf16_t* b;
  bf16_t* d;
  float* d_fp32;
  const float* c_fp32;
  SplitResult result;
};

// The ring holds g and u in the forward and dg and du after the backward's SwiGLU step; ring_h holds dh after
// dgrad_h and h again after the SwiGLU backward (compute_tasks.hpp); the output ring holds y or dx.
MOK_HD inline SplitGemmOperands split_gemm_operands(const PassView& v, GroupedGemm kind, const SplitTargets& t) {
  const LayerWeights& w = v.w;
  switch (kind) {
    case GroupedGemm::gate: return {v.ring_x, w.gate, v.ring_g, nullptr, nullptr, SplitResult::store_bf16};
    case GroupedGemm::up: return {v.ring_x, w.up, v.ring_u, nullptr, nullptr, SplitResult::store_bf16};
    case GroupedGemm::down: return {v.ring_h, w.down, v.ring_y, nullptr, nullptr, SplitResult::store_bf16};
    case GroupedGemm::dgrad_h: return {v.ring_dy, w.down, v.ring_h, nullptr, nullptr, SplitResult::store_bf16};
    case GroupedGemm::dgrad_x_gate: return {v.ring_g, w.gate, nullptr, t.dx_partial, nullptr, SplitResult::store_f32};
    case GroupedGemm::dgrad_x_up:
      return {v.ring_u, w.up, v.ring_y, nullptr, t.dx_partial, SplitResult::add_source_bf16};
    case GroupedGemm::wgrad_down:
      return {v.ring_dy, v.ring_h, nullptr, t.wgrad_down, nullptr, SplitResult::accumulate_f32};
    case GroupedGemm::wgrad_gate:
      return {v.ring_g, v.ring_x, nullptr, t.wgrad_gate, nullptr, SplitResult::accumulate_f32};
    case GroupedGemm::wgrad_up: return {v.ring_u, v.ring_x, nullptr, t.wgrad_up, nullptr, SplitResult::accumulate_f32};
    case GroupedGemm::count: break;
  }
  return {nullptr, nullptr, nullptr, nullptr, nullptr, SplitResult::store_bf16};
}

// A block-scaled GEMM's buffers (mx_block_scaled_kind; grouped_mx_problems.hpp): A the ring's rowwise e4m3 codes,
// a_stride apart, and their row scales (x for gate and up; h for down, in ring_h's bytes, where SwiGLU wrote them; dy
// for dgrad_h); B the experts' weights quantised along K (rowwise; down's colwise form for dgrad_h); D bf16, as the
// BF16 kind's.
struct SplitMxOperands {
  const uint8_t* a;
  int64_t a_stride;
  const uint8_t* a_scales;
  const uint8_t* b;
  const uint8_t* b_scales;
  bf16_t* d;
};

MOK_HD inline SplitMxOperands split_mx_gemm_operands(const PassView& v, GroupedGemm kind) {
  const LayerWeights& w = v.w;
  switch (kind) {
    case GroupedGemm::gate:
      return {v.mx_x.rows, v.mx_x.stride, v.mx_x.row_scales, w.gate_rowwise.data, w.gate_rowwise.scales, v.ring_g};
    case GroupedGemm::up:
      return {v.mx_x.rows, v.mx_x.stride, v.mx_x.row_scales, w.up_rowwise.data, w.up_rowwise.scales, v.ring_u};
    case GroupedGemm::down:
      return {v.mx_h.rows, v.mx_h.stride, v.mx_h.row_scales, w.down_rowwise.data, w.down_rowwise.scales, v.ring_y};
    case GroupedGemm::dgrad_h:
      return {v.mx_dy.rows, v.mx_dy.stride, v.mx_dy.row_scales, w.down_colwise.data, w.down_colwise.scales, v.ring_h};
    default: break;
  }
  return {nullptr, 0, nullptr, nullptr, nullptr, nullptr};
}

// The bias the forward GEMM `kind` adds, [E, N]: gate's and up's [E, I], down's [E, H]; null for another kind or
// without one.
MOK_HD inline const bf16_t* split_bias(const LayerWeights& w, GroupedGemm kind) {
  switch (kind) {
    case GroupedGemm::gate: return w.gate_bias;
    case GroupedGemm::up: return w.up_bias;
    case GroupedGemm::down: return w.down_bias;
    default: return nullptr;
  }
}

// How a pass runs routed GEMM `kind`: MXFP8's block-scaled grouped GEMM over split_mx_gemm_operands (`block_scaled`:
// the device has block-scaled MMA; mx_block_scaled_kind, without an expert bias), else the BF16 one over `bf16`: the
// kind's buffers (split_gemm_operands); where split_dequantises, A and B from the scratch the dequantise step before it
// wrote (split_dequantise.hpp); with a bias (split_bias.hpp), the fp32 product for the add_bias step after it, into
// SplitTargets::biased (gate, up) or dx_partial (down).
struct SplitRoutedGemm {
  bool block_scaled;
  SplitGemmOperands bf16;
};
MOK_HD inline SplitRoutedGemm split_routed_gemm(const PassView& v, GroupedGemm kind, const SplitTargets& t,
                                                const SplitDequantised& scratch, bool block_scaled) {
  bool biased = split_bias(v.w, kind) != nullptr;
  bool dequantised = split_dequantises(v.s, kind, block_scaled, biased);
  if (v.s.mxfp8 && !dequantised) return SplitRoutedGemm{true, SplitGemmOperands{}};
  SplitGemmOperands o = split_gemm_operands(v, kind, t);
  if (dequantised) {
    o.a = scratch.a;
    o.b = scratch.b;
  }
  if (biased) {
    o.d = nullptr;
    o.d_fp32 = kind == GroupedGemm::down ? t.dx_partial : t.biased;
    o.result = SplitResult::store_f32;
  }
  return SplitRoutedGemm{false, o};
}

// One expert's problem as core's tile GEMM (gemm.hpp): A and B each K-major (depth contiguous) or MN-major, as
// grouped_layout says; D at the problem's offset of `d`, bf16 for store_bf16, fp32 for accumulate_f32.
MOK_HD inline Gemm problem_gemm(const GroupedProblem& p, const GroupedLayout& l, const bf16_t* a, const bf16_t* b,
                                void* d, Epilogue epilogue) {
  Gemm g{};
  g.rows = p.m;
  g.cols = p.n;
  g.parts[0] = GemmPart{bf16_operand(a + p.a, l.a_k_major ? l.lda : 1, l.a_k_major ? 1 : l.lda, false),
                        bf16_operand(b + p.b, l.b_k_major ? l.ldb : 1, l.b_k_major ? 1 : l.ldb, false), p.k};
  g.num_parts = 1;
  g.c = epilogue == Epilogue::store_bf16 ? static_cast<void*>(static_cast<bf16_t*>(d) + p.c)
                                         : static_cast<void*>(static_cast<float*>(d) + p.c);
  g.c_stride = l.ldc;
  g.epilogue = epilogue;
  return g;
}

// ---- the pass ----

// Runs launches [0, count) of a split plan in order: steps.dispatch(w), dequantise(kind, w), gemm(kind, w),
// add_bias(kind, w), bias_gradients(w), swiglu(w),
// swiglu_backward(w), combine(w), gradients(write) (zero_gradients, write_gradients), barrier(), home_sums(),
// and the shared expert's shared_gemm(kind) and shared_rows(step) (split_shared.hpp). A step returns false to stop the
// pass (a failure the executor has recorded). Returns the index of the launch that stopped it, or count when all ran.
template <class Steps>
int64_t run_split_pass(const SplitLaunch* launches, int64_t count, Steps& steps) {
  for (int64_t i = 0; i < count; ++i) {
    const SplitLaunch& l = launches[i];
    bool ok = false;
    switch (l.step) {
      case SplitStep::dispatch: ok = steps.dispatch(l.window); break;
      case SplitStep::gemm: ok = l.shared ? steps.shared_gemm(l.gemm) : steps.gemm(l.gemm, l.window); break;
      case SplitStep::swiglu: ok = steps.swiglu(l.window); break;
      case SplitStep::swiglu_backward: ok = steps.swiglu_backward(l.window); break;
      case SplitStep::combine: ok = steps.combine(l.window); break;
      case SplitStep::zero_gradients: ok = steps.gradients(false); break;
      case SplitStep::write_gradients: ok = steps.gradients(true); break;
      case SplitStep::dequantise: ok = steps.dequantise(l.gemm, l.window); break;
      case SplitStep::add_bias: ok = steps.add_bias(l.gemm, l.window); break;
      case SplitStep::bias_gradients: ok = steps.bias_gradients(l.window); break;
      case SplitStep::barrier: ok = steps.barrier(); break;
      case SplitStep::home_sums: ok = steps.home_sums(); break;
      case SplitStep::shared_schedule:
      case SplitStep::shared_swiglu:
      case SplitStep::shared_swiglu_backward:
      case SplitStep::shared_gate_backward:
      case SplitStep::shared_gate_dx:
      case SplitStep::shared_router_gradient: ok = steps.shared_rows(l.step); break;
      case SplitStep::count: break;
    }
    if (!ok) return i;
  }
  return count;
}

}  // namespace mok::core
