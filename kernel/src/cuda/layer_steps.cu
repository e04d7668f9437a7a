// The cuda executor's kernels outside a pass (cuda_layer.cpp): mokLayerBuildSchedule's and mokLayerGetSlots'. Each
// runs core's functions, so the schedule and the slots are the host executor's bytes.
#include "core/home_sums.hpp"
#include "core/pass_worker.hpp"
#include "core/schedule.hpp"
#include "cuda/split_device.hpp"

namespace mok::cuda {

// One rank's schedule in one CTA: the caller's ids checked (a bad one recorded) and staged as int32 into the own peer
// buffer and the token count into the header and the routing table (core's stage_topk_ids, a thread per id), then
// core's three passes over the routing (count and place a thread per local expert, lay out on thread 0), as the host's
// schedule workers run them.
__global__ void rank_schedule(core::PassView view, const void* ids, bool int64_ids, int tokens, core::Routing routing,
                              int32_t* routing_tokens) {
  const core::LayerShape& s = view.s;
  int32_t* own = core::peer_array<int32_t>(view, s.rank, view.peer.topk_ids);
  for (int64_t i = threadIdx.x, n = static_cast<int64_t>(tokens) * s.top_k; i < n; i += blockDim.x) {
    int64_t id = core::topk_id(ids, int64_ids, i);
    if (!core::valid_topk_id(s, id)) {  // recorded (its flat index t * K + k), and routed nowhere
      core::record_failure(view.error, core::Failure{core::Outcome::rejected_arguments, core::WaitId::none}, s.rank, -1,
                           static_cast<int>(i < 0x7fffffff ? i : -1),
                           "mokLayerBuildSchedule: argument 'topk_ids' holds an id outside -1 and [0, world * "
                           "experts_per_rank) at flat index task_index = token * top_k + k; that route was dropped");
      id = -1;
    }
    own[i] = static_cast<int32_t>(id);
  }
  if (threadIdx.x == 0) {
    core::own_header(view)->tokens = tokens;
    routing_tokens[s.rank] = tokens;
  }
  __syncthreads();
  core::Schedule schedule = view.sched;
  for (int e = threadIdx.x; e < s.experts_per_rank; e += blockDim.x)
    schedule.experts[2 * e] = core::count_expert(s, routing, e);
  __syncthreads();
  if (threadIdx.x == 0) core::lay_out_segments(s, schedule);
  __syncthreads();
  for (int e = threadIdx.x; e < s.experts_per_rank; e += blockDim.x) core::place_expert(s, routing, schedule, e);
}

// The y slots of the current context, a thread per token (core's copy_slots_token).
__global__ void copy_slots(core::PassView view, core::bf16_t* y_slots) {
  int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t < view.tokens) core::copy_slots_token(view, t, y_slots);
}

namespace layer_detail {  // named: nvcc names an anonymous one after the file's absolute path (test_repro)
constexpr int kScheduleThreads = 256;
constexpr int kSlotThreads = 128;
}  // namespace layer_detail
using namespace layer_detail;

cudaError_t launch_rank_schedule(const core::PassView& view, const void* ids, bool int64_ids, int tokens,
                                 const core::Routing& routing, int32_t* routing_tokens, cudaStream_t stream) {
  rank_schedule<<<1, kScheduleThreads, 0, stream>>>(view, ids, int64_ids, tokens, routing, routing_tokens);
  return cudaGetLastError();
}

cudaError_t launch_copy_slots(const core::PassView& view, core::bf16_t* y_slots, cudaStream_t stream) {
  if (view.tokens == 0) return cudaSuccess;
  copy_slots<<<(view.tokens + kSlotThreads - 1) / kSlotThreads, kSlotThreads, 0, stream>>>(view, y_slots);
  return cudaGetLastError();
}

}  // namespace mok::cuda
