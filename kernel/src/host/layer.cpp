// The host executor's passes: stage inputs, enter the group, run the task graph on worker threads,
// leave the group, and take the home rank's sums.
#include "host/layer.hpp"

#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "api/error.hpp"

namespace mok::host {
namespace {

using core::Failure;
using core::PassKind;
using core::WaitId;

template <class T>
T* local_at(const Layer& l, size_t offset) {
  return reinterpret_cast<T*>(l.local + offset);
}
template <class T>
T* own_at(const Layer& l, size_t offset) {
  return reinterpret_cast<T*>(l.memory.base(l.shape.rank) + offset);
}

core::Schedule schedule_of(const Layer& l) {
  return core::Schedule{local_at<int32_t>(l, l.local_layout.schedule_experts),
                        local_at<core::RowRef>(l, l.local_layout.rows), l.total_rows};
}

// MOK_HOST_FAULT_STALL="<rank>:<tasks>": that rank's first comm worker stops after taking <tasks>
// tasks, as a hung rank would (tests of the timeout and abort paths).
int64_t stall_from_env(int rank) {
  const char* spec = std::getenv("MOK_HOST_FAULT_STALL");
  int r = -1;
  long long tasks = -1;
  if (!spec || std::sscanf(spec, "%d:%lld", &r, &tasks) != 2 || r != rank) return -1;
  return tasks;
}

core::PassView view_of(Layer& l, PassKind kind) {
  const core::LocalLayout& ll = l.local_layout;
  core::PassView v{};
  v.s = l.shape;
  v.kind = kind;
  v.peer = l.peer;
  v.peers = l.memory.bases();
  v.headers = l.headers;
  v.sched = schedule_of(l);
  v.graph.comm = local_at<core::Task>(l, ll.tasks);
  v.graph.compute = v.graph.comm + core::max_minibatches(l.shape) * 2;
  v.c = core::counters_at(l.shape, local_at<uint32_t>(l, ll.counters));
  v.ring_x = local_at<float>(l, ll.ring_x);
  v.ring_dy = local_at<float>(l, ll.ring_dy);
  v.ring_g = local_at<float>(l, ll.ring_g);
  v.ring_u = local_at<float>(l, ll.ring_u);
  v.ring_h = local_at<float>(l, ll.ring_h);
  v.ring_y = local_at<float>(l, ll.ring_y);
  size_t is_h = static_cast<size_t>(l.shape.shared_intermediate) * l.shape.hidden;
  v.acc = {local_at<float>(l, ll.acc_gate),          local_at<float>(l, ll.acc_up),
           local_at<float>(l, ll.acc_down),          local_at<float>(l, ll.shared_acc),
           local_at<float>(l, ll.shared_acc) + is_h, local_at<float>(l, ll.shared_acc) + 2 * is_h};
  v.shared_out = local_at<float>(l, ll.shared_out);
  v.scratch = local_at<float>(l, ll.scratch);
  v.scratch_floats = ll.scratch_floats;
  v.tokens = l.tokens;
  v.timeout_ns = l.timeout_ns;
  v.error = &l.error;
  return v;
}

void stall(const core::PassView& v, const core::Task* task) {
  Failure f = core::wait_for([] { return false; }, core::own_header(v), v.timeout_ns, WaitId::stalled_worker);
  core::fail_pass(v, f, task);
}

// With fault injection, the worker stalls after `stall_after` tasks, or when its queue runs out
// first: the rank hangs whatever the schedule gave it to do.
void work(const core::PassView& v, core::WorkerClass cls, float* scratch, int64_t stall_after) {
  for (int64_t taken = 0;; ++taken) {
    const core::Task* task = core::take_task(v, cls);
    if (stall_after >= 0 && (taken == stall_after || !task)) return stall(v, task);
    if (!task) return;
    Failure f = core::run_task(v, *task, scratch);
    if (!f.ok()) return core::fail_pass(v, f, task);
  }
}

struct Worker {
  const core::PassView* view;
  core::WorkerClass cls;
  float* scratch;
  int64_t stall_after;
  pthread_t thread;
};

void* worker_main(void* arg) {
  auto* w = static_cast<Worker*>(arg);
  work(*w->view, w->cls, w->scratch, w->stall_after);
  return nullptr;
}

// pthreads on a fixed array rather than std::thread in a std::vector: those template instances
// would be exported from libmok. A worker that cannot start (thread limit) runs on this thread
// before the joins; with other workers of both classes running, the pass still completes.
void run_workers(Layer& l, const core::PassView& v) {
  Worker workers[kMaxWorkers];
  bool started[kMaxWorkers] = {};
  int n = l.shape.comm_workers + l.shape.compute_workers;
  for (int i = 0; i < n; ++i) {
    auto cls = i < l.shape.comm_workers ? core::WorkerClass::comm : core::WorkerClass::compute;
    workers[i] = Worker{&v, cls, v.scratch + static_cast<size_t>(i) * v.scratch_floats,
                        i == 0 ? l.stall_after_tasks : -1, pthread_t{}};
    started[i] = pthread_create(&workers[i].thread, nullptr, worker_main, &workers[i]) == 0;
  }
  for (int i = 0; i < n; ++i)
    if (!started[i]) worker_main(&workers[i]);
  for (int i = 0; i < n; ++i)
    if (started[i]) pthread_join(workers[i].thread, nullptr);
}

mokStatus_t status_of(Layer& l, const char* func) {
  core::ErrorRecord e{};
  core::read_record(&l.error, &e);
  mokStatus_t s = e.outcome == static_cast<int32_t>(core::Outcome::timeout) ? mokTimeout : mokPeerAbort;
  return api::fail(s, "%s: rank %d: %s (task %s %d, wait '%s')", func, e.rank,
                   s == mokTimeout ? "a wait ran out" : "the pass was aborted", core::task_name(e.task_kind),
                   e.task_index, core::wait_name(static_cast<WaitId>(e.wait)));
}

bool failed(Layer& l) {
  core::ErrorRecord e;
  return core::read_record(&l.error, &e);
}

bool group_aborted(Layer& l) {
  return failed(l) || core::abort_seen(l.headers[l.shape.rank]);
}

mokStatus_t aborted_earlier(Layer& l, const char* func) {
  core::record_failure(&l.error, Failure{core::Outcome::peer_abort, WaitId::earlier_abort}, l.shape.rank, -1, -1);
  return api::fail(mokPeerAbort, "%s: the group was aborted (this or an earlier call); create new contexts", func);
}

// Collective step shared by every call: enter, (work), leave.
Failure group_barrier(Layer& l, WaitId what) {
  return core::barrier(l.headers, l.shape.world, l.shape.rank, ++l.epoch, l.timeout_ns, what);
}

// The pass proper: counters zeroed, task graph laid out, barrier, workers, barrier.
mokStatus_t run_pass(Layer& l, const core::PassView& v, const char* func) {
  std::memset(v.c.ready, 0, core::num_counters(l.shape) * sizeof(uint32_t));
  core::TaskGraph g = v.graph;
  core::build_task_graph(l.shape, v.kind, v.sched.total_rows, l.tokens, g);
  core::PassView pv = v;
  pv.graph = g;
  // A rank that failed does not arrive at later barriers: an arrival could complete a barrier its
  // peers are still waiting in. They see the abort flag instead.
  Failure f = group_barrier(l, WaitId::entry_barrier);
  if (f.ok())
    run_workers(l, pv);
  else
    core::fail_pass(pv, f, nullptr);
  if (!failed(l)) {
    f = group_barrier(l, WaitId::closing_barrier);
    if (!f.ok()) core::fail_pass(pv, f, nullptr);
  }
  return failed(l) ? status_of(l, func) : mokSuccess;
}

void copy_rows(const void* src, size_t bytes, void* dst) {
  if (bytes) std::memcpy(dst, src, bytes);
}

// Weight gradients out of their fp32 accumulators: bf16, or added into fp32 main_grad.
void write_grad(const float* acc, size_t n, int accumulate, void* dst) {
  if (accumulate) {
    auto* main = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) main[i] += acc[i];
  } else {
    auto* out = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) out[i] = core::float_to_bf16(acc[i]);
  }
}

