// The host executor's passes: stage inputs, enter the group, run the task graph on worker threads,
// leave the group, and take the home rank's sums.
#include "host/layer.hpp"

#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "api/error.hpp"
#include "core/protocol.hpp"
#include "host/random.hpp"

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
  v.ring_x = local_at<core::bf16_t>(l, ll.ring_x);
  v.ring_dy = local_at<core::bf16_t>(l, ll.ring_dy);
  v.ring_g = local_at<core::bf16_t>(l, ll.ring_g);
  v.ring_u = local_at<core::bf16_t>(l, ll.ring_u);
  v.ring_h = local_at<core::bf16_t>(l, ll.ring_h);
  v.ring_y = local_at<core::bf16_t>(l, ll.ring_y);
  size_t is_h = static_cast<size_t>(l.shape.shared_intermediate) * l.shape.hidden;
  v.acc = {local_at<float>(l, ll.acc_gate),          local_at<float>(l, ll.acc_up),
           local_at<float>(l, ll.acc_down),          local_at<float>(l, ll.shared_acc),
           local_at<float>(l, ll.shared_acc) + is_h, local_at<float>(l, ll.shared_acc) + 2 * is_h};
  v.shared_out = local_at<core::bf16_t>(l, ll.shared_out);
  v.scratch = local_at<float>(l, ll.scratch);
  v.scratch_floats = ll.scratch_floats;
  v.chunk = local_at<core::bf16_t>(l, ll.chunk);
  v.chunk_values = ll.chunk_values;
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
void work(const core::PassView& v, core::WorkerClass cls, core::ReferenceTiles tiles, int64_t stall_after) {
  for (int64_t taken = 0;; ++taken) {
    const core::Task* task = core::take_task(v, cls);
    if (stall_after >= 0 && (taken == stall_after || !task)) return stall(v, task);
    if (!task) return;
    Failure f = core::run_task(v, *task, tiles);
    if (!f.ok()) return core::fail_pass(v, f, task);
  }
}

struct Worker {
  const core::PassView* view;
  core::WorkerClass cls;
  core::ReferenceTiles tiles;
  int64_t stall_after;
  pthread_t thread;
};

void* worker_main(void* arg) {
  auto* w = static_cast<Worker*>(arg);
  work(*w->view, w->cls, w->tiles, w->stall_after);
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
    core::ReferenceTiles tiles{v.scratch + static_cast<size_t>(i) * v.scratch_floats,
                               v.chunk + static_cast<size_t>(i) * v.chunk_values};
    workers[i] = Worker{&v, cls, tiles, i == 0 ? l.stall_after_tasks : -1, pthread_t{}};
    started[i] = pthread_create(&workers[i].thread, nullptr, worker_main, &workers[i]) == 0;
  }
  for (int i = 0; i < n; ++i)
    if (!started[i]) worker_main(&workers[i]);
  for (int i = 0; i < n; ++i)
    if (started[i]) pthread_join(workers[i].thread, nullptr);
}

bool failed(Layer& l) {
  core::ErrorRecord e;
  return core::read_record(&l.error, &e);
}

bool group_aborted(Layer& l) {
  return failed(l) || core::abort_seen(l.headers[l.shape.rank]);
}

// How a rank's call fails: its own record, and the reason a peer left in its header, if any.
mokStatus_t status_of(Layer& l, const char* func) {
  core::ErrorRecord e{};
  core::read_record(&l.error, &e);
  char detail[512];
  error_detail(l, e, detail, sizeof(detail));
  mokStatus_t s = status_for(e);
  if (detail[0] != '\0') return api::fail(s, "%s: %s", func, detail);
  return api::fail(s, "%s: rank %d: %s (task %s %d, wait '%s')", func, e.rank,
                   s == mokTimeout ? "a wait ran out" : "the pass was aborted", core::task_name(e.task_kind),
                   e.task_index, core::wait_name(static_cast<WaitId>(e.wait)));
}

// Before the group has formed, peers cannot trust this header yet: wait (bounded) until each has
// joined, then abort them too, so that none waits for this rank.
void tell_unformed_peers(Layer& l) {
  if (l.formed || l.shape.world == 1) return;
  if (core::await_joined(l.headers, l.shape.world, l.shape.rank, l.timeout_ns) < 0) l.formed = true;
  core::raise_abort(l.headers, l.shape.world, l.shape.rank);
}

mokStatus_t aborted_earlier(Layer& l, const char* func) {
  core::record_failure(&l.error, Failure{core::Outcome::peer_abort, WaitId::earlier_abort}, l.shape.rank, -1, -1);
  if (core::abort_seen(l.headers[l.shape.rank])) tell_unformed_peers(l);  // e.g. mokLayerAbort before any call
  if (const char* reason = peer_reason(l))
    return api::fail(mokPeerAbort, "%s: the group was aborted: %s; create new contexts", func, reason);
  return api::fail(mokPeerAbort, "%s: the group was aborted (this or an earlier call); create new contexts", func);
}

