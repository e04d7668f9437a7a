// The split executor's row steps (core/split_plan.hpp's dispatch, swiglu, swiglu_backward and combine), one
// kernel each over one window of schedule rows, the shared expert's row steps, the home sums, and their launchers
// (split_device.hpp). Each runs core's wait-free body of the task the host executor runs (pull_window, swiglu_rows,
// swiglu_backward_rows, push_rows; split_shared.hpp's items), so the bytes are the host's. The launch before a
// step has finished when it starts (stream order), so no counter is waited on or bumped.
//
// The host never reads the schedule: each kernel takes its row count from the segments on the device and does
// nothing past it. A CTA takes one tile at a time (grid-stride over the window's tiles) and its thread 0 runs
// the body: the first GPU path is the host's code, unchanged; the fused executor (issue #14) spreads a tile's
// work over the CTA. Enqueued by enqueue_split_pass (split_pass_device.cpp).
#include "core/comm_tasks.hpp"
#include "core/home_sums.hpp"
#include "core/split_bias.hpp"
#include "core/split_dequantise.hpp"
#include "core/split_pass.hpp"
#include "core/split_shared.hpp"
#include "cuda/split_device.hpp"

namespace mok::cuda {
namespace split_detail {  // named: nvcc names an anonymous one after the file's absolute path (test_repro)

// The view as a device launch sees it: the schedule's row count from its segments.
__device__ core::PassView on_device(core::PassView view) {
  view.sched.total_rows = core::schedule_rows(view.s, view.sched);
  return view;
}

// Calls step(v, tile) for each of the window's tiles this CTA takes (grid-stride), on its thread 0.
template <class Step>
__device__ void each_tile(const core::PassView& view, const core::RowWindow& window, Step step) {
  if (threadIdx.x != 0) return;
  core::PassView v = on_device(view);
  core::SplitTiles tiles = core::split_window_tiles(v, window);
  for (int64_t tile = tiles.first + blockIdx.x; tile < tiles.end; tile += gridDim.x) step(v, tile);
}

}  // namespace split_detail
using namespace split_detail;

// The window's rows pulled into the ring, quantised in MXFP8 mode; `staging` holds mx_staging_values bf16 per CTA.
__global__ void dispatch_window(core::PassView view, core::RowWindow window, core::bf16_t* staging,
                                int64_t staging_values) {
  each_tile(view, window, [&](const core::PassView& v, int64_t tile) {
    int64_t pad = v.s.expert_padding;
    core::pull_window(v, tile * pad, (tile + 1) * pad, staging + blockIdx.x * staging_values);
  });
}

// h from g and u over the window's tiles; `staging`: mx_swiglu_staging_values bf16 per CTA.
__global__ void swiglu_window(core::PassView view, core::RowWindow window, core::bf16_t* staging,
                              int64_t staging_values) {
  each_tile(view, window, [&](const core::PassView& v, int64_t tile) {
    core::swiglu_rows(v, core::split_tile(v, core::TaskKind::swiglu, tile), staging + blockIdx.x * staging_values);
  });
}

// dg, du and h from dh, g and u over the window's tiles.
__global__ void swiglu_backward_window(core::PassView view, core::RowWindow window, core::bf16_t* staging,
                                       int64_t staging_values) {
  each_tile(view, window, [&](const core::PassView& v, int64_t tile) {
    core::swiglu_backward_rows(v, core::split_tile(v, core::TaskKind::swiglu_bwd, tile),
                               staging + blockIdx.x * staging_values);
  });
}

// The window's finished rows (y, or dx in backward) pushed into their home ranks' slots.
__global__ void combine_window(core::PassView view, core::RowWindow window) {
  each_tile(view, window, [&](const core::PassView& v, int64_t tile) {
    int64_t pad = v.s.expert_padding;
    core::push_rows(v, tile * pad, (tile + 1) * pad);
  });
}

// The home rank's k-order sums (core/home_sums.hpp), a thread per token: out, or dx and dw.
__global__ void home_sums_forward(core::PassView view, const float* topk_weights, core::bf16_t* out) {
  int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t < view.tokens) core::combine_forward_token(view, t, topk_weights, out);
}

