// core/ compiled for the device: kernels over core/'s functions that libmok does not launch, built for the Blackwell
// targets (the fused executor's, whose own kernels are fused_pass.cu) so that core/ cannot drift into host-only code:
// MXFP8 quantisation, the split plan, the task graph and the schedule build with a CTA as a worker. (The group's
// barriers the cuda executor launches are in layer_steps.cu.)
#include "core/mxfp8.hpp"
#include "core/pass_worker.hpp"
#include "core/schedule.hpp"
#include "core/split_plan.hpp"

namespace mok::cuda {

// MXFP8 quantisation of [rows, cols] fp32 along cols: one thread per 32-element block.
__global__ void mxfp8_quantize_rowwise(const float* src, int64_t rows, int64_t cols, uint8_t* data, uint8_t* scales) {
  int64_t blocks = (cols + core::kMxBlock - 1) / core::kMxBlock;
  int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b >= rows * blocks) return;
  int64_t r = b / blocks, c0 = (b % blocks) * core::kMxBlock;
  int n = static_cast<int>(cols - c0 < core::kMxBlock ? cols - c0 : core::kMxBlock);
  scales[b] = core::mx_quantize_block(src + r * cols + c0, n, 1, data + r * cols + c0, 1);
}

// The split executor's launch sequence (core/split_plan.hpp), planned on the device: core stays device code.
__global__ void plan_split_pass(core::LayerShape shape, core::PassKind kind, core::RowPeriods periods,
                                core::SplitCall call, core::SplitLaunch* launches, int64_t* count) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *count = core::split_plan(shape, kind, periods, call, launches);
}

// The task graph of a pass, laid out on the device.
__global__ void build_task_graph(core::LayerShape shape, core::PassKind kind, core::Schedule schedule, int tokens,
                                 core::TaskGraph graph, int64_t* counts) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  core::build_task_graph(shape, kind, schedule, tokens, graph);
  counts[0] = graph.num_comm;
  counts[1] = graph.num_compute;
}

// The schedule build, CTA w as worker w.
__global__ void run_schedule_workers(core::PassView view) {
  if (threadIdx.x == 0) core::run_schedule_worker(view, static_cast<int>(blockIdx.x));
}

}  // namespace mok::cuda
