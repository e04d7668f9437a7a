// The cuda executor's kernels outside a pass's row steps (cuda_layer.cpp): mokLayerBuildSchedule's, mokLayerGetSlots',
// the group's barriers and its leaving. Each runs core's functions, so the schedule and the slots are the host
// executor's bytes and the barriers its protocol.
#include "core/group_state.hpp"
#include "core/home_sums.hpp"
#include "core/pass_worker.hpp"
#include "core/schedule.hpp"
#include "cuda/split_device.hpp"

namespace mok::cuda {

// One rank's schedule in one CTA: the caller's ids checked (a bad one recorded) and staged as int32 into the own peer
// buffer and the token count into the header (core's stage_topk_ids, a thread per id); the schedule barrier that
// publishes them to the group; core's three passes over every rank's ids (count and place a thread per local expert,
// lay out on thread 0), as the host's schedule workers run them; the barrier that ends every read of the peers' ids.
// Where the first barrier fails (a peer absent or aborting, this rank's ids refused) no peer's ids are read: every
// rank counts as tokenless, so the schedule is empty and the passes enqueued after it touch no row.
__global__ void rank_schedule(core::PassView view, const void* ids, bool int64_ids, int tokens, core::Routing routing,
                              int32_t* routing_tokens) {
  const core::LayerShape& s = view.s;
  int32_t* own = core::peer_array<int32_t>(view, s.rank, view.peer.topk_ids);
  for (int64_t i = threadIdx.x, n = static_cast<int64_t>(tokens) * s.top_k; i < n; i += blockDim.x) {
    int64_t id = core::topk_id(ids, int64_ids, i);
    if (!core::valid_topk_id(s, id)) {  // recorded (its flat index t * K + k), and routed nowhere
      core::record_failure(
          view.error, core::Failure{core::Outcome::rejected_arguments, core::WaitId::none}, s.rank, -1,
          static_cast<int>(i < 0x7fffffff ? i : -1),
          "mokLayerBuildSchedule: argument 'topk_ids' holds an id outside -1 and [0, world * "
          "experts_per_rank) at flat index task_index = token * top_k + k; that route was dropped (in a "
          "group, this rank left it)");
      id = -1;
    }
    own[i] = static_cast<int32_t>(id);
  }
  if (threadIdx.x == 0) core::own_header(view)->tokens = tokens;
  __threadfence_system();  // every thread's ids before thread 0's arrival publishes them
  __syncthreads();
  __shared__ bool published;
  const core::CallKind call = core::CallKind::build_schedule;
  if (threadIdx.x == 0) published = core::stream_barrier_passed(view, core::WaitId::schedule_barrier, call);
  __syncthreads();
  for (int r = threadIdx.x; r < s.world; r += blockDim.x)
    routing_tokens[r] = !published ? 0 : r == s.rank ? tokens : view.headers[r]->tokens;
  __syncthreads();
  core::Schedule schedule = view.sched;
  for (int e = threadIdx.x; e < s.experts_per_rank; e += blockDim.x)
    schedule.experts[2 * e] = core::count_expert(s, routing, e);
  __syncthreads();
  if (threadIdx.x == 0) core::lay_out_segments(s, schedule);
  __syncthreads();
  for (int e = threadIdx.x; e < s.experts_per_rank; e += blockDim.x) core::place_expert(s, routing, schedule, e);
  __syncthreads();
  if (threadIdx.x == 0) core::stream_barrier_passed(view, core::WaitId::schedule_barrier, call);
}

// A barrier of the pass (the entry barrier after the staging, the closing one before the home sums), one thread.
// Where the entry barrier fails the schedule is emptied: the pass's launches, already enqueued behind it, then pull
// no row from a peer and push none into one (a peer may still be reading its slots of an earlier call).
__global__ void group_barrier(core::PassView view, core::WaitId what, core::CallKind call) {
  if (threadIdx.x != 0 || blockIdx.x != 0 || core::stream_barrier_passed(view, what, call)) return;
  if (what != core::WaitId::entry_barrier) return;
  core::Schedule schedule = view.sched;
  for (int e = 0; e < view.s.experts_per_rank; ++e) schedule.experts[2 * e] = 0;
  core::lay_out_segments(view.s, schedule);
}

// mokLayerAbort, a call this rank refused, or one cut short: the record holds why; the peers are told.
__global__ void leave_group(core::PassView view) {
  const core::LayerShape& s = view.s;
  if (threadIdx.x == 0 && blockIdx.x == 0)
    core::leave_failed(*view.group, view.error, view.headers, s.world, s.rank, view.timeout_ns);
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

cudaError_t launch_group_barrier(const core::PassView& view, core::WaitId what, cudaStream_t stream) {
  if (view.s.world == 1) return cudaSuccess;
  group_barrier<<<1, 32, 0, stream>>>(view, what, core::call_of(view.kind));
  return cudaGetLastError();
}

cudaError_t launch_leave_group(const core::PassView& view, cudaStream_t stream) {
  if (view.s.world == 1) return cudaSuccess;
  leave_group<<<1, 32, 0, stream>>>(view);
  return cudaGetLastError();
}

cudaError_t launch_copy_slots(const core::PassView& view, core::bf16_t* y_slots, cudaStream_t stream) {
  if (view.tokens == 0) return cudaSuccess;
  copy_slots<<<(view.tokens + kSlotThreads - 1) / kSlotThreads, kSlotThreads, 0, stream>>>(view, y_slots);
  return cudaGetLastError();
}

}  // namespace mok::cuda