// Every rank published its shape at creation; after the first schedule barrier all are visible.
// A mismatch is seen by every rank (each differs from someone), so all fail alike and stop here,
// without an abort (which could overtake a peer still in the barrier). Until a schedule is built,
// no pass can run.
mokStatus_t check_group_shape(Layer& l, const char* func) {
  int32_t mine[core::kGroupShapeFields];
  core::group_shape(l.shape, mine);
  for (int r = 0; r < l.shape.world; ++r)
    for (int i = 0; i < core::kGroupShapeFields; ++i)
      if (l.headers[r]->shape[i] != mine[i]) {
        return api::fail(mokInvalidArgument,
                         "%s: argument 'config.%s' differs between rank %d and rank %d; every "
                         "rank of a group needs the same value",
                         func, core::group_shape_field(i), l.shape.rank, r);
      }
  return mokSuccess;
}

}  // namespace

mokStatus_t create(const core::LayerShape& shape, uint64_t timeout_ns, const mokLayerMemory_t& memory, Layer** out) {
  auto* l = new (std::nothrow) Layer();
  if (!l) return api::fail(mokOutOfMemory, "mokLayerCreate: out of memory");
  l->shape = shape;
  l->peer = core::peer_layout(shape);
  l->local_layout = core::local_layout(shape);
  l->local = static_cast<char*>(memory.workspace);
  l->timeout_ns = timeout_ns;
  l->stall_after_tasks = stall_from_env(shape.rank);
  if (memory.peer_bases) {
    l->memory.adopt(memory.peer_bases, shape.world);
  } else if (mokStatus_t s = l->memory.rendezvous(memory.shm_name, shape, l->peer.bytes, timeout_ns); s != mokSuccess) {
    delete l;
    return s;
  }
  for (int r = 0; r < shape.world; ++r) l->headers[r] = reinterpret_cast<core::PeerHeader*>(l->memory.base(r));
  core::group_shape(shape, l->headers[shape.rank]->shape);
  *out = l;
  return mokSuccess;
}

