// The host executor's calls: core's pass (core/pass_worker.hpp) on the layer's persistent threads,
// over the caller's workspace and the ranks' peer buffers.
#include "host/layer.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "core/pass_worker.hpp"
#include "host/gemm.hpp"
#include "host/random.hpp"

namespace mok::host {
namespace {

using core::Failure;
using core::PassKind;
using core::WaitId;

// "<rank>:<n>" from the environment variable `name`: n for this rank, -1 otherwise.
long long fault_from_env(const char* name, int rank) {
  const char* spec = std::getenv(name);
  int r = -1;
  long long n = -1;
  if (!spec || std::sscanf(spec, "%d:%lld", &r, &n) != 2 || r != rank) return -1;
  return n;
}

// MOK_HOST_FAULT_THREADS="<n>": a layer starts at most n threads, as under a thread limit.
int thread_limit_from_env() {
  const char* spec = std::getenv("MOK_HOST_FAULT_THREADS");
  return spec ? std::atoi(spec) : -1;
}

// MOK_HOST_ROW_PARTS="<n>": each row job (core's run_rows) run as n parts, one after another, as a CTA's threads
// share it at once; "-<n>": the last part first. A test's way of checking that the parts are independent.
int row_parts_from_env() {
  const char* spec = std::getenv("MOK_HOST_ROW_PARTS");
  int n = spec ? std::atoi(spec) : 0;
  return n == 0 ? 1 : n;
}

// MOK_HOST_BULK_SLOTS="<k>": k of a row job's parts (spread over them, at most one each) hold a slot and move the rows
// it copies unchanged as bulk copies (core::RowMoves), as the fused executor's CTA does; 0 or unset: none.
// MOK_HOST_FAULT_BULK_LOST=1: those copies are lost (a test's way of seeing that the slots carried rows).
int bulk_slots_from_env() {
  const char* spec = std::getenv("MOK_HOST_BULK_SLOTS");
  return spec ? std::atoi(spec) : 0;
}
bool bulk_lost_from_env() {
  const char* spec = std::getenv("MOK_HOST_FAULT_BULK_LOST");
  return spec && std::atoi(spec) != 0;
}

// A slot of the host's bulk copies (core::bulk_copy's Slot): a batch's loads copied into its staging at once, its
// stores out of it at the flush.
struct HostSlot {
  std::vector<core::bf16_t> staging;  // kBulkValues, from the first batch (most parts hold no slot)
  std::vector<std::pair<core::bf16_t*, int64_t>> batch;
  int64_t values = 0;  // the batch's
  bool lost = false;   // MOK_HOST_FAULT_BULK_LOST: the stores go nowhere

  int count() const { return static_cast<int>(batch.size()); }
  int64_t used() const { return values; }
  void wait_read() {}
  void load(const core::bf16_t* src, int64_t n, core::bf16_t* dst) {
    if (staging.empty()) staging.resize(core::kBulkValues);
    std::memcpy(staging.data() + values, src, n * sizeof(core::bf16_t));
    batch.emplace_back(dst, n);
    values += n;
  }
  bool land() { return true; }
  void store() {
    const core::bf16_t* from = staging.data();
    for (auto [dst, n] : batch) {
      if (!lost) std::memcpy(dst, from, n * sizeof(core::bf16_t));
      from += n;
    }
    batch.clear();
    values = 0;
  }
};

// The bulk copies of a part (core/bulk_copy.hpp) on the host: slot `own` of `count` (-1: none), through `slot`.
struct HostBulk {
  int count, own;
  HostSlot* slot_state;
  int slots() const { return count; }
  int slot() const { return own; }
  void copy(const core::bf16_t* src, int64_t n, core::bf16_t* dst) { core::bulk_copy(*slot_state, src, n, dst); }
  // Part `index` of `parts` with `slots` of them spread over the parts.
  static HostBulk of(int index, int parts, int slots, HostSlot* slot) {
    slots = slots < parts ? slots : parts;
    for (int s = 0; s < slots; ++s)
      if (index == s * parts / slots) return HostBulk{slots, s, slot};
    return HostBulk{slots, -1, slot};
  }
};

// core's sigmoid of every bf16 value, built once per process: SwiGLU looks its sigmoids up.
const float* sigmoid_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(core::kSigmoidTableSize);
    core::fill_sigmoid_table(t.data());
    return t;
  }();
  return table.data();
}

