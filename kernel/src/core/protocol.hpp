// How workers and ranks hand work to each other: counters with release/acquire at explicit scopes,
// bounded waits with backoff that also watch an abort flag, the group's formation, barriers, and the
// error record. A wait's bound is a time without progress: it gives up once `timeout` passes in which
// the ranks it waits for (its own rank, for a wait on the rank's own workers) finished no work, so a
// slow rank that keeps working never fails its group, and a dead or frozen one does within about one
// timeout of its last task.
//
// Peer-header words (the buffer may hold an earlier group's data or garbage: nothing in it is read
// as this group's until its owner has shown, by acknowledging the reader's incarnation, that it
// reset it):
//   `incarnation`  the owner's fresh random 64-bit id, published at creation after the reset;
//   `seen[r]`      the owner's copy of rank r's incarnation: r's acknowledgement test (single writer);
//   `arrival`      the owner's latest barrier epoch and the call it entered from (single writer,
//                  monotonic for the life of the group); a barrier waits until every peer's epoch
//                  reaches its own;
//   `abort`        any rank writes the owner's incarnation into it once the group is aborting; sticky;
//   `reason`       why the owner aborted the group (e.g. the arguments it rejected), valid once
//                  `reason_stamp` holds the owner's incarnation;
//   `progress`     the owner's workers add 1 as they finish a task or a share (relaxed; monotonic for
//                  the life of the group): a wait on the owner gives up only once it stops moving;
//   `mapped`       shared-memory setup: each rank adds 1 once it has mapped this rank's buffer.
//   The pass-local counters (ready, done, freed, stage, wgrad chain, queue heads) live in the rank's
//   private workspace and are zeroed by the rank before its entry barrier; see core/pass.hpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <cuda/atomic>

#include "core/platform.hpp"
#include "core/shape.hpp"