mokStatus_t build_schedule(Layer& l, const void* topk_ids, bool int64_ids, int tokens) {
  const char* func = "mokLayerBuildSchedule";
  if (group_aborted(l)) return aborted_earlier(l, func);
  // Safe to overwrite: the closing barrier of the previous build ended every peer's reads.
  auto* ids = own_at<int32_t>(l, l.peer.topk_ids);
  size_t n = static_cast<size_t>(tokens) * l.shape.top_k;
  for (size_t i = 0; i < n; ++i)
    ids[i] = int64_ids ? static_cast<int32_t>(static_cast<const int64_t*>(topk_ids)[i])
                       : static_cast<const int32_t*>(topk_ids)[i];
  l.headers[l.shape.rank]->tokens = tokens;
  l.tokens = tokens;
  l.has_schedule = l.has_context = false;
  core::PassView v = view_of(l, PassKind::forward);
  Failure f = group_barrier(l, WaitId::schedule_barrier);
  if (f.ok())
    if (mokStatus_t s = check_group_shape(l, func); s != mokSuccess) return s;
  if (f.ok()) {
    const int32_t* all_ids[core::kMaxWorld];
    int32_t all_tokens[core::kMaxWorld];
    for (int r = 0; r < l.shape.world; ++r) {
      all_ids[r] = reinterpret_cast<const int32_t*>(l.memory.base(r) + l.peer.topk_ids);
      all_tokens[r] = l.headers[r]->tokens;
    }
    core::Schedule s = v.sched;
    core::build_schedule(l.shape, core::Routing{all_ids, all_tokens}, s);
    l.total_rows = s.total_rows;
    f = group_barrier(l, WaitId::schedule_barrier);
  }
  if (!f.ok()) {
    core::fail_pass(v, f, nullptr);
    return status_of(l, func);
  }
  l.has_schedule = true;
  return mokSuccess;
}

