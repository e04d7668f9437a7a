// The whole pass of one rank as one body that each of its workers runs: a host thread, or a CTA of a
// persistent kernel. An executor stages the inputs (stage_copies), zeroes the counters and lays out
// the task graph (prepare_workers, lay_out_tasks), runs run_pass_worker(v, w, ops) on workers
// 0 .. comm_workers + compute_workers - 1 at once, and reads the outcome from the group state.
//
// In order, each worker:
//   backward: zeroes its share of the shared expert's weight-gradient accumulators, counts itself in (kZeroed);
//   worker 0: enters the group (the first call's formation, then the entry barrier), waits until every
//             share is zero, and releases the others (kStart); the others wait for that release, so no
//             worker adds into an accumulator before all of it is zero;
//   takes tasks of its class (comm: the first comm_workers_of(s, kind) indices) until its queue is empty;
//   counts itself out (kOut); worker 0 waits for all, enters the closing barrier, releases (kClosed);
//   does its share of the home sums (a range of tokens) and, in backward, of the gradient write-out (a
//   range of every gradient's elements); counts itself out (kFinished), which worker 0 waits for.
// Every worker passes every count on every path, failure included, so each wait for the others ends.
// Every task and share a worker finishes counts as its rank's progress (core/protocol.hpp): it keeps
// the waits on this rank alive, its own workers' and its peers'. The waits for the others are bounded
// but do not give up on an abort: a barrier the whole group completed completes despite a later abort,
// and worker 0 only settles the pass once every worker has left it. A failed local wait is recorded
// and aborts the group (fail_pass); a failure of the group's own waits (formation, barriers) is left
// in GroupState::group_failure for the executor to word.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/group_state.hpp"
#include "core/pass.hpp"

