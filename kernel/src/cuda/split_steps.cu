// The split executor's row steps (core/split_plan.hpp's dispatch, swiglu, swiglu_backward and combine), one
// kernel each over one window of schedule rows. Each runs core's wait-free body of the task the host executor
// runs (pull_window, swiglu_rows, swiglu_backward_rows, push_rows), so the bytes are the host's. The launch
// before a step has finished when it starts (stream order), so no counter is waited on or bumped.
//
// The host never reads the schedule: each kernel takes its row count from the segments on the device and does
// nothing past it. A CTA takes one tile at a time (grid-stride over the window's tiles) and its thread 0 runs
// the body: the first GPU path is the host's code, unchanged; the fused executor (issue #14) spreads a tile's
// work over the CTA. Not launched by libmok yet (the split executor's host side is issue #12's next step).
#include "core/comm_tasks.hpp"
#include "core/split_pass.hpp"

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

}  // namespace mok::cuda