// A group shape field as its config value: swiglu_limit is compared as float bits.
void field_value(int field, int32_t bits, char* out, size_t n) {
  if (field != core::kGroupShapeFields - 1) {
    std::snprintf(out, n, "%d", bits);
    return;
  }
  float limit;
  std::memcpy(&limit, &bits, 4);
  std::snprintf(out, n, "%g", static_cast<double>(limit));
}

// The message of a failure outside the workers (formation, barriers), as every rank can word it.
void describe(Layer& l, Failure f, core::CallKind call, char* out, size_t n) {
  int me = l.shape.rank, q = f.peer;
  const char* wait = core::wait_name(f.wait);
  switch (f.outcome) {
    case core::Outcome::shape_mismatch: {
      int i = core::differing_field(l.headers, me, q);
      int32_t mine = l.headers[me]->shape[i], theirs = l.headers[q]->shape[i];
      char a[32], b[32];
      field_value(i, mine, a, sizeof(a));
      field_value(i, theirs, b, sizeof(b));
      std::snprintf(out, n,
                    "argument 'config.%s' differs between rank %d (%s) and rank %d (%s); every rank of a group "
                    "needs the same value",
                    core::group_shape_field(i), me, a, q, b);
      return;
    }
    case core::Outcome::call_mismatch:
      std::snprintf(out, n,
                    "rank %d called %s while rank %d called %s (%s); every rank must make the same sequence of "
                    "collective calls",
                    me, core::call_name(static_cast<uint32_t>(call)), q,
                    core::call_name(core::arrival_call(l.headers, q)), wait);
      return;
    case core::Outcome::timeout:
      if (f.wait == WaitId::group_formation)
        std::snprintf(out, n,
                      "rank %d: wait 'group formation' ran out: rank %d did not acknowledge this rank (no collective "
                      "call of its context yet, or other peer buffers)",
                      me, q);
      else
        std::snprintf(out, n, "rank %d: wait '%s' ran out: rank %d did not arrive", me, wait, q);
      return;
    default: out[0] = '\0'; return;
  }
}

// A failure of the group outside the workers: recorded with its message. A timeout or an abort is
// passed on to every rank; a mismatch is not: every rank finds it itself, and an abort could reach a
// peer before it sees the mismatch and hide the message.
mokStatus_t fail_group(Layer& l, Failure f, core::CallKind call, const char* func) {
  char detail[256];
  describe(l, f, call, detail, sizeof(detail));
  core::record_failure(&l.error, f, l.shape.rank, -1, -1, detail);
  // Before the group has formed, the peer that aborted it may not trust this rank's header yet, so
  // its reason is not readable: wait (bounded) until every peer has joined.
  if (f.outcome == core::Outcome::peer_abort) tell_unformed_peers(l);
  if (f.outcome == core::Outcome::timeout || f.outcome == core::Outcome::peer_abort)
    core::raise_abort(l.headers, l.shape.world, l.shape.rank);
  return status_of(l, func);
}

// The first collective call's agreement wait (once per context), then the barrier of `call`.
Failure group_barrier(Layer& l, WaitId what, core::CallKind call) {
  if (!l.formed) {
    Failure f = core::form_group(l.headers, l.shape.world, l.shape.rank, l.timeout_ns);
    if (!f.ok()) return f;
    l.formed = true;
  }
  return core::barrier(l.headers, l.shape.world, l.shape.rank, ++l.epoch, call, l.timeout_ns, what);
}