__global__ void home_sums_backward(core::PassView view, const core::bf16_t* dout, core::bf16_t* dx, float* dw) {
  int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t < view.tokens) core::combine_backward_token(view, t, dout, dx, dw);
}

// A shared-expert row step (core/split_shared.hpp), a thread per item: a token, an element of the router's
// gradient, or the one-expert schedule.
__global__ void shared_rows(core::PassView view, core::SplitShared shared, float* router, core::SplitStep step,
                            int64_t items) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < items) core::shared_step_item(view, shared, router, step, i);
}

// A bf16-gradient backward's sums zeroed (before the first weight-gradient GEMM) or written out as bf16 (after the
// last), a thread per element.
__global__ void gradient_items(core::GradientParts parts, int64_t items, bool write) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < items) core::gradient_item(parts, i, write);
}

// MXFP8: the window's rows of A (and of a weight gradient's B) dequantised into their ring rows of the scratch, a CTA
// per row at a time (grid-stride), its threads across the row's columns (core/split_dequantise.hpp).
__global__ void dequantise_rows(core::PassView view, core::GroupedGemm kind, core::RowWindow window,
                                core::SplitDequantised scratch) {
  core::PassView v = on_device(view);
  for (int64_t r = blockIdx.x; r < window.rows; r += gridDim.x) {
    core::dequantise_ring_row(v, kind, false, window.row0 + r, threadIdx.x, blockDim.x, scratch.a);
    if (core::is_wgrad(kind))
      core::dequantise_ring_row(v, kind, true, window.row0 + r, threadIdx.x, blockDim.x, scratch.b);
  }
}

// ... and the experts' weights of the kind's B into scratch.b, a thread per element (grid-stride).
__global__ void dequantise_weights(core::PassView view, core::GroupedGemm kind, int64_t items, core::bf16_t* scratch) {
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items; i += stride)
    core::dequantise_weight_item(view, kind, i, scratch);
}

// An expert bias added to the window's rows of the GEMM `kind` before it and rounded (core/split_bias.hpp), a CTA per
// row at a time (grid-stride), its threads across the row's columns.
__global__ void add_bias_rows(core::PassView view, core::SplitTargets targets, core::GroupedGemm kind,
                              core::RowWindow window) {
  core::PassView v = on_device(view);
  for (int64_t r = blockIdx.x; r < window.rows; r += gridDim.x)
    core::add_bias_row(v, targets, kind, window.row0 + r, threadIdx.x, blockDim.x);
}

// The window's rows added to the bias gradients' sums, a thread per expert and column of each.
__global__ void bias_gradient_columns(core::PassView view, core::SplitTargets targets, core::SplitGradients gradients,
                                      core::RowWindow window, int64_t items) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  core::PassView v = on_device(view);
  if (i < items) core::bias_gradient_item(v, targets, gradients, window, i);
}

// ---- launchers: one thread per CTA runs a tile's body (each_tile), so a row step's CTAs are small ----

namespace split_detail {
constexpr int kRowStepThreads = 32;
constexpr int kItemThreads = 128;            // a thread per item: the home sums, the shared rows, the bf16 gradients
constexpr int64_t kMaxItemBlocks = 1 << 16;  // a grid-stride item kernel's CTAs at most (dequantise_weights)

// CTAs of kItemThreads for `items` threads.
int64_t item_blocks(int64_t items) {
  return (items + kItemThreads - 1) / kItemThreads;
}
}  // namespace split_detail

cudaError_t launch_dispatch(const SplitDevice& d, const core::RowWindow& window) {
  dispatch_window<<<d.ctas, kRowStepThreads, 0, d.stream>>>(d.view, window, d.staging, d.staging_values);
  return cudaGetLastError();
}