namespace mok::core {

// ::cuda (libcu++), not cuda: a unit may include core/ after a header that declares mok::cuda.
template <class T>
using SystemAtomic = ::cuda::atomic_ref<T, ::cuda::thread_scope_system>;  // across ranks
template <class T>
using DeviceAtomic = ::cuda::atomic_ref<T, ::cuda::thread_scope_device>;  // among one rank's workers

// The shape fields every rank of a group must share: they fix the peer layout, the schedule and
// the math. (Minibatch, macrobatch and worker counts are a rank's own business.)
constexpr int kGroupShapeFields = 13;
constexpr int kGroupShapeLimit = 9, kGroupShapeAlpha = 11;  // the fields compared as float bits

MOK_HD inline const char* group_shape_field(int i) {
  const char* names[kGroupShapeFields] = {
      "world",      "experts_per_rank",    "hidden",       "intermediate",   "top_k",
      "max_tokens", "shared_intermediate", "precision",    "expert_padding", "swiglu_limit",
      "activation", "swiglu_alpha",        "routing_scale"};
  return names[i];
}

MOK_HD inline void group_shape(const LayerShape& s, int32_t* out) {
  float limit = s.swiglu_limit, alpha = s.swiglu_alpha;
  int32_t limit_bits, alpha_bits;
  memcpy(&limit_bits, &limit, 4);
  memcpy(&alpha_bits, &alpha, 4);
  int32_t v[kGroupShapeFields] = {
      s.world, s.experts_per_rank, s.hidden,   s.intermediate, s.top_k,    s.max_tokens,   s.shared_intermediate,
      s.mxfp8, s.expert_padding,   limit_bits, s.activation,   alpha_bits, s.routing_scale};
  for (int i = 0; i < kGroupShapeFields; ++i) out[i] = v[i];
}

// The calls that enter a barrier; every rank of the group makes the same sequence of them.
enum class CallKind : uint32_t { none = 0, build_schedule, forward, recompute, backward, count };

MOK_HD inline const char* call_name(uint32_t call) {
  switch (static_cast<CallKind>(call)) {
    case CallKind::build_schedule: return "mokLayerBuildSchedule";
    case CallKind::forward: return "mokLayerForward";
    case CallKind::recompute: return "mokLayerRecompute";
    case CallKind::backward: return "mokLayerBackward";
    default: break;
  }
  return "no call";
}

constexpr int kReasonBytes = 192;

// The start of every rank's peer buffer; one cache line per polled word so writers do not contend.
// The owner resets the group fields at creation (the buffer may hold an earlier group's data or
// garbage), then publishes a fresh random incarnation. A peer trusts this header only once it shows
// that peer's own incarnation in `seen`, which stale memory never does.
struct PeerHeader {
  alignas(64) uint64_t incarnation;       // owner: random and non-zero, published last at creation
  alignas(64) uint64_t arrival;           // owner: (epoch << 8) | CallKind of the last barrier it entered
  alignas(64) uint64_t abort;             // any rank: the owner's incarnation once the group is aborting
  alignas(64) uint64_t reason_stamp;      // owner: its incarnation once `reason` says why it aborted the group
  alignas(64) uint64_t progress;          // owner's workers: tasks and shares finished (relaxed)
  alignas(64) int32_t tokens;             // owner: its token count, staged with its topk ids
  int32_t shape[kGroupShapeFields];       // owner: what every rank of the group must agree on
  alignas(64) char reason[kReasonBytes];  // owner: e.g. the detail of the arguments it rejected
  alignas(64) uint64_t seen[kMaxWorld];   // owner: seen[r] = rank r's incarnation as the owner last read it
  // shared-memory setup (host/peer_memory.cpp): not reset by the owner at creation
  alignas(64) uint32_t mapped;  // each rank adds 1 once it has mapped this rank's buffer
  // Written by the segment's creator by the segment's creator before the segment
  // gets its name, then changed only through atomics. Unused with caller-given peer bases.
  alignas(64) uint32_t setup_magic;  // host::kSegmentMagic: a libmok segment with this header
  uint32_t setup_state;              // host::SegmentState: open, sealed, poisoned or failed
  int32_t setup_owner;               // pid of the creator
  int32_t setup_collider;            // pid of a process that met this segment's name in use
  uint32_t setup_seen;               // peers that have inspected this header
  uint64_t setup_bytes;              // the segment's size
  uint64_t setup_nonce;              // random: this incarnation of the name
  uint64_t setup_group;              // hash of the nonces its creator mapped, rank by rank; 0 before
};
static_assert(sizeof(PeerHeader) <= kPeerHeaderBytes, "the peer layout reserves kPeerHeaderBytes for the header");

enum class Outcome : int32_t {
  ok = 0,
  timeout = 1,
  peer_abort = 2,
  shape_mismatch = 3,      // a peer's published shape differs from this rank's (mokInvalidArgument)
  call_mismatch = 4,       // a peer entered the same barrier from a different call (mokInvalidUsage)
  rejected_arguments = 5,  // this rank rejected its call's arguments and aborted the group (mokInvalidArgument)
  rejected_order = 6,      // this rank refused its call in this state and aborted the group (mokInvalidUsage)
  launch_failed = 7,       // a device executor could not enqueue all of a call's work (mokCudaError)
};

// Which wait gave up: named in the error record.
enum class WaitId : int32_t {
  none = 0,
  schedule_barrier,
  entry_barrier,
  closing_barrier,
  ring_slot_free,   // dispatch waits for the combine that last used its ring rows
  minibatch_ready,  // a tile waits for its rows to arrive
  tile_stage,       // a tile's next stage waits for the previous one
  minibatch_done,   // combine waits for every tile of its minibatch
  wgrad_order,      // an expert's weight-gradient tiles run in row order
  shared_order,     // the shared expert's weight-gradient chunks run in token order
  out_rows_free,    // down / dgrad_x wait for the combine that last pushed their output rows
  stalled_worker,   // fault injection: a worker that stopped taking tasks
  earlier_abort,    // the group was already aborting when the call began
  group_formation,  // the first collective call waits for every peer to acknowledge this rank
  rejected_call,    // not a wait: the call's arguments or order were rejected
  // one rank's workers waiting for each other (core/pass_worker.hpp)
  pass_start,           // a worker waits for worker 0 to pass the entry barrier
  accumulators_zeroed,  // worker 0 waits for every worker's share of the accumulators to be zero
  workers_out,          // worker 0 waits for every worker to leave the task loop
  pass_closed,          // a worker waits for worker 0 to pass the closing barrier
  workers_finished,     // worker 0 waits for every worker's share of the home sums and write-out
  schedule_counted,     // worker 0 waits for every worker's expert counts
  schedule_laid_out,    // a worker waits for worker 0 to lay out the segments
  schedule_placed,      // worker 0 waits for every worker's rows
  tensor_core,          // a GPU worker's CTA waits for its tile's TMA loads and MMAs (cuda/tensor_tile.cuh)
  row_copy,             // a GPU worker's CTA waits for a bulk copy of a row to land (cuda/row_copies.cuh)
  count
};

MOK_HD inline const char* wait_name(WaitId w) {
  switch (w) {
    case WaitId::none: return "none";
    case WaitId::schedule_barrier: return "schedule barrier";
    case WaitId::entry_barrier: return "entry barrier";
    case WaitId::closing_barrier: return "closing barrier";
    case WaitId::ring_slot_free: return "ring slot free";
    case WaitId::minibatch_ready: return "minibatch ready";
    case WaitId::tile_stage: return "tile stage";
    case WaitId::minibatch_done: return "minibatch done";
    case WaitId::wgrad_order: return "wgrad order";
    case WaitId::shared_order: return "shared expert order";
    case WaitId::out_rows_free: return "output rows free";
    case WaitId::stalled_worker: return "stalled worker (fault injection)";
    case WaitId::earlier_abort: return "none: the group was aborted before this call";
    case WaitId::group_formation: return "group formation";
    case WaitId::rejected_call: return "none: the call was rejected";
    case WaitId::pass_start: return "pass start (local workers)";
    case WaitId::accumulators_zeroed: return "accumulators zeroed (local workers)";
    case WaitId::workers_out: return "tasks finished (local workers)";
    case WaitId::pass_closed: return "pass closed (local workers)";
    case WaitId::workers_finished: return "home sums finished (local workers)";
    case WaitId::schedule_counted: return "schedule counted (local workers)";
    case WaitId::schedule_laid_out: return "schedule laid out (local workers)";
    case WaitId::schedule_placed: return "schedule placed (local workers)";
    case WaitId::tensor_core: return "tile loads and MMAs finished (local worker)";
    case WaitId::row_copy: return "bulk copy of a row landed (local worker)";
    case WaitId::count: break;
  }
  return "unknown";
}

// `peer`: the rank a barrier or the formation waited for, or the one that differed (-1: none).
struct Failure {
  Outcome outcome;
  WaitId wait;
  int32_t peer = -1;
  MOK_HD bool ok() const { return outcome == Outcome::ok; }
};
constexpr Failure kNoFailure{Outcome::ok, WaitId::none, -1};

// Written once, by the first failure on this rank; the host reads it after the pass.
struct ErrorRecord {
  int32_t claimed;    // 0 until a failure claims the record
  int32_t published;  // 1 once the claimer has written the fields below
  int32_t outcome;    // Outcome
  int32_t rank;
  int32_t task_kind;   // TaskKind, -1 outside a task (barriers)
  int32_t task_index;  // the task's minibatch, tile or chunk
  int32_t wait;        // WaitId
  int32_t peer;        // Failure::peer
  char detail[256];    // the message, where the host wrote one ("" otherwise)
};

MOK_HD inline void record_failure(ErrorRecord* rec, Failure f, int rank, int task_kind, int task_index,
                                  const char* detail = nullptr) {
  int32_t expected = 0;
  // System scope: on a device executor the host claims it too (mokLayerAbort, a call cut short) while kernels may.
  if (!SystemAtomic<int32_t>(rec->claimed).compare_exchange_strong(expected, 1)) return;
  rec->outcome = static_cast<int32_t>(f.outcome);
  rec->rank = rank;
  rec->task_kind = task_kind;
  rec->task_index = task_index;
  rec->wait = static_cast<int32_t>(f.wait);
  rec->peer = f.peer;
  int n = 0;
  for (; detail && detail[n] && n + 1 < static_cast<int>(sizeof(rec->detail)); ++n) rec->detail[n] = detail[n];
  rec->detail[n] = '\0';
  // System scope: a device executor's record lives in host-mapped memory (cuda/mapped_record.hpp), where the
  // host reads it while the pass runs; the release makes the fields above visible to it before the flag.
  SystemAtomic<int32_t>(rec->published).store(1, ::cuda::std::memory_order_release);
}

// A consistent copy of the record, readable while a pass runs; false when nothing failed.
MOK_HD inline bool read_record(ErrorRecord* rec, ErrorRecord* copy) {
  if (!SystemAtomic<int32_t>(rec->claimed).load(::cuda::std::memory_order_acquire)) return false;
  Backoff backoff;
  while (!DeviceAtomic<int32_t>(rec->published).load(::cuda::std::memory_order_acquire)) backoff.pause();
  *copy = *rec;
  return true;
}

// The record as far as it is published, never waiting: false until the claimer has written every field. The
// host's read of a device's record, whose claimer may have died with its kernel between claim and publish.
MOK_HD inline bool read_published_record(const ErrorRecord* rec, ErrorRecord* copy) {
  if (!SystemAtomic<int32_t>(const_cast<int32_t&>(rec->published)).load(::cuda::std::memory_order_acquire))
    return false;
  *copy = *rec;
  return true;
}

// ---- the group: incarnations, acknowledgements, abort -------------------------------------------
// Formation and abort use sequentially consistent accesses: a rank that acknowledges a peer and
// then looks at the peer's abort word, and a peer that raises its abort and then looks for that
// acknowledgement, must not both miss the other's store.

MOK_HD inline uint64_t load_word(uint64_t& w) {
  return SystemAtomic<uint64_t>(w).load(::cuda::std::memory_order_seq_cst);
}
MOK_HD inline void store_word(uint64_t& w, uint64_t v) {
  SystemAtomic<uint64_t>(w).store(v, ::cuda::std::memory_order_seq_cst);
}

// The owner, at creation: reset every group field, publish the shape, then the incarnation.
MOK_HD inline void reset_header(PeerHeader* own, const int32_t* shape, uint64_t incarnation) {
  store_word(own->incarnation, 0);
  store_word(own->arrival, 0);
  store_word(own->abort, 0);
  store_word(own->reason_stamp, 0);
  store_word(own->progress, 0);
  for (int r = 0; r < kMaxWorld; ++r) store_word(own->seen[r], 0);
  own->tokens = 0;
  for (int i = 0; i < kGroupShapeFields; ++i) own->shape[i] = shape[i];
  own->reason[0] = '\0';
  store_word(own->incarnation, incarnation);
}

// Peer q's header belongs to this group: q reset it and acknowledged this rank's incarnation.
MOK_HD inline bool joined(PeerHeader* const* headers, int rank, int q) {
  return q == rank || load_word(headers[q]->seen[rank]) == load_word(headers[rank]->incarnation);
}

// Copy every peer's published incarnation into the own `seen` (a stale one is harmless: its owner
// finds no acknowledgement in it).
MOK_HD inline void acknowledge(PeerHeader* const* headers, int world, int rank) {
  PeerHeader* own = headers[rank];
  for (int q = 0; q < world; ++q) {
    uint64_t inc = load_word(headers[q]->incarnation);
    if (load_word(own->seen[q]) != inc) store_word(own->seen[q], inc);
  }
}

// Peer q (of this group) is aborting: its own abort word carries its incarnation.
MOK_HD inline bool peer_aborting(PeerHeader* const* headers, int q) {
  uint64_t inc = load_word(headers[q]->incarnation);
  return inc != 0 && load_word(headers[q]->abort) == inc;
}

MOK_HD inline bool abort_seen(PeerHeader* own) {
  uint64_t inc = SystemAtomic<uint64_t>(own->incarnation).load(::cuda::std::memory_order_relaxed);
  return SystemAtomic<uint64_t>(own->abort).load(::cuda::std::memory_order_acquire) == inc && inc != 0;
}

// Tell every rank (this one included) to wind down. A peer that has not acknowledged this rank yet
// is not written (its header may still be stale and about to be reset); it sees this rank's own
// abort word when it acknowledges. A peer that is written is acknowledged first, so that once it
// sees the abort it also trusts this header (and finds the reason written before it).
MOK_HD inline void raise_abort(PeerHeader* const* headers, int world, int rank) {
  store_word(headers[rank]->abort, load_word(headers[rank]->incarnation));
  for (int q = 0; q < world; ++q) {
    if (q == rank || !joined(headers, rank, q)) continue;
    uint64_t inc = load_word(headers[q]->incarnation);
    store_word(headers[rank]->seen[q], inc);
    store_word(headers[q]->abort, inc);
  }
}

// The first shape field in which peer q differs from this rank, or -1.
MOK_HD inline int differing_field(PeerHeader* const* headers, int rank, int q) {
  for (int i = 0; i < kGroupShapeFields; ++i)
    if (headers[q]->shape[i] != headers[rank]->shape[i]) return i;
  return -1;
}

// Every peer this rank waits for has joined: peers below `need`, or -1 when all have.
MOK_HD inline int first_missing(PeerHeader* const* headers, int need, int rank) {
  for (int q = 0; q < need; ++q)
    if (!joined(headers, rank, q)) return q;
  return -1;
}

// Wait (bounded) until every peer has joined, acknowledging them meanwhile; then acknowledge once
// more, so that every peer trusts this header too. A rank that leaves the formation early (it
// rejected its call) does this first, so that no peer misses its verdict. Returns the peer that
// never joined, or -1.
MOK_HD inline int await_joined(PeerHeader* const* headers, int world, int rank, uint64_t timeout_ns) {
  uint64_t start = now_ns();
  Backoff backoff;
  for (;;) {
    acknowledge(headers, world, rank);
    int missing = first_missing(headers, world, rank);
    if (missing < 0 || now_ns() - start > timeout_ns) return acknowledge(headers, world, rank), missing;
    backoff.pause();
  }
}

// The agreement wait of a rank's first collective call: every peer has reset its header and
// acknowledged this rank, and every peer's shape equals this rank's (Failure::peer names one that
// differs). An aborting peer fails it at once. A differing shape is reported once every peer has
// joined, so that each sees this rank's verdict, or at once for ranks that a peer with a smaller
// `world` does not count; a missing peer runs out the timeout.
MOK_HD inline Failure form_group(PeerHeader* const* headers, int world, int rank, uint64_t timeout_ns) {
  const WaitId what = WaitId::group_formation;
  uint64_t start = now_ns();
  Backoff backoff;
  for (;;) {
    acknowledge(headers, world, rank);
    if (abort_seen(headers[rank])) return Failure{Outcome::peer_abort, what, rank};
    int need = world, differs = -1;
    for (int q = 0; q < world; ++q) {
      if (!joined(headers, rank, q)) continue;
      if (peer_aborting(headers, q)) return Failure{Outcome::peer_abort, what, q};
      if (differing_field(headers, rank, q) < 0) continue;
      differs = differs < 0 ? q : differs;
      need = headers[q]->shape[0] < need ? headers[q]->shape[0] : need;  // shape[0]: world, 1..72
    }
    int missing = first_missing(headers, need, rank);
    if (missing < 0) {
      // Peers may have joined since the scan above: look at every joined peer's shape again.
      acknowledge(headers, world, rank);
      for (int q = 0; q < world; ++q) {
        if (!joined(headers, rank, q)) continue;
        if (peer_aborting(headers, q)) return Failure{Outcome::peer_abort, what, q};
        if (differs < 0 && differing_field(headers, rank, q) >= 0) differs = q;
      }
      return differs < 0 ? kNoFailure : Failure{Outcome::shape_mismatch, what, differs};
    }
    if (now_ns() - start > timeout_ns)
      return differs < 0 ? Failure{Outcome::timeout, what, missing} : Failure{Outcome::shape_mismatch, what, differs};
    backoff.pause();
  }
}

// ---- progress: what keeps a wait alive ----------------------------------------------------------

// The owner's workers finished a task or a share. Relaxed: the word only tells waiters that the rank
// is alive and working; nothing is read because of it.
MOK_HD inline void note_progress(PeerHeader* own) {
  SystemAtomic<uint64_t>(own->progress).fetch_add(1, ::cuda::std::memory_order_relaxed);
}

// The ranks [first, end) whose progress a wait watches (their headers belong to the group).
struct Watched {
  PeerHeader* const* headers;
  int first, end;
};

// Their progress words summed: each only grows, so the sum moves exactly when one of them does.
MOK_HD inline uint64_t progress_of(Watched w) {
  uint64_t sum = 0;
  for (int q = w.first; q < w.end; ++q)
    sum += SystemAtomic<uint64_t>(w.headers[q]->progress).load(::cuda::std::memory_order_relaxed);
  return sum;
}

// A wait's clock: it runs out once `timeout_ns` passes with no move of the progress it watches. The
// progress is read every timeout / 16 of waiting, never in a wait that ends sooner, so a wait gives up
// between one and about 1.13 timeouts after the last progress it could see.
struct Patience {
  uint64_t timeout_ns;
  uint64_t since;       // the wait's start, or when it last saw progress
  uint64_t sampled_at;  // when the progress was last read
  uint64_t seen = 0;    // what it read then
  bool sampled = false;