core::CallKind call_of(PassKind kind) {
  if (kind == PassKind::backward) return core::CallKind::backward;
  return kind == PassKind::recompute ? core::CallKind::recompute : core::CallKind::forward;
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
  core::CallKind call = call_of(v.kind);
  Failure f = group_barrier(l, WaitId::entry_barrier, call);
  if (!f.ok()) return fail_group(l, f, call, func);
  run_workers(l, pv);
  if (failed(l)) return status_of(l, func);
  f = group_barrier(l, WaitId::closing_barrier, call);
  if (!f.ok()) return fail_group(l, f, call, func);
  return mokSuccess;
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

// A call refused on this rank (wrong order): the peers are told, as for rejected arguments.
mokStatus_t refuse(Layer& l, mokStatus_t status) {
  reject(l, status, api::last_error_message());
  return status;
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
  int32_t group_shape[core::kGroupShapeFields];
  core::group_shape(shape, group_shape);
  core::reset_header(l->headers[shape.rank], group_shape, random_word(static_cast<uint64_t>(shape.rank)));
  *out = l;
  return mokSuccess;
}

void drop_schedule(Layer& l) {
  l.has_schedule = l.has_context = false;
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
  core::PassView v = view_of(l, PassKind::forward);
  const core::CallKind call = core::CallKind::build_schedule;
  Failure f = group_barrier(l, WaitId::schedule_barrier, call);
  if (!f.ok()) return fail_group(l, f, call, func);
  const int32_t* all_ids[core::kMaxWorld];
  int32_t all_tokens[core::kMaxWorld];
  for (int r = 0; r < l.shape.world; ++r) {
    all_ids[r] = reinterpret_cast<const int32_t*>(l.memory.base(r) + l.peer.topk_ids);
    all_tokens[r] = l.headers[r]->tokens;
  }
  core::Schedule s = v.sched;
  core::build_schedule(l.shape, core::Routing{all_ids, all_tokens}, s);
  l.total_rows = s.total_rows;
  f = group_barrier(l, WaitId::schedule_barrier, call);
  if (!f.ok()) return fail_group(l, f, call, func);
  l.has_schedule = true;
  return mokSuccess;
}

mokStatus_t forward(Layer& l, const mokLayerWeights_t& weights, const uint16_t* x, const float* topk_weights,
                    uint16_t* out, bool with_output) {
  const char* func = with_output ? "mokLayerForward" : "mokLayerRecompute";
  if (group_aborted(l)) return aborted_earlier(l, func);
  if (!l.has_schedule) return refuse(l, api::fail(mokInvalidUsage, "%s: call mokLayerBuildSchedule first", func));
  size_t th = static_cast<size_t>(l.tokens) * l.shape.hidden;
  copy_rows(x, th * 2, own_at<uint16_t>(l, l.peer.x));
  core::PassView v = view_of(l, with_output ? PassKind::forward : PassKind::recompute);
  v.w = weights_in_place(weights);
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
  if (group_aborted(l)) return aborted_earlier(l, func);
  if (!l.has_context)
    return refuse(l, api::fail(mokInvalidUsage,
                               "%s: needs a mokLayerForward or mokLayerRecompute since the last schedule", func));
  size_t tk = static_cast<size_t>(l.tokens) * l.shape.top_k, th = static_cast<size_t>(l.tokens) * l.shape.hidden;
  copy_rows(dout, th * 2, own_at<uint16_t>(l, l.peer.dout));
  copy_rows(topk_weights, tk * 4, own_at<float>(l, l.peer.topk_weights));
  core::PassView v = view_of(l, PassKind::backward);
  v.w = weights_in_place(weights);
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
  core::raise_abort(l.headers, l.shape.world, l.shape.rank);
}

// The reason is written before the abort is raised, so a peer that sees the abort finds it.
void reject(Layer& l, mokStatus_t status, const char* detail) {
  // A group of one has no peer to tell, so its context stays usable; and in an aborting group the
  // first reason stands.
  if (l.shape.world == 1 || group_aborted(l)) return;
  int me = l.shape.rank;
  core::PeerHeader* own = l.headers[me];
  bool usage = status == mokInvalidUsage;
  std::snprintf(own->reason, sizeof(own->reason), "rank %d rejected its %s: %s", me, usage ? "call" : "arguments",
                detail);
  core::store_word(own->reason_stamp, core::load_word(own->incarnation));
  auto outcome = usage ? core::Outcome::rejected_order : core::Outcome::rejected_arguments;
  core::record_failure(&l.error, Failure{outcome, WaitId::rejected_call}, me, -1, -1, detail);
  core::raise_abort(l.headers, l.shape.world, me);
  tell_unformed_peers(l);
}

const char* peer_reason(Layer& l) {
  for (int q = 0; q < l.shape.world; ++q) {
    core::PeerHeader* h = l.headers[q];
    if (q != l.shape.rank && core::joined(l.headers, l.shape.rank, q) &&
        core::load_word(h->reason_stamp) == core::load_word(h->incarnation))
      return h->reason;
  }
  return nullptr;
}

mokStatus_t status_for(const core::ErrorRecord& e) {
  switch (static_cast<core::Outcome>(e.outcome)) {
    case core::Outcome::ok: return mokSuccess;
    case core::Outcome::timeout: return mokTimeout;
    case core::Outcome::shape_mismatch: return mokInvalidArgument;
    case core::Outcome::call_mismatch: return mokInvalidUsage;
    case core::Outcome::rejected_arguments: return mokInvalidArgument;
    case core::Outcome::rejected_order: return mokInvalidUsage;
    default: return mokPeerAbort;
  }
}

void error_detail(Layer& l, const core::ErrorRecord& e, char* out, size_t n) {
  const char* reason = e.outcome == static_cast<int32_t>(core::Outcome::peer_abort) ? peer_reason(l) : nullptr;
  if (e.detail[0] != '\0' && reason)
    std::snprintf(out, n, "%s; %s", reason, e.detail);
  else
    std::snprintf(out, n, "%s", e.detail[0] != '\0' ? e.detail : (reason ? reason : ""));
}

}  // namespace mok::host
