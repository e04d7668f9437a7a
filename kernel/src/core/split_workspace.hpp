// The GPU executors' buffers after core's (local_layout) in the caller's workspace. The device's tables, which both
// keep: SwiGLU's sigmoid table, the peer pointers, the group's state (its barriers' formation and epoch,
// core/group_state.hpp) and the fused executor's laid-out task graph. The split executor's own, which the fused
// executor's layer (PassForm::fused) leaves kAbsent: dx's fp32 first term, the weight gradients' fp32 sums (a
// backward with bf16 gradients), the shared expert's buffers, in MXFP8 the dequantised operands' scratch
// (split_dequantise.hpp), the expert biases' fp32 products and gradient sums (split_bias.hpp), the row steps'
// staging and the grouped GEMMs' argument block. Offsets only, from the extras' first byte, so the same layout
// serves the device's workspace and a host test's block; mokLayerGetSizes adds it to core's workspace for the cuda
// and sm100 executors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/group_state.hpp"
#include "core/panel_boxes.hpp"
#include "core/protocol.hpp"
#include "core/split_dequantise.hpp"
#include "core/split_shared.hpp"
#include "core/tasks.hpp"

namespace mok::core {

// The grouped GEMMs' argument block's alignment (the launcher's rule).
constexpr size_t kGemmArgumentAlign = 128;

struct SplitLayout {
  size_t dx_partial;         // fp32 [out_ring_rows, H]
  size_t sums;               // fp32: the routed experts' 3 [E, I, H], the shared expert's 3 [I_s, H], its router's [H]
  size_t shared_bf16;        // bf16 g, u, h, dh [shared_rows, I_s], then scaled [shared_rows, H]
  size_t shared_dlogit;      // fp32 [shared_rows]
  size_t shared_dx_partial;  // fp32 [shared_rows, H]
  size_t shared_schedule;    // int32 [2]
  size_t dequantised_a;      // MXFP8: bf16 [dequantised_a_values] (0 bytes in BF16)
  size_t dequantised_b;      // MXFP8: bf16 [dequantised_b_values]
  size_t biased;             // fp32 [macrobatch, I]: gate's or up's product before its bias
  size_t bias_sums;          // fp32 [E, I], [E, I], [E, H]: the bias gradients' sums
  size_t sigmoid_table;      // fp32 [kSigmoidTableSize]
  size_t staging;            // bf16 [ctas, staging_values]
  size_t peers;              // char* [world]: every rank's peer buffer
  size_t headers;            // PeerHeader* [world]: their headers
  size_t routing_ids;        // const int32_t* [world]: every rank's staged topk ids
  size_t routing_tokens;     // int32 [world]: their token counts
  size_t group;              // GroupState: the barriers' formation and epoch, zero at creation
  size_t fused_graph;        // TaskGraph: the fused executor's laid-out task graph (cuda/fused_pass.hpp)
  size_t panel_maps;         // the fused executor's tensor maps: kPanelMaps a worker (panel_boxes.hpp)
  size_t gemm_arguments;     // gemm_argument_bytes, kGemmArgumentAlign-aligned
  int64_t ctas;              // CTAs of a row step (each has its own staging)
  int64_t staging_values;    // bf16 per CTA (MXFP8's dispatch and SwiGLU; 0 in BF16)
  size_t bytes;              // the extras' size; their first byte must be kGemmArgumentAlign-aligned
};

// The weight-gradient sums' sizes in SplitTargets' order (the shared ones 0 without a shared expert).
MOK_HD inline int64_t gradient_sum_values(const LayerShape& s, int i) {
  int64_t eih = static_cast<int64_t>(s.experts_per_rank) * s.intermediate * s.hidden;
  int64_t sih = static_cast<int64_t>(s.shared_intermediate) * s.hidden;
  return i < 3 ? eih : (i < 6 ? sih : (s.shared_intermediate > 0 ? s.hidden : 0));
}
constexpr int kGradientSums = 7;

MOK_HD inline SplitLayout split_layout(const LayerShape& s, size_t gemm_argument_bytes) {
  SplitLayout l{};
  Carver c;
  size_t h = static_cast<size_t>(s.hidden), is = static_cast<size_t>(s.shared_intermediate);
  size_t rows = s.shared_intermediate > 0 ? static_cast<size_t>(shared_rows(s)) : 0;
  size_t world = static_cast<size_t>(s.world);
  int64_t sums = 0;
  for (int i = 0; i < kGradientSums; ++i) sums += gradient_sum_values(s, i);
  bool own = s.form != PassForm::fused;  // the fused executor's layer holds only the device's tables
  l.dx_partial = c.take_if(own, static_cast<size_t>(out_ring_rows(s)) * h * sizeof(float));
  l.sums = c.take_if(own, static_cast<size_t>(sums) * sizeof(float));
  l.shared_bf16 = c.take_if(own, (4 * rows * is + rows * h) * sizeof(bf16_t));
  l.shared_dlogit = c.take_if(own, rows * sizeof(float));
  l.shared_dx_partial = c.take_if(own, rows * h * sizeof(float));
  l.shared_schedule = c.take_if(own, 2 * sizeof(int32_t));
  l.dequantised_a = c.take_if(own, dequantised_a_values(s) * sizeof(bf16_t));
  l.dequantised_b = c.take_if(own, dequantised_b_values(s) * sizeof(bf16_t));
  l.biased = c.take_if(own, static_cast<size_t>(s.macrobatch) * static_cast<size_t>(s.intermediate) * sizeof(float));
  l.bias_sums = c.take_if(
      own, static_cast<size_t>(s.experts_per_rank) * (2 * static_cast<size_t>(s.intermediate) + h) * sizeof(float));
  l.sigmoid_table = c.take(kSigmoidTableSize * sizeof(float));
  l.ctas = max_tiles(s) < 1024 ? max_tiles(s) : 1024;
  l.staging_values =
      s.mxfp8 && own ? static_cast<int64_t>(max_value(mx_staging_values(s), mx_swiglu_staging_values(s))) : 0;
  l.staging = c.take_if(own, static_cast<size_t>(l.ctas * l.staging_values) * sizeof(bf16_t));
  l.peers = c.take(world * sizeof(char*));
  l.headers = c.take(world * sizeof(PeerHeader*));
  l.routing_ids = c.take(world * sizeof(const int32_t*));
  l.routing_tokens = c.take(world * sizeof(int32_t));
  l.group = c.take(sizeof(GroupState), alignof(GroupState));
  l.fused_graph = c.take(sizeof(TaskGraph), alignof(TaskGraph));
  size_t workers = static_cast<size_t>(s.comm_workers + s.compute_workers);  // a pass runs these or fewer
  l.panel_maps = c.take_if(!own, workers * kPanelMaps * kTensorMapBytes, kTensorMapBytes);
  l.gemm_arguments = c.take_if(own, gemm_argument_bytes, kGemmArgumentAlign);
  l.bytes = c.total();
  return l;
}

// The split executor's buffers at `extras` (laid out by split_layout), as its pass takes them.
struct SplitBuffers {
  float* dx_partial;
  float* sums[kGradientSums];    // in SplitTargets' order
  SplitShared shared;            // all null without a shared expert
  SplitDequantised dequantised;  // all null in BF16
  float* biased;
  float* bias_sums[3];  // gate's, up's, down's
  float* sigmoid_table;
  bf16_t* staging;
  char** peers;
  PeerHeader** headers;
  const int32_t** routing_ids;
  int32_t* routing_tokens;
  GroupState* group;
  TaskGraph* fused_graph;
  void* panel_maps;  // null for the split executor
  void* gemm_arguments;
};

MOK_HD inline SplitBuffers split_buffers_at(const LayerShape& s, const SplitLayout& l, char* extras) {
  auto at = [extras](size_t offset) { return buffer_at(extras, offset); };
  SplitBuffers b{};
  b.dx_partial = reinterpret_cast<float*>(at(l.dx_partial));
  float* sum = reinterpret_cast<float*>(at(l.sums));
  for (int i = 0; sum && i < kGradientSums; ++i) {
    b.sums[i] = gradient_sum_values(s, i) > 0 ? sum : nullptr;
    sum += gradient_sum_values(s, i);
  }
  if (s.shared_intermediate > 0 && l.shared_bf16 != kAbsent) {
    int64_t rows = shared_rows(s), is = s.shared_intermediate;
    bf16_t* first = reinterpret_cast<bf16_t*>(at(l.shared_bf16));
    b.shared = SplitShared{first,
                           first + rows * is,
                           first + 2 * rows * is,
                           first + 3 * rows * is,
                           first + 4 * rows * is,
                           reinterpret_cast<float*>(at(l.shared_dlogit)),
                           reinterpret_cast<float*>(at(l.shared_dx_partial)),
                           reinterpret_cast<int32_t*>(at(l.shared_schedule))};
  }
  if (s.mxfp8)
    b.dequantised = SplitDequantised{reinterpret_cast<bf16_t*>(at(l.dequantised_a)),
                                     reinterpret_cast<bf16_t*>(at(l.dequantised_b))};
  b.biased = reinterpret_cast<float*>(at(l.biased));
  if (float* bias = reinterpret_cast<float*>(at(l.bias_sums))) {
    int64_t ei = static_cast<int64_t>(s.experts_per_rank) * s.intermediate;
    b.bias_sums[0] = bias, b.bias_sums[1] = bias + ei, b.bias_sums[2] = bias + 2 * ei;
  }
  b.sigmoid_table = reinterpret_cast<float*>(at(l.sigmoid_table));
  b.staging = l.staging_values > 0 ? reinterpret_cast<bf16_t*>(at(l.staging)) : nullptr;
  b.peers = reinterpret_cast<char**>(at(l.peers));
  b.headers = reinterpret_cast<PeerHeader**>(at(l.headers));
  b.routing_ids = reinterpret_cast<const int32_t**>(at(l.routing_ids));
  b.routing_tokens = reinterpret_cast<int32_t*>(at(l.routing_tokens));
  b.group = reinterpret_cast<GroupState*>(at(l.group));
  b.fused_graph = reinterpret_cast<TaskGraph*>(at(l.fused_graph));
  b.panel_maps = at(l.panel_maps);
  b.gemm_arguments = at(l.gemm_arguments);
  return b;
}

// The weight gradients' fp32 targets: the caller's main_grad, or (bf16 gradients) the split executor's own sums.
MOK_HD inline SplitTargets split_targets(const SplitBuffers& b, float* const* main_grad, bool bf16_gradients) {
  float* const* t = bf16_gradients ? b.sums : main_grad;
  return SplitTargets{b.dx_partial, t[0], t[1],     t[2],           t[3],           t[4],
                      t[5],         t[6], b.biased, b.bias_sums[0], b.bias_sums[1], b.bias_sums[2]};
}

// Where the extras start in a workspace of the split executor: after core's, on the argument block's alignment.
MOK_HD inline size_t split_extras_offset(const LayerShape& s) {
  return align_up(local_layout(s).bytes, kGemmArgumentAlign);
}

MOK_HD inline size_t split_workspace_bytes(const LayerShape& s, size_t gemm_argument_bytes) {
  return split_extras_offset(s) + split_layout(s, gemm_argument_bytes).bytes;
}

}  // namespace mok::core