// Core's view of this rank's memory, run by the workers the layer has threads for.
core::PassView view_of(Layer& l, PassKind kind, const core::PassArgs* args) {
  core::PassView v = core::pass_view_at(l.shape, kind, l.local, l.memory.bases(), l.headers, &l.group, l.group.tokens,
                                        l.group.total_rows, l.timeout_ns, &l.group.error);
  v.s = core::fit_workers(l.shape, l.pool.workers());
  v.args = args;
  v.sigmoid_table = sigmoid_table();
  return v;
}

// The tile operations of a host worker: the fast tile GEMM on its scratch, its chunk rows, and the
// fault hook around its task loop.
struct HostOps {
  float* scratch;
  size_t scratch_floats;
  core::bf16_t* chunk;
  float* sums;
  int64_t stall_after;  // MOK_HOST_FAULT_STALL on this worker; -1 = off
  int64_t slow_us;      // MOK_HOST_FAULT_SLOW on this rank; -1 = off
  int row_parts;        // MOK_HOST_ROW_PARTS
  int bulk_slots;       // MOK_HOST_BULK_SLOTS
  bool bulk_lost;       // MOK_HOST_FAULT_BULK_LOST

  void gemm(const core::Gemm& g) { host::gemm(g, scratch, scratch_floats); }
  void rows(const core::PassView& v, const core::RowJob& job) const {
    int count = row_parts < 0 ? -row_parts : row_parts;
    for (int i = 0; i < count; ++i) {
      int index = row_parts < 0 ? count - 1 - i : i;
      if (bulk_slots <= 0) {
        core::run_rows(v, job, core::Part{index, count});
        continue;
      }
      HostSlot slot;
      slot.lost = bulk_lost;
      core::run_rows(v, job, core::Part{index, count}, HostBulk::of(index, count, bulk_slots, &slot));
      core::bulk_flush(slot);  // the job's end
    }
  }

  // With fault injection, the worker starts each task `slow_us` late (a slow rank that keeps working),
  // and stalls after `stall_after` tasks, or when its queue runs out first: the rank hangs whatever the
  // schedule gave it to do.
  bool stop_here(const core::PassView& v, int64_t taken, const core::Task* task) const {
    if (slow_us > 0 && task) std::this_thread::sleep_for(std::chrono::microseconds(slow_us));
    if (stall_after < 0 || (taken != stall_after && task)) return false;
    Failure f = core::wait_for([] { return false; }, core::own_header(v), v.timeout_ns, WaitId::stalled_worker);
    core::fail_pass(v, f, task);
    return true;
  }
};

struct Job {
  const core::PassView* view;
  const Layer* layer;
  bool schedule;
};

void run_worker(void* job, int worker) {
  const Job& j = *static_cast<const Job*>(job);
  if (worker >= core::workers_of(*j.view)) return;  // a thread beyond the workers this pass runs
  if (j.schedule) return core::run_schedule_worker(*j.view, worker);
  if (worker == j.layer->exit_worker) return;  // fault injection: a worker that is gone
  const core::PassView& v = *j.view;
  HostOps ops{v.scratch + static_cast<size_t>(worker) * v.scratch_floats,
              v.scratch_floats,
              core::worker_chunk(v, worker),
              core::worker_sums(v, worker),
              worker == 0 ? j.layer->stall_after_tasks : -1,
              j.layer->slow_task_us,
              j.layer->row_parts,
              j.layer->bulk_slots,
              j.layer->bulk_lost};
  core::run_pass_worker(*j.view, worker, ops);
}

// Counters zeroed and the task graph laid out here, then the workers; their outcome, worded.
mokStatus_t run(Layer& l, core::PassView& v, bool schedule, core::CallKind call, const char* func, Detail& why) {
  core::prepare_workers(v);
  if (!schedule) core::lay_out_tasks(v);
  Job job{&v, &l, schedule};
  l.pool.run(run_worker, &job);
  if (!l.group.group_failure.ok()) return fail_group(l, l.group.group_failure, call, func, why);
  if (core::failed(l.group)) return status_of(l, func, why);
  return mokSuccess;
}

