// The fused executor's kernels (fused_pass.hpp): the prologue and the persistent pass kernel.
#include <vector>

#include "core/gemm_element.hpp"
#include "core/pass_worker.hpp"
#include "cuda/driver.hpp"
#include "cuda/fused_pass.hpp"
#include "cuda/resource_note.hpp"
#include "cuda/row_copies.cuh"
#include "cuda/tensor_tile.cuh"

namespace mok::cuda {
namespace fused_detail {  // named: nvcc names an anonymous one after the file's absolute path (test_repro)

constexpr int kThreads = 256;
// At least 2 CTAs an SM: caps the registers at 128 a thread (the budget of core's device code, test_library).
constexpr int kMinCtasPerSm = 2;
// And at most 2: as many as the SM's shared memory holds (228 KB, less 1 KB the system keeps for each CTA), which must
// all hold their tensor memory at once, or a CTA's allocation would wait for another's end, which never comes.
constexpr int kSmSharedBytes = 228 * 1024;
constexpr int ctas_per_sm(int dynamic_shared_bytes) {
  return kSmSharedBytes / (dynamic_shared_bytes + 1024);
}
static_assert(ctas_per_sm(tensor_tile::kDynamicSharedBytes) >= kMinCtasPerSm, "the panels let two CTAs share an SM");
static_assert(ctas_per_sm(tensor_tile::kDynamicSharedBytes) * tensor_tile::kTensorColumns <= 512,
              "every resident CTA's tensor memory at once");
// An MXFP8 layer's pass, whose MMAs take scaled blocks, holds all 512 columns a CTA (tensor_tile::tensor_columns): its
// launch asks for the SM's shared memory less a bf16 pass's panels, which keeps any other fused CTA off the SM, an
// MXFP8 one or a bf16 one (another layer's, on another stream or rank), whose columns would not fit beside it.
constexpr int kScaledDynamicSharedBytes = kSmSharedBytes - tensor_tile::kDynamicSharedBytes;
static_assert(ctas_per_sm(kScaledDynamicSharedBytes) == 1 &&
                  kScaledDynamicSharedBytes >= tensor_tile::kDynamicSharedBytes,
              "an MXFP8 pass's CTA alone on its SM, with the panels");
static_assert((kScaledDynamicSharedBytes + 1024) + (tensor_tile::kDynamicSharedBytes + 1024) > kSmSharedBytes,
              "no bf16 pass's CTA beside an MXFP8 one's");
constexpr int dynamic_shared_bytes(bool scaled) {
  return scaled ? kScaledDynamicSharedBytes : tensor_tile::kDynamicSharedBytes;
}
// The dynamic shared memory the pass kernel asks for, bf16 and MXFP8, where test_library reads it (the first must let
// kMinCtasPerSm CTAs share an SM, the second none).
__attribute__((used)) constexpr Note kResourceNote =
    resource_note("mok_fused ", "pass", tensor_tile::kDynamicSharedBytes, kThreads);
__attribute__((used)) constexpr Note kScaledResourceNote =
    resource_note("mok_fused_scaled ", "pass", kScaledDynamicSharedBytes, kThreads);

using tensor_tile::cta_barrier;

// Thread 0's order to the CTA's threads: a tile GEMM or a row job to share, or the pass is over.
struct Order {
  enum class Work : uint8_t { gemm, rows, stop };
  Work work;
  core::Gemm gemm;
  core::RowJob rows;
};

// A tile GEMM by every thread of the CTA: on tensor cores where core's tensor tile takes it, else an element each;
// fenced at the device's scope, so that thread 0's release after the CTA's barrier publishes every thread's writes to
// the other CTAs whatever the barrier orders. One copy of it, called from core's every GEMM site and the serving loop.
__device__ __noinline__ void compute_tile(const core::Gemm& g, tensor_tile::Storage& tensor, core::PanelStages& stages,
                                          uint64_t timeout_ns) {
  if (core::tensor_gemm(g))
    tensor_tile::compute(g, tensor, stages, timeout_ns);
  else  // an element each
    core::gemm_elements(g, 0, 0, g.rows, g.cols, tensor_tile::cta_part());
  __threadfence();
}

// A row job by every thread but thread 0, as part threadIdx - 1 of blockDim - 1 (core's run_rows: 16-byte pieces of
// each row, neighbouring threads on neighbouring pieces; MXFP8's quantisation a (row, scale block) pair or a column
// each; the rows it copies unchanged as bulk copies by the threads holding row_copies' slots), fenced as
// compute_tile. Thread 0 stays in core's body: a call from there would add this job's frame (pull_rows' cursor per
// rank) to the body's on every thread's stack.
__device__ __noinline__ void share_rows(const core::RowJob& job, const core::PassView& v, row_copies::Slots& slots) {
  bool in_bulk = core::copies_in_bulk(job.work);  // the other jobs' moves need no slot set up or waited for
  row_copies::SlotCopies copies{slots, row_copies::own_slot(), v.timeout_ns};
  if (in_bulk) copies.begin();
  core::run_rows(v, job, core::Part{static_cast<int>(threadIdx.x) - 1, static_cast<int>(blockDim.x) - 1}, copies);
  if (in_bulk) copies.end();
  __threadfence();
}

// The operations of thread 0: every tile GEMM and row job over the CTA's threads (their writes done before the
// second cta_barrier, so thread 0's later release publishes them all). A tensor-core tile whose MMAs did not finish,
// or a row job whose bulk copy did not land, fails the pass. `scratch`: the worker's MXFP8 staging (core's row jobs);
// the tiles take none.
struct CtaOps {
  float* scratch;
  core::bf16_t* chunk;
  float* sums;
  Order* order;                  // shared memory
  tensor_tile::Storage* tensor;  // shared memory
  const core::PassView* view;
  core::PanelStages stages;  // as every thread of the CTA keeps them