cudaError_t launch_swiglu(const SplitDevice& d, const core::RowWindow& window) {
  swiglu_window<<<d.ctas, kRowStepThreads, 0, d.stream>>>(d.view, window, d.staging, d.staging_values);
  return cudaGetLastError();
}

cudaError_t launch_swiglu_backward(const SplitDevice& d, const core::RowWindow& window) {
  swiglu_backward_window<<<d.ctas, kRowStepThreads, 0, d.stream>>>(d.view, window, d.staging, d.staging_values);
  return cudaGetLastError();
}

cudaError_t launch_combine(const SplitDevice& d, const core::RowWindow& window) {
  combine_window<<<d.ctas, kRowStepThreads, 0, d.stream>>>(d.view, window);
  return cudaGetLastError();
}

cudaError_t launch_home_sums(const SplitDevice& d) {
  int tokens = d.view.tokens;
  if (tokens == 0) return cudaSuccess;
  int blocks = static_cast<int>(item_blocks(tokens));
  if (core::is_backward(d.view.kind))
    home_sums_backward<<<blocks, kItemThreads, 0, d.stream>>>(d.view, d.dout, d.dx, d.dw);
  else
    home_sums_forward<<<blocks, kItemThreads, 0, d.stream>>>(d.view, d.topk_weights, d.out);
  return cudaGetLastError();
}

cudaError_t launch_shared_rows(const SplitDevice& d, core::SplitStep step) {
  int64_t items = core::shared_step_items(d.view, step);
  if (items == 0) return cudaSuccess;
  int blocks = static_cast<int>(item_blocks(items));
  shared_rows<<<blocks, kItemThreads, 0, d.stream>>>(d.view, d.shared, d.targets.wgrad_shared_router, step, items);
  return cudaGetLastError();
}

cudaError_t launch_gradients(const SplitDevice& d, bool write) {
  core::GradientParts parts = core::split_gradient_parts(d.view.s, d.view.w.shared_router != nullptr,
                                                         d.gradients.gate != nullptr, d.targets, d.gradients);
  int64_t items = core::gradient_items(parts);
  if (items == 0) return cudaSuccess;
  int64_t blocks = item_blocks(items);  // at most 2^31 - 1: a grid's x extent
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  gradient_items<<<static_cast<unsigned>(blocks), kItemThreads, 0, d.stream>>>(parts, items, write);
  return cudaGetLastError();
}

cudaError_t launch_dequantise(const SplitDevice& d, core::GroupedGemm kind, const core::RowWindow& window) {
  if (window.rows > 0) dequantise_rows<<<d.ctas, kItemThreads, 0, d.stream>>>(d.view, kind, window, d.dequantised);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  int64_t items = core::dequantise_weight_items(d.view.s, kind);
  if (items == 0) return cudaSuccess;
  int64_t blocks = item_blocks(items) < kMaxItemBlocks ? item_blocks(items) : kMaxItemBlocks;
  dequantise_weights<<<static_cast<unsigned>(blocks), kItemThreads, 0, d.stream>>>(d.view, kind, items,
                                                                                   d.dequantised.b);
  return cudaGetLastError();
}

cudaError_t launch_add_bias(const SplitDevice& d, core::GroupedGemm kind, const core::RowWindow& window) {
  if (window.rows == 0) return cudaSuccess;
  add_bias_rows<<<d.ctas, kItemThreads, 0, d.stream>>>(d.view, d.targets, kind, window);
  return cudaGetLastError();
}

cudaError_t launch_bias_gradients(const SplitDevice& d, const core::RowWindow& window) {
  int64_t items = core::bias_gradient_items(d.view.s, d.gradients);
  if (items == 0 || window.rows == 0) return cudaSuccess;
  bias_gradient_columns<<<static_cast<unsigned>(item_blocks(items)), kItemThreads, 0, d.stream>>>(
      d.view, d.targets, d.gradients, window, items);
  return cudaGetLastError();
}

}  // namespace mok::cuda