namespace mok::core {

// The pass's comm workers: forward and recompute take comm_workers, backward its own split of the same
// workers (a GPU splits its SMs differently per pass); the rest compute.
MOK_HD inline int comm_workers_of(const LayerShape& s, PassKind kind) {
  return is_backward(kind) && s.backward_comm_workers > 0 ? s.backward_comm_workers : s.comm_workers;
}

// The workers a pass runs when fewer than the config's can (host threads that could not be made, CTAs a GPU cannot
// keep resident at once): fewer compute workers, and comm workers only if need be, each class keeping at least one.
// The result does not depend on worker counts (docs/core.md), so the pass still completes with one of each.
// The backward's comm count is capped the same way.
MOK_HD inline int fit_comm(int comm, int available) {
  return comm < available - 1 ? comm : (available > 1 ? available - 1 : 1);
}

MOK_HD inline LayerShape fit_workers(LayerShape s, int available) {
  if (s.comm_workers + s.compute_workers <= available) return s;
  s.comm_workers = fit_comm(s.comm_workers, available);
  if (s.backward_comm_workers > 0) s.backward_comm_workers = fit_comm(s.backward_comm_workers, available);
  s.compute_workers = available - s.comm_workers > 0 ? available - s.comm_workers : 0;
  return s;
}

MOK_HD inline WorkerClass class_of(const PassView& v, int worker) {
  return worker < comm_workers_of(v.s, v.kind) ? WorkerClass::comm : WorkerClass::compute;
}

// A worker's own `per` values of the buffer at `base` that only compute tasks use: the compute workers' in the pass's
// order of them (at most max_compute_workers); none for a comm worker.
template <class T>
MOK_HD inline T* compute_worker_slice(const PassView& v, int worker, T* base, size_t per) {
  int place = worker - comm_workers_of(v.s, v.kind);
  return place >= 0 && base ? base + static_cast<size_t>(place) * per : nullptr;
}
// Its shared-expert rows (chunk_values bf16) and weight-gradient sums (sums_floats fp32).
MOK_HD inline bf16_t* worker_chunk(const PassView& v, int worker) {
  return compute_worker_slice(v, worker, v.chunk, v.chunk_values);
}
MOK_HD inline float* worker_sums(const PassView& v, int worker) {
  return compute_worker_slice(v, worker, v.sums, v.sums_floats);
}

// ---- before the workers start (the executor's calling thread, or one device thread) -------------

// A range of the caller's bytes the executor copies into the own peer buffer before the pass.
struct StageCopy {
  const void* src;
  size_t offset;  // into the own peer buffer (PeerLayout)
  size_t bytes;
};
constexpr int kMaxStageCopies = 2;

// The pass's inputs that peers read: x (forward, recompute) with the router weights when they scale the
// experts' inputs, or dout and the router weights (backward). Safe to overwrite: the closing barrier of the
// previous pass ended every peer's reads.
MOK_HD inline int stage_copies(const PassView& v, StageCopy* out) {
  size_t th = static_cast<size_t>(v.tokens) * v.s.hidden, tk = static_cast<size_t>(v.tokens) * v.s.top_k;
  if (!is_backward(v.kind)) {
    out[0] = StageCopy{v.args->x, v.peer.x, th * sizeof(bf16_t)};
    if (!input_scaled(v.s)) return 1;
    out[1] = StageCopy{v.args->topk_weights, v.peer.topk_weights, tk * sizeof(float)};
    return 2;
  }
  out[0] = StageCopy{v.args->dout, v.peer.dout, th * sizeof(bf16_t)};
  out[1] = StageCopy{v.args->topk_weights, v.peer.topk_weights, tk * sizeof(float)};
  return 2;
}

// A kept context put back (mokLayerRestoreContext): the forward's x and its y slots, into the own peer
// buffer where the forward left them. Safe to overwrite: as for stage_copies, and no peer reads them
// before this rank's next barrier.
MOK_HD inline int context_copies(const PassView& v, const void* x, const void* y_slots, StageCopy* out) {
  size_t th = static_cast<size_t>(v.tokens) * v.s.hidden, tkh = th * v.s.top_k;
  out[0] = StageCopy{x, v.peer.x, th * sizeof(bf16_t)};
  out[1] = StageCopy{y_slots, v.peer.y_slots, tkh * sizeof(bf16_t)};
  return 2;
}

// A schedule build's input: the topk ids as int32 and the token count, into the own peer buffer
// and header. Safe to overwrite: the closing barrier of the previous build ended every peer's reads.
MOK_HD inline void stage_topk_ids(const PassView& v, const void* ids, bool int64_ids, int tokens) {
  int32_t* own = peer_array<int32_t>(v, v.s.rank, v.peer.topk_ids);
  for (int64_t i = 0, n = static_cast<int64_t>(tokens) * v.s.top_k; i < n; ++i)
    own[i] = static_cast<int32_t>(topk_id(ids, int64_ids, i));
  own_header(v)->tokens = tokens;
}

// Bytes of the pass-local counters (at v.c.ready): a GPU executor may memset them on its stream instead.
MOK_HD inline size_t counter_bytes(const LayerShape& s) {
  return static_cast<size_t>(num_counters(s)) * sizeof(uint32_t);
}

// Every pass and schedule build starts with zero counters and no group failure.
MOK_HD inline void prepare_workers(const PassView& v) {
  for (int64_t i = 0, n = num_counters(v.s); i < n; ++i) v.c.ready[i] = 0;
  v.group->group_failure = kNoFailure;
}

MOK_HD inline void lay_out_tasks(PassView& v) {
  build_task_graph(v.s, v.kind, v.sched, v.tokens, v.graph);
}

// ---- the workers' hand-overs --------------------------------------------------------------------

// Wait until `word` reaches `target`, bounded (by a timeout without progress of the ranks `watched`), not
// cut short by an abort (see the top of this file).
MOK_HD inline Failure wait_workers(const PassView& v, SyncWord word, uint32_t target, uint64_t timeout_ns,
                                   Watched watched, WaitId what) {
  DeviceAtomic<uint32_t> c(v.c.sync[word]);
  Patience patience(timeout_ns);
  Backoff backoff;
  for (;;) {
    if (c.load(::cuda::std::memory_order_acquire) >= target) return kNoFailure;
    if (patience.run_out(watched)) return Failure{Outcome::timeout, what};
    backoff.pause();
  }
}

// A worker waiting for worker 0's release: worker 0 may spend a timeout in each of two waits first
// (formation and a barrier, or a wait for the others and a barrier), so the bound is three timeouts
// in which no rank of the group made progress (worker 0 may be waiting for any of them).
// True: carry on; false: stop (worker 0 said so, or it never did, which fails the pass).
MOK_HD inline bool released(const PassView& v, SyncWord word, WaitId what) {
  Failure f = wait_workers(v, word, 1, 3 * v.timeout_ns, Watched{v.headers, 0, v.s.world}, what);
  if (!f.ok()) {
    fail_pass(v, f, nullptr);
    return false;
  }
  return DeviceAtomic<uint32_t>(v.c.sync[word]).load(::cuda::std::memory_order_acquire) == kGo;
}

MOK_HD inline void release(const PassView& v, SyncWord word, bool go) {
  publish(&v.c.sync[word], go ? kGo : kStop);
}

// Worker 0: every worker has passed `word`; a worker that never does fails the pass.
MOK_HD inline bool all_passed(const PassView& v, SyncWord word, WaitId what) {
  Failure f = wait_workers(v, word, static_cast<uint32_t>(workers_of(v)), v.timeout_ns,
                           Watched{v.headers, v.s.rank, v.s.rank + 1}, what);
  if (f.ok()) return true;
  fail_pass(v, f, nullptr);
  return false;
}

// A device executor's barrier of the group, one thread (core::stream_barrier: formation and epoch in the device's
// GroupState); true when every rank arrived. A group of one needs none: the stream's order is its barrier.
MOK_HD inline bool stream_barrier_passed(const PassView& v, WaitId what, CallKind call) {
  return v.s.world == 1 || stream_barrier(*v.group, v.error, v.headers, v.s.world, v.s.rank, v.timeout_ns, what, call);
}

// Worker 0: a barrier of the group; its failure is left for the executor to word (a device executor's is recorded by
// the barrier itself: stream_barrier_passed).
MOK_HD inline bool group_passed(const PassView& v, WaitId what, CallKind call) {
  if (v.device_barriers) return stream_barrier_passed(v, what, call);
  Failure f = group_barrier(*v.group, v.headers, v.s.world, v.s.rank, v.timeout_ns, what, call);
  if (f.ok()) return true;
  v.group->group_failure = f;
  return false;
}

// ---- the task loop --------------------------------------------------------------------------------

// Ops: the executor's tile operations and the worker's scratch, plus a fault hook:
// `ops.stop_here(v, taken, task)` is true when the executor stopped this worker before its task
// (fault injection; it records the failure itself); an executor without faults returns false.
template <class Ops>
MOK_HD void take_tasks(const PassView& v, WorkerClass cls, Ops& ops) {
  for (int64_t taken = 0;; ++taken) {
    const Task* task = take_task(v, cls);
    if (ops.stop_here(v, taken, task) || !task) return;
    Failure f = run_task(v, *task, ops);
    if (!f.ok()) return fail_pass(v, f, task);
    note_progress(own_header(v));
  }
}

// ---- the bodies -------------------------------------------------------------------------------------

// Worker 0's entry: the group's, then the accumulators', then the release.
MOK_HD inline bool open_pass(const PassView& v) {
  bool go = group_passed(v, WaitId::entry_barrier, call_of(v.kind));
  if (go && is_backward(v.kind)) go = all_passed(v, kZeroed, WaitId::accumulators_zeroed);
  release(v, kStart, go);
  return go;
}

// Worker 0's close: every worker out of the task loop; the closing barrier unless the pass failed (the rank's record
// holds a failure: the host's GroupState::error, a device executor's host-mapped record; a group of one on a device
// has no barrier to fail in, so this is what keeps a failed pass from writing its outputs).
MOK_HD inline bool close_pass(const PassView& v, bool go) {
  go = all_passed(v, kOut, WaitId::workers_out) && go;
  go = go && !record_claimed(v.error) && group_passed(v, WaitId::closing_barrier, call_of(v.kind));
  release(v, kClosed, go);
  return go;
}

template <class Ops>
MOK_HD void run_pass_worker(const PassView& v, int worker, Ops& ops) {
  if (is_backward(v.kind)) {
    ops.rows(v, share_job(RowWork::zero, worker));
    bump(&v.c.sync[kZeroed]);
  }
  bool go = worker == 0 ? open_pass(v) : released(v, kStart, WaitId::pass_start);
  if (go) take_tasks(v, class_of(v, worker), ops);
  bump(&v.c.sync[kOut]);
  go = worker == 0 ? close_pass(v, go) : released(v, kClosed, WaitId::pass_closed);
  if (go) {
    ops.rows(v, share_job(RowWork::finish, worker));
    note_progress(own_header(v));
  }
  bump(&v.c.sync[kFinished]);
  if (worker == 0) all_passed(v, kFinished, WaitId::workers_finished);
}

// The schedule build between its two barriers (the first publishes every rank's ids, the second ends
// every read of them): experts split across workers for the counts, worker 0 lays out the segments,
// experts split again for the rows. Worker 0 leaves the total in GroupState::total_rows.
MOK_HD inline void run_schedule_worker(const PassView& v, int worker) {
  const WaitId barrier_wait = WaitId::schedule_barrier;
  const CallKind call = CallKind::build_schedule;
  int n = workers_of(v);
  bool go = worker == 0 ? group_passed(v, barrier_wait, call) : released(v, kStart, WaitId::pass_start);
  if (worker == 0) release(v, kStart, go);
  // Every rank's ids and token count, readable once the first barrier has published them.
  const int32_t* ids[kMaxWorld];
  int32_t tokens[kMaxWorld];
  for (int r = 0; go && r < v.s.world; ++r) {
    ids[r] = peer_array<const int32_t>(v, r, v.peer.topk_ids);
    tokens[r] = v.headers[r]->tokens;
  }
  Routing routing{ids, tokens};
  Schedule s = v.sched;
  for (int e = worker; go && e < v.s.experts_per_rank; e += n) s.experts[2 * e] = count_expert(v.s, routing, e);
  if (go) note_progress(own_header(v));
  bump(&v.c.sync[kCounted]);
  if (worker == 0) {
    go = all_passed(v, kCounted, WaitId::schedule_counted) && go;
    if (go) v.group->total_rows = lay_out_segments(v.s, s);
    release(v, kLaidOut, go);
  } else {
    go = released(v, kLaidOut, WaitId::schedule_laid_out);
  }
  for (int e = worker; go && e < v.s.experts_per_rank; e += n) place_expert(v.s, routing, s, e);
  if (go) note_progress(own_header(v));
  bump(&v.c.sync[kPlaced]);
  if (worker != 0) return;
  go = all_passed(v, kPlaced, WaitId::schedule_placed) && go;
  if (go) group_passed(v, barrier_wait, call);
}

}  // namespace mok::core