  // Nothing more once a wait of the CTA's threads ran out: an MMA or a bulk load that is only late may still use the
  // panels (close gives each kind one more timeout), which the next tile or row job would take.
  __device__ bool failed() const { return tensor->failed || row_copies::slots().failed; }
  __device__ void gemm(const core::Gemm& g) {
    if (failed()) return;
    order->work = Order::Work::gemm;
    order->gemm = g;
    cta_barrier();
    compute_tile(order->gemm, *tensor, stages, view->timeout_ns);
    cta_barrier();
    if (tensor->failed) fail(core::WaitId::tensor_core);
  }
  __device__ void rows(const core::PassView&, const core::RowJob& job) {
    if (failed()) return;
    order->work = Order::Work::rows;
    order->rows = job;
    cta_barrier();  // the other threads run it
    cta_barrier();
    if (row_copies::slots().failed) fail(core::WaitId::row_copy);
  }
  // A wait of the CTA's threads ran out. One call for both orders: inlined twice, thread 0's body spills.
  __device__ __noinline__ void fail(core::WaitId wait) {
    core::fail_pass(*view, core::Failure{core::Outcome::timeout, wait}, nullptr);
  }
  __device__ bool stop_here(const core::PassView&, int64_t, const core::Task*) const { return false; }
};

}  // namespace fused_detail
using namespace fused_detail;

// The schedule's rows, the counters zeroed, the group's failure cleared and the task graph laid out, by one thread
// before the workers start (stream order); the graph and the row count left for them in `graph` and the group state.
__global__ void prepare_fused_pass(core::PassView view, core::TaskGraph* graph) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  view.sched.total_rows = core::schedule_rows(view.s, view.sched);
  view.group->total_rows = view.sched.total_rows;
  core::prepare_workers(view);
  core::lay_out_tasks(view);
  *graph = view.graph;
}