void copy_in(Layer& l, const core::StageCopy* copies, int n) {
  for (int i = 0; i < n; ++i)
    if (copies[i].bytes) std::memcpy(l.memory.base(l.shape.rank) + copies[i].offset, copies[i].src, copies[i].bytes);
}

void stage(Layer& l, const core::PassView& v) {
  core::StageCopy copies[core::kMaxStageCopies];
  copy_in(l, copies, core::stage_copies(v, copies));
}

core::PeerHeader* own_header(Layer& l) {
  return l.headers[l.shape.rank];
}

}  // namespace

mokStatus_t create(const core::LayerShape& shape, uint64_t timeout_ns, const mokLayerMemory_t& memory, Layer** out,
                   Detail& why) {
  auto* l = new (std::nothrow) Layer();
  if (!l) return fail(why, mokOutOfMemory, "mokLayerCreate: out of memory");
  l->shape = shape;
  l->peer = core::peer_layout(shape);
  l->local = static_cast<char*>(memory.workspace);
  l->timeout_ns = timeout_ns;
  l->stall_after_tasks = fault_from_env("MOK_HOST_FAULT_STALL", shape.rank);
  l->exit_worker = static_cast<int>(fault_from_env("MOK_HOST_FAULT_EXIT", shape.rank));
  l->slow_task_us = fault_from_env("MOK_HOST_FAULT_SLOW", shape.rank);
  l->row_parts = row_parts_from_env();
  l->bulk_slots = bulk_slots_from_env();
  l->bulk_lost = bulk_lost_from_env();
  if (memory.peer_bases) {
    l->memory.adopt(memory.peer_bases, shape.world);
  } else if (mokStatus_t s = l->memory.rendezvous(memory.shm_name, shape, l->peer.bytes, timeout_ns, why);
             s != mokSuccess) {
    delete l;
    return s;
  }
  for (int r = 0; r < shape.world; ++r) l->headers[r] = reinterpret_cast<core::PeerHeader*>(l->memory.base(r));
  int32_t group_shape[core::kGroupShapeFields];
  core::group_shape(shape, group_shape);
  core::reset_header(l->headers[shape.rank], group_shape, random_word(static_cast<uint64_t>(shape.rank)));
  l->pool.start(shape.comm_workers + shape.compute_workers, thread_limit_from_env());
  // A pass needs a comm and a compute worker at once; without a single thread the calling one is all
  // there is, and every pass would run out its timeout.
  if (l->pool.workers() < 2) {
    delete l;
    return fail(why, mokSystemError, "mokLayerCreate: could not start a worker thread (pthread_create)");
  }
  *out = l;
  return mokSuccess;
}

void drop_schedule(Layer& l) {
  core::drop_schedule(l.group);
}

mokStatus_t build_schedule(Layer& l, const void* topk_ids, bool int64_ids, int tokens, Detail& why) {
  const char* func = "mokLayerBuildSchedule";
  const core::CallKind call = core::CallKind::build_schedule;
  if (core::Refusal refusal = core::check_call(l.group, own_header(l), call); refusal != core::Refusal::none)
    return refuse(l, refusal, func, why);
  l.group.tokens = tokens;
  core::PassView v = view_of(l, PassKind::forward, nullptr);
  core::stage_topk_ids(v, topk_ids, int64_ids, tokens);
  if (mokStatus_t s = run(l, v, true, call, func, why); s != mokSuccess) return s;
  l.group.has_schedule = true;
  return mokSuccess;
}

mokStatus_t forward(Layer& l, const mokLayerWeights_t& weights, const uint16_t* x, const float* topk_weights,
                    uint16_t* out, bool with_output, Detail& why) {
  const char* func = with_output ? "mokLayerForward" : "mokLayerRecompute";
  PassKind kind = with_output ? PassKind::forward : PassKind::recompute;
  if (core::Refusal refusal = core::check_call(l.group, own_header(l), core::call_of(kind));
      refusal != core::Refusal::none)
    return refuse(l, refusal, func, why);
  core::PassArgs args{};
  args.x = x;
  args.topk_weights = topk_weights;
  args.out = out;
  core::PassView v = view_of(l, kind, &args);
  stage(l, v);
  v.w = weights_in_place(weights);
  l.group.has_context = l.group.ring_kept = false;
  if (mokStatus_t s = run(l, v, false, core::call_of(kind), func, why); s != mokSuccess) return s;
  l.group.has_context = true;
  l.group.ring_kept = l.group.total_rows <= l.shape.macrobatch;  // no row overwrote another
  return mokSuccess;
}