mokStatus_t forward(Layer& l, const mokLayerWeights_t& weights, const uint16_t* x, const float* topk_weights,
                    uint16_t* out, bool with_output) {
  const char* func = with_output ? "mokLayerForward" : "mokLayerRecompute";
  if (!l.has_schedule) return api::fail(mokInvalidUsage, "%s: call mokLayerBuildSchedule first", func);
  if (group_aborted(l)) return aborted_earlier(l, func);
  size_t th = static_cast<size_t>(l.tokens) * l.shape.hidden;
  copy_rows(x, th * 2, own_at<uint16_t>(l, l.peer.x));
  core::PassView v = view_of(l, with_output ? PassKind::forward : PassKind::recompute);
  v.w = stage_weights(l, weights);
  l.has_context = false;
  if (mokStatus_t s = run_pass(l, v, func); s != mokSuccess) return s;
  l.has_context = true;
  if (with_output)
    for (int t = 0; t < l.tokens; ++t) core::combine_forward_token(v, t, topk_weights, out);
  return mokSuccess;
}

mokStatus_t backward(Layer& l, const mokLayerWeights_t& weights, const float* topk_weights, const uint16_t* dout,
                     const mokLayerGrads_t& grads) {
  const char* func = "mokLayerBackward";
  if (!l.has_context)
    return api::fail(mokInvalidUsage, "%s: needs a mokLayerForward or mokLayerRecompute since the last schedule", func);
  if (group_aborted(l)) return aborted_earlier(l, func);
  size_t tk = static_cast<size_t>(l.tokens) * l.shape.top_k, th = static_cast<size_t>(l.tokens) * l.shape.hidden;
  copy_rows(dout, th * 2, own_at<uint16_t>(l, l.peer.dout));
  copy_rows(topk_weights, tk * 4, own_at<float>(l, l.peer.topk_weights));
  core::PassView v = view_of(l, PassKind::backward);
  v.w = stage_weights(l, weights);
  const core::LocalLayout& ll = l.local_layout;
  size_t e_ih = static_cast<size_t>(l.shape.experts_per_rank) * l.shape.intermediate * l.shape.hidden;
  size_t s_ih = static_cast<size_t>(l.shape.shared_intermediate) * l.shape.hidden;
  for (size_t off : {ll.acc_gate, ll.acc_up, ll.acc_down}) std::memset(l.local + off, 0, e_ih * 4);
  std::memset(l.local + ll.shared_acc, 0, 3 * s_ih * 4);
  if (mokStatus_t s = run_pass(l, v, func); s != mokSuccess) return s;
  for (int t = 0; t < l.tokens; ++t)
    core::combine_backward_token(v, t, dout, static_cast<uint16_t*>(grads.dx), grads.dtopk_weights);
  write_grad(v.acc.gate, e_ih, grads.accumulate, grads.dgate);
  write_grad(v.acc.up, e_ih, grads.accumulate, grads.dup);
  write_grad(v.acc.down, e_ih, grads.accumulate, grads.ddown);
  if (s_ih) {
    write_grad(v.acc.sgate, s_ih, grads.accumulate, grads.dshared_gate);
    write_grad(v.acc.sup, s_ih, grads.accumulate, grads.dshared_up);
    write_grad(v.acc.sdown, s_ih, grads.accumulate, grads.dshared_down);
  }
  return mokSuccess;
}

mokStatus_t get_slots(Layer& l, uint16_t* y_slots) {
  if (!l.has_context)
    return api::fail(mokInvalidUsage,
                     "mokLayerGetSlots: needs a mokLayerForward or mokLayerRecompute since the last "
                     "schedule");
  core::PassView v = view_of(l, PassKind::forward);
  for (int t = 0; t < l.tokens; ++t) core::copy_slots_token(v, t, y_slots);
  return mokSuccess;
}

void abort(Layer& l) {
  core::record_failure(&l.error, core::Failure{core::Outcome::peer_abort, WaitId::none}, l.shape.rank, -1, -1);
  core::raise_abort(l.headers, l.shape.world);
}

}  // namespace mok::host