  MOK_HD explicit Patience(uint64_t timeout) : timeout_ns(timeout), since(now_ns()), sampled_at(since) {}

  MOK_HD bool run_out(Watched w) {
    uint64_t now = now_ns();
    if (now - sampled_at < timeout_ns / 16) return false;
    uint64_t p = progress_of(w);
    if (sampled && p != seen) since = now;
    seen = p;
    sampled = true;
    sampled_at = now;
    return now - since > timeout_ns;
  }
};

// A wait on the own rank's workers watches the own progress word.
MOK_HD inline Watched own_rank(PeerHeader* const& own) {
  return Watched{&own, 0, 1};
}

// Wait until `ready()` holds, the abort flag is seen, or `timeout_ns` passes in which the own rank's
// workers finished nothing. `ready` must do its own acquire loads.
// The abort flag is looked at first: once a pass is aborting, no wait succeeds.
template <class Ready>
MOK_HD Failure wait_for(Ready ready, PeerHeader* own, uint64_t timeout_ns, WaitId what) {
  Patience patience(timeout_ns);
  Backoff backoff;
  for (;;) {
    if (abort_seen(own)) return Failure{Outcome::peer_abort, what};
    if (ready()) return kNoFailure;
    if (patience.run_out(own_rank(own))) return Failure{Outcome::timeout, what};
    backoff.pause();
  }
}

// Wait until a local counter reaches `target`.
MOK_HD inline Failure wait_counter(uint32_t* counter, uint32_t target, PeerHeader* own, uint64_t timeout_ns,
                                   WaitId what) {
  DeviceAtomic<uint32_t> c(*counter);
  return wait_for([&] { return c.load(::cuda::std::memory_order_acquire) >= target; }, own, timeout_ns, what);
}

MOK_HD inline void publish(uint32_t* counter, uint32_t value) {
  DeviceAtomic<uint32_t>(*counter).store(value, ::cuda::std::memory_order_release);
}

MOK_HD inline void bump(uint32_t* counter) {
  DeviceAtomic<uint32_t>(*counter).fetch_add(1, ::cuda::std::memory_order_acq_rel);
}

MOK_HD inline uint64_t arrival_word(uint64_t epoch, CallKind call) {
  return epoch << 8 | static_cast<uint64_t>(call);
}

// Barrier number `epoch` (1, 2, ...) of a formed group, entered from `call`: every rank's writes
// before it are visible to every rank after it. Arrivals are single-writer: each rank stores its
// own epoch, so no rank ever resets a word a peer writes. A peer at the same epoch from another call
// fails the barrier at once (call_mismatch; Failure::peer names it); a timeout names a peer that
// did not arrive. The wait restarts its timeout while the peers that have not arrived show progress,
// so a peer with far more work than the others keeps the group alive. Unlike other waits, a barrier
// every rank has reached completes even when an abort was raised since (a failed rank never arrives):
// a rank that passed it and then aborted the group (it rejected its next call) does not fail a call
// its peers completed too.
MOK_HD inline Failure barrier(PeerHeader* const* headers, int world, int rank, uint64_t epoch, CallKind call,
                              uint64_t timeout_ns, WaitId what) {
  SystemAtomic<uint64_t>(headers[rank]->arrival).store(arrival_word(epoch, call), ::cuda::std::memory_order_release);
  Patience patience(timeout_ns);
  Backoff backoff;
  for (int next = 0;;) {  // peers before `next` have arrived
    for (; next < world; ++next) {
      uint64_t a = SystemAtomic<uint64_t>(headers[next]->arrival).load(::cuda::std::memory_order_acquire);
      if (a >> 8 < epoch) break;
      // Past this epoch, the peer completed this barrier, so it entered it from this call too.
      if (a >> 8 == epoch && (a & 0xff) != static_cast<uint64_t>(call))
        return Failure{Outcome::call_mismatch, what, next};
    }
    if (next == world) return kNoFailure;
    if (abort_seen(headers[rank])) return Failure{Outcome::peer_abort, what, -1};
    if (patience.run_out(Watched{headers, next, world})) return Failure{Outcome::timeout, what, next};
    backoff.pause();
  }
}

// The call peer q entered its latest barrier from.
MOK_HD inline uint32_t arrival_call(PeerHeader* const* headers, int q) {
  return static_cast<uint32_t>(SystemAtomic<uint64_t>(headers[q]->arrival).load(::cuda::std::memory_order_acquire) &
                               0xff);
}

}  // namespace mok::core