mokStatus_t backward(Layer& l, const mokLayerWeights_t& weights, const float* topk_weights, const uint16_t* dout,
                     const mokLayerGrads_t& grads, Detail& why) {
  const char* func = "mokLayerBackward";
  const core::CallKind call = core::CallKind::backward;
  if (core::Refusal refusal = core::check_call(l.group, own_header(l), call); refusal != core::Refusal::none)
    return refuse(l, refusal, func, why);
  core::PassArgs args{};
  args.topk_weights = topk_weights;
  args.dout = dout;
  args.dx = static_cast<uint16_t*>(grads.dx);
  args.dtopk_weights = grads.dtopk_weights;
  args.dgate = grads.dgate;
  args.dup = grads.dup;
  args.ddown = grads.ddown;
  args.dshared_gate = grads.dshared_gate;
  args.dshared_up = grads.dshared_up;
  args.dshared_down = grads.dshared_down;
  args.dgate_bias = grads.dgate_bias;
  args.dup_bias = grads.dup_bias;
  args.ddown_bias = grads.ddown_bias;
  args.dshared_router = grads.dshared_router;
  args.accumulate = grads.accumulate;
  // Its forward's x, g and u are read where they are when the ring still holds them; the backward
  // overwrites g and u, so a second backward of the same context recomputes them.
  core::PassView v = view_of(l, l.group.ring_kept ? PassKind::backward_kept : PassKind::backward, &args);
  l.group.ring_kept = false;
  stage(l, v);
  v.w = weights_in_place(weights);
  return run(l, v, false, call, func, why);
}

mokStatus_t get_slots(Layer& l, uint16_t* y_slots, Detail& why) {
  if (!l.group.has_context)
    return fail(why, mokInvalidUsage, "mokLayerGetSlots: %s", core::order_rule(core::Refusal::needs_context));
  core::PassView v = view_of(l, PassKind::forward, nullptr);
  for (int t = 0; t < l.group.tokens; ++t) core::copy_slots_token(v, t, y_slots);
  return mokSuccess;
}

mokStatus_t restore_context(Layer& l, const uint16_t* x, const uint16_t* y_slots, Detail& why) {
  if (!l.group.has_schedule)
    return fail(why, mokInvalidUsage,
                "mokLayerRestoreContext: needs a mokLayerBuildSchedule (with the topk_ids of "
                "the forward the context came from)");
  core::PassView v = view_of(l, PassKind::forward, nullptr);
  core::StageCopy copies[core::kMaxStageCopies];
  copy_in(l, copies, core::context_copies(v, x, y_slots, copies));
  core::restore_context(l.group);
  return mokSuccess;
}

void abort(Layer& l, const char* reason) {
  core::PeerHeader* own = own_header(l);
  if (!core::group_aborted(l.group, own)) {  // the group's first reason stands
    char text[core::kReasonBytes];
    int n = std::snprintf(text, sizeof(text), "rank %d aborted the group: ", l.shape.rank);
    copy_text(text + n, sizeof(text) - n, reason);
    stamp_reason(l, text);
  }
  bool mine = core::load_word(own->reason_stamp) == core::load_word(own->incarnation);
  core::record_failure(&l.group.error, Failure{core::Outcome::peer_abort, WaitId::none}, l.shape.rank, -1, -1,
                       mine ? own->reason : nullptr);
  core::abort_group(l.group, l.headers, l.shape.world, l.shape.rank);
}

void reject(Layer& l, mokStatus_t status, const char* detail) {
  if (!core::refusal_reaches_group(l.group, l.headers, l.shape.world, l.shape.rank)) return;
  bool order = status == mokInvalidUsage;
  write_reason(l, order, detail);
  core::reject_call(l.group, l.headers, l.shape.world, l.shape.rank, l.timeout_ns, order, detail);
}

}  // namespace mok::host
