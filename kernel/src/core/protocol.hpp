// How workers and ranks hand work to each other: counters with release/acquire at explicit scopes,
// bounded waits with backoff that also watch an abort flag, barriers, and the error record.
//
// Counter rules (one producer class and one meaning each):
//   peer header `barrier`  every rank adds 1 on every rank per barrier; monotonic for the life of the
//                          group (a barrier's target is epoch * world), never reset;
//   peer header `abort`    set to 1 by the first failing worker of any rank, on every rank; sticky;
//   peer header `mapped`   shared-memory setup: each rank adds 1 once it has mapped this rank's buffer.
//   The pass-local counters (ready, done, freed, stage, wgrad chain, queue heads) live in the rank's
//   private workspace and are zeroed by the rank before its entry barrier; see core/pass.hpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <cuda/atomic>

#include "core/platform.hpp"
#include "core/shape.hpp"

namespace mok::core {

template <class T>
using SystemAtomic = cuda::atomic_ref<T, cuda::thread_scope_system>;  // across ranks
template <class T>
using DeviceAtomic = cuda::atomic_ref<T, cuda::thread_scope_device>;  // among one rank's workers

// The shape fields every rank of a group must share: they fix the peer layout, the schedule and
// the math. (Minibatch, macrobatch and worker counts are a rank's own business.)
constexpr int kGroupShapeFields = 10;

MOK_HD inline const char* group_shape_field(int i) {
  const char* names[kGroupShapeFields] = {
      "world",      "experts_per_rank",    "hidden",    "intermediate",   "top_k",
      "max_tokens", "shared_intermediate", "precision", "expert_padding", "swiglu_limit"};
  return names[i];
}

MOK_HD inline void group_shape(const LayerShape& s, int32_t* out) {
  float limit = s.swiglu_limit;
  int32_t limit_bits;
  memcpy(&limit_bits, &limit, 4);
  int32_t v[kGroupShapeFields] = {s.world,      s.experts_per_rank,    s.hidden, s.intermediate,   s.top_k,
                                  s.max_tokens, s.shared_intermediate, s.mxfp8,  s.expert_padding, limit_bits};
  for (int i = 0; i < kGroupShapeFields; ++i) out[i] = v[i];
}

// The start of every rank's peer buffer; one cache line per field so writers do not contend.
struct PeerHeader {
  alignas(64) uint64_t barrier;
  alignas(64) uint32_t abort;
  alignas(64) uint32_t mapped;
  alignas(64) int32_t tokens;                    // this rank's token count, staged with its topk ids
  alignas(64) int32_t shape[kGroupShapeFields];  // what every rank of the group must agree on

  // shared-memory setup (host/peer_memory.cpp): written by the segment's creator before the segment
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
static_assert(sizeof(PeerHeader) <= 512, "the peer layout reserves 512 bytes for the header");

enum class Outcome : int32_t { ok = 0, timeout = 1, peer_abort = 2 };

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
  stalled_worker,   // fault injection: a worker that stopped taking tasks
  earlier_abort,    // the group was already aborting when the call began
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
    case WaitId::stalled_worker: return "stalled worker (fault injection)";
    case WaitId::earlier_abort: return "none: the group was aborted before this call";
    case WaitId::count: break;
  }
  return "unknown";
}

struct Failure {
  Outcome outcome;
  WaitId wait;
  MOK_HD bool ok() const { return outcome == Outcome::ok; }
};
constexpr Failure kNoFailure{Outcome::ok, WaitId::none};

// Written once, by the first failure on this rank; the host reads it after the pass.
struct ErrorRecord {
  int32_t claimed;    // 0 until a failure claims the record
  int32_t published;  // 1 once the claimer has written the fields below
  int32_t outcome;    // Outcome
  int32_t rank;
  int32_t task_kind;   // TaskKind, -1 outside a task (barriers)
  int32_t task_index;  // the task's minibatch, tile or chunk
  int32_t wait;        // WaitId
};

MOK_HD inline void record_failure(ErrorRecord* rec, Failure f, int rank, int task_kind, int task_index) {
  int32_t expected = 0;
  if (!DeviceAtomic<int32_t>(rec->claimed).compare_exchange_strong(expected, 1)) return;
  rec->outcome = static_cast<int32_t>(f.outcome);
  rec->rank = rank;
  rec->task_kind = task_kind;
  rec->task_index = task_index;
  rec->wait = static_cast<int32_t>(f.wait);
  DeviceAtomic<int32_t>(rec->published).store(1, cuda::std::memory_order_release);
}

// A consistent copy of the record, readable while a pass runs; false when nothing failed.
MOK_HD inline bool read_record(ErrorRecord* rec, ErrorRecord* copy) {
  if (!DeviceAtomic<int32_t>(rec->claimed).load(cuda::std::memory_order_acquire)) return false;
  Backoff backoff;
  while (!DeviceAtomic<int32_t>(rec->published).load(cuda::std::memory_order_acquire)) backoff.pause();
  *copy = *rec;
  return true;
}

MOK_HD inline bool abort_seen(PeerHeader* own) {
  return SystemAtomic<uint32_t>(own->abort).load(cuda::std::memory_order_acquire) != 0;
}

// Tell every rank (this one included) to wind down.
MOK_HD inline void raise_abort(PeerHeader* const* headers, int world) {
  for (int r = 0; r < world; ++r) SystemAtomic<uint32_t>(headers[r]->abort).store(1, cuda::std::memory_order_release);
}

// Wait until `ready()` holds, the abort flag is seen, or `timeout_ns` passes. `ready` must do its own
// acquire loads.
// The abort flag is looked at first: once a pass is aborting, no wait succeeds.
template <class Ready>
MOK_HD Failure wait_for(Ready ready, PeerHeader* own, uint64_t timeout_ns, WaitId what) {
  uint64_t start = now_ns();
  Backoff backoff;
  for (;;) {
    if (abort_seen(own)) return Failure{Outcome::peer_abort, what};
    if (ready()) return kNoFailure;
    if (now_ns() - start > timeout_ns) return Failure{Outcome::timeout, what};
    backoff.pause();
  }
}

// Wait until a local counter reaches `target`.
MOK_HD inline Failure wait_counter(uint32_t* counter, uint32_t target, PeerHeader* own, uint64_t timeout_ns,
                                   WaitId what) {
  DeviceAtomic<uint32_t> c(*counter);
  return wait_for([&] { return c.load(cuda::std::memory_order_acquire) >= target; }, own, timeout_ns, what);
}

MOK_HD inline void publish(uint32_t* counter, uint32_t value) {
  DeviceAtomic<uint32_t>(*counter).store(value, cuda::std::memory_order_release);
}

MOK_HD inline void bump(uint32_t* counter) {
  DeviceAtomic<uint32_t>(*counter).fetch_add(1, cuda::std::memory_order_acq_rel);
}

// Barrier number `epoch` (1, 2, ...) of the group: every rank's writes before it are visible to
// every rank after it.
MOK_HD inline Failure barrier(PeerHeader* const* headers, int world, int rank, uint64_t epoch, uint64_t timeout_ns,
                              WaitId what) {
  for (int r = 0; r < world; ++r)
    SystemAtomic<uint64_t>(headers[r]->barrier).fetch_add(1, cuda::std::memory_order_release);
  SystemAtomic<uint64_t> mine(headers[rank]->barrier);
  uint64_t target = epoch * static_cast<uint64_t>(world);
  return wait_for([&] { return mine.load(cuda::std::memory_order_acquire) >= target; }, headers[rank], timeout_ns,
                  what);
}

}  // namespace mok::core