// CTA w is worker w. Thread 0 runs core's body; the others serve its orders until it says the pass is over, each
// with the same view of the pass. The CTA holds its tensor memory from start to end (tensor_tile::open, close).
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
    fused_pass(core::PassView view, core::PassArgs args, const core::TaskGraph* graph, cute::TmaDescriptor* maps) {
  __shared__ core::PassArgs call;
  __shared__ Order order;
  __shared__ tensor_tile::Storage tensor;
  if (threadIdx.x == 0) call = args;
  view.args = &call;
  view.graph = *graph;
  view.sched.total_rows = view.group->total_rows;
  tensor_tile::open(tensor, maps + blockIdx.x * core::kPanelMaps, view.s.mxfp8 != 0);
  row_copies::open(row_copies::slots());
  cta_barrier();
  core::PanelStages stages;
  if (threadIdx.x == 0) {
    int w = static_cast<int>(blockIdx.x);
    CtaOps ops{view.scratch + w * view.scratch_floats,
               core::worker_chunk(view, w),
               core::worker_sums(view, w),
               &order,
               &tensor,
               &view,
               stages};
    core::run_pass_worker(view, w, ops);
    order.work = Order::Work::stop;
    cta_barrier();
  } else {
    for (;;) {
      cta_barrier();
      if (order.work == Order::Work::stop) break;
      if (order.work == Order::Work::rows)
        share_rows(order.rows, view, row_copies::slots());
      else
        compute_tile(order.gemm, tensor, stages, view.timeout_ns);
      cta_barrier();
    }
  }
  tensor_tile::close(tensor, stages, view.timeout_ns);  // warp 1's stages: the serving loop's
  row_copies::close(row_copies::slots(), view.timeout_ns);
}

cudaError_t fused_residency(bool mxfp8, int* ctas) {
  *ctas = 0;
  int device = 0, per_sm = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  // The panels' stages are above the 48 KB of shared memory a kernel may take without asking. Asked for once, at the
  // layer's creation on its device: the attributes stay with the kernel there, and a pass calls no driver to launch.
  // Two CTAs' shared memory takes the SM's largest carve-out (L1 keeps 28 KB): asked for, so that the occupancy the
  // layer reads does not depend on the driver's default.
  auto kernel = reinterpret_cast<const void*>(fused_pass);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kScaledDynamicSharedBytes);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (e == cudaSuccess)
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fused_pass, kThreads, dynamic_shared_bytes(mxfp8));
  if (e == cudaSuccess) *ctas = per_sm * sms;
  return e;
}

cudaError_t write_panel_maps(void* maps, int count, CUresult* encoded) {
  *encoded = CUDA_SUCCESS;
  static DriverApi driver;
  static const DriverLoad load = load_driver_api(&driver);
  if (load.error != cudaSuccess) return load.error;
  if (!driver.cuTensorMapEncodeTiled) return cudaErrorNotSupported;
  // The template: a panel of a K-major operand of kMmaRows rows at `maps` (any address on 16 bytes; each tile's
  // operands replace it, and its dimensions, stride and box, core::PanelMap).
  cute::TmaDescriptor map{};
  cuuint64_t dims[2] = {core::kBoxInner, core::kMmaRows}, stride[1] = {core::kBoxInner * sizeof(core::bf16_t)};
  cuuint32_t box[2] = {core::kBoxInner, core::kMmaRows}, steps[2] = {1, 1};
  *encoded = driver.cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, maps, dims, stride, box, steps,
                                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (*encoded != CUDA_SUCCESS) return cudaErrorInvalidValue;
  std::vector<cute::TmaDescriptor> copies(static_cast<size_t>(count), map);
  return cudaMemcpy(maps, copies.data(), copies.size() * sizeof(map), cudaMemcpyHostToDevice);
}

cudaError_t enqueue_fused_pass(const FusedDevice& d) {
  core::PassView view = d.view;
  view.s = core::fit_workers(view.s, d.resident);
  view.device_barriers = true;
  prepare_fused_pass<<<1, 32, 0, d.stream>>>(view, d.graph);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  // Cooperative: every CTA resident at once (each worker may wait for another), or the launch is refused.
  core::PassArgs args = d.args;
  const core::TaskGraph* graph = d.graph;
  auto* maps = static_cast<cute::TmaDescriptor*>(d.panel_maps);
  void* params[] = {&view, &args, &graph, &maps};
  return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(fused_pass), dim3(core::workers_of(view)),
                                     dim3(kThreads), params, dynamic_shared_bytes(view.s.mxfp8 != 0), d.stream);
}

}  // namespace mok::cuda
