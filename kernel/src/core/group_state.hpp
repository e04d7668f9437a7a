// A rank's side of the group between calls: barrier epochs, formation, the current schedule and
// context, the error record, and the rules on which call may follow which. Every executor holds one
// per layer; only the wording of failures (host/pass_errors.cpp) is the executor's own.
#pragma once

#include <cstdint>

#include "core/protocol.hpp"
#include "core/tasks.hpp"

namespace mok::core {

struct GroupState {
  uint64_t epoch;         // barriers this rank has entered; the same sequence on every rank
  int tokens;             // this rank's tokens in the current schedule
  int64_t total_rows;     // rows this rank receives in the current schedule, padding included
  bool has_schedule;      // a schedule build succeeded and nothing dropped it since
  bool has_context;       // a forward or recompute ran on the current schedule
  bool ring_kept;         // and the ring still holds every row's x, g and u from it (no backward since)
  bool formed;            // every peer acknowledged this context (the first collective call's wait)
  bool left;              // a device executor's rank has told its peers it is out (leave_group: once)
  ErrorRecord error;      // the rank's first failure
  Failure group_failure;  // the latest call's formation or barrier failure, for the executor to word and settle
};

MOK_HD inline bool failed(GroupState& g) {
  ErrorRecord e;
  return read_record(&g.error, &e);
}

MOK_HD inline bool group_aborted(GroupState& g, PeerHeader* own) {
  return failed(g) || abort_seen(own);
}

MOK_HD inline CallKind call_of(PassKind kind) {
  if (is_backward(kind)) return CallKind::backward;
  return kind == PassKind::recompute ? CallKind::recompute : CallKind::forward;
}

// Why a collective call is refused before it starts, checked in this order.
enum class Refusal { none, aborted_earlier, needs_schedule, needs_context };

// The order's part, for any executor's record of its state.
MOK_HD inline Refusal order_refusal(CallKind call, bool has_schedule, bool has_context) {
  if ((call == CallKind::forward || call == CallKind::recompute) && !has_schedule) return Refusal::needs_schedule;
  if (call == CallKind::backward && !has_context) return Refusal::needs_context;
  return Refusal::none;
}

MOK_HD inline Refusal check_call(GroupState& g, PeerHeader* own, CallKind call) {
  if (group_aborted(g, own)) return Refusal::aborted_earlier;
  return order_refusal(call, g.has_schedule, g.has_context);
}

// The rule a call refused for its order broke, as every executor words it after the call's name.
MOK_HD inline const char* order_rule(Refusal refusal) {
  switch (refusal) {
    case Refusal::needs_schedule: return "call mokLayerBuildSchedule first";
    case Refusal::needs_context: return "needs a mokLayerForward or mokLayerRecompute since the last schedule";
    default: break;
  }
  return "";
}

// A failing mokLayerBuildSchedule leaves no schedule and no context: the buffers a caller sized for
// its token count are never used with an older one.
MOK_HD inline void drop_schedule(GroupState& g) {
  g.has_schedule = g.has_context = g.ring_kept = false;
}

// A context restored by the caller: the ring holds some other pass's rows, so its backward recomputes g
// and u from the restored x.
MOK_HD inline void restore_context(GroupState& g) {
  g.has_context = true;
  g.ring_kept = false;
}

// Before the group has formed, peers cannot trust this header yet: wait (bounded) until each has
// joined, then abort them too, so that none waits for this rank.
MOK_HD inline void tell_unformed_peers(GroupState& g, PeerHeader* const* headers, int world, int rank,
                                       uint64_t timeout_ns) {
  if (g.formed || world == 1) return;
  if (await_joined(headers, world, rank, timeout_ns) < 0) g.formed = true;
  raise_abort(headers, world, rank);
}

// A call made once the group is aborting: recorded; an abort raised before this rank's first call
// (mokLayerAbort) still reaches peers that had not joined.
MOK_HD inline void note_earlier_abort(GroupState& g, PeerHeader* const* headers, int world, int rank,
                                      uint64_t timeout_ns) {
  record_failure(&g.error, Failure{Outcome::peer_abort, WaitId::earlier_abort}, rank, -1, -1);
  if (abort_seen(headers[rank])) tell_unformed_peers(g, headers, world, rank, timeout_ns);
}

// The first collective call's agreement wait (once per context), then the barrier of `call`. A rank
// that failed does not arrive at later barriers: an arrival could complete a barrier its peers are
// still waiting in. They see the abort flag instead.
MOK_HD inline Failure group_barrier(GroupState& g, PeerHeader* const* headers, int world, int rank, uint64_t timeout_ns,
                                    WaitId what, CallKind call) {
  if (!g.formed) {
    Failure f = form_group(headers, world, rank, timeout_ns);
    if (!f.ok()) return f;
    g.formed = true;
  }
  return barrier(headers, world, rank, ++g.epoch, call, timeout_ns, what);
}

// The rank that left the group on purpose (mokLayerAbort, a refused call) with its reason stamped in its header, as
// leave_group_for stamps it; -1 when none did. Only a joined peer's header is this group's.
MOK_HD inline int stamped_peer(PeerHeader* const* headers, int world, int rank) {
  for (int q = 0; q < world; ++q) {
    uint64_t incarnation = load_word(headers[q]->incarnation);
    if (incarnation != 0 && joined(headers, rank, q) && load_word(headers[q]->reason_stamp) == incarnation) return q;
  }
  return -1;
}

// A failure of the group outside the workers (formation, barriers), recorded into `error` (the rank's
// record: g.error on the host, a device executor's host-mapped one) with the executor's wording of it,
// or, given none, an abort's reason as the rank that left on purpose stamped it.
// A timeout or an abort is passed on to every rank; a mismatch is not: every rank finds it itself, and
// an abort could reach a peer before it sees the mismatch and hide the message.
MOK_HD inline void settle_group_failure(GroupState& g, ErrorRecord* error, PeerHeader* const* headers, int world,
                                        int rank, uint64_t timeout_ns, Failure f, const char* detail) {
  if (f.outcome == Outcome::peer_abort) {
    // Wait (bounded) for every peer to join before the record names the rank that left on purpose: the abort can
    // come through another peer before that rank has acknowledged this one (it was preempted inside raise_abort),
    // and stamped_peer trusts only a peer that has.
    tell_unformed_peers(g, headers, world, rank, timeout_ns);
    f.peer = stamped_peer(headers, world, rank);
    if (!detail && f.peer >= 0) detail = headers[f.peer]->reason;
  }
  record_failure(error, f, rank, -1, -1, detail);
  if (f.outcome == Outcome::timeout || f.outcome == Outcome::peer_abort) raise_abort(headers, world, rank);
}

// A refused call reaches the group unless the group has one rank (whose context then stays usable)
// or is aborting already (the first reason stands).
MOK_HD inline bool refusal_reaches_group(GroupState& g, PeerHeader* const* headers, int world, int rank) {
  return world > 1 && !group_aborted(g, headers[rank]);
}

// A collective call this rank refuses (its arguments, or its order), once the executor has written
// why into the own header's `reason`: the reason is stamped before the abort is raised, so a peer
// that sees the abort finds it.
MOK_HD inline void reject_call(GroupState& g, PeerHeader* const* headers, int world, int rank, uint64_t timeout_ns,
                               bool order, const char* detail) {
  PeerHeader* own = headers[rank];
  store_word(own->reason_stamp, load_word(own->incarnation));
  Outcome outcome = order ? Outcome::rejected_order : Outcome::rejected_arguments;
  record_failure(&g.error, Failure{outcome, WaitId::rejected_call}, rank, -1, -1, detail);
  raise_abort(headers, world, rank);
  tell_unformed_peers(g, headers, world, rank, timeout_ns);
}

// ---- a device executor's barriers ---------------------------------------------------------------
// A device executor enqueues each barrier as one thread of a kernel on the rank's stream, so the host
// never waits in one. The group's state (formation, epoch) lives in device memory and the barrier
// advances it itself, so a captured CUDA graph's replay enters the next epoch as a new call would.
// The host reads only its own rank's record, so a peer's reason for leaving travels into it.

// This rank's record holds a failure (its ids refused, a call cut short, an earlier barrier, an abort):
// read without waiting for the claimer to publish, as a kernel may race the host's claim.
MOK_HD inline bool record_claimed(ErrorRecord* error) {
  return SystemAtomic<int32_t>(error->claimed).load(::cuda::std::memory_order_acquire) != 0;
}

// Tell every peer this rank is out (raise_abort, and before formation wait, bounded, until each can
// trust this header): no peer then waits out its timeout for a rank that will not arrive.
// Once: a rank that never saw a peer join waits for it once, not at every barrier queued after the failure.
MOK_HD inline void leave_group(GroupState& g, PeerHeader* const* headers, int world, int rank, uint64_t timeout_ns) {
  if (world == 1 || g.left) return;
  g.left = true;
  raise_abort(headers, world, rank);
  tell_unformed_peers(g, headers, world, rank, timeout_ns);
}

// A record of a rank that left the group on purpose: a refused call, or mokLayerAbort.
MOK_HD inline bool on_purpose(int32_t outcome, int32_t wait) {
  return outcome == static_cast<int32_t>(Outcome::rejected_arguments) ||
         outcome == static_cast<int32_t>(Outcome::rejected_order) ||
         (outcome == static_cast<int32_t>(Outcome::peer_abort) && wait == static_cast<int32_t>(WaitId::none));
}

// This rank leaves the group; with a `reason` (it left on purpose) that reason into its header first and stamped,
// unless the group is aborting already (its first reason stands).
MOK_HD inline void leave_group_for(GroupState& g, PeerHeader* const* headers, int world, int rank, uint64_t timeout_ns,
                                   const char* reason) {
  PeerHeader* own = headers[rank];
  uint64_t incarnation = load_word(own->incarnation);
  if (reason && world > 1 && load_word(own->reason_stamp) != incarnation && !abort_seen(own)) {
    int n = 0;
    for (; reason[n] && n + 1 < kReasonBytes; ++n) own->reason[n] = reason[n];
    own->reason[n] = '\0';
    store_word(own->reason_stamp, incarnation);  // seq_cst: the reason before the stamp
  }
  leave_group(g, headers, world, rank, timeout_ns);
}

// This rank's record holds a failure: it leaves the group, its reason told where it left on purpose.
// The claimer (the host, or a kernel of this rank) publishes right after its claim: wait for that, bounded, so that
// the reason is not lost to a barrier that saw the claim first.
MOK_HD inline void leave_failed(GroupState& g, ErrorRecord* error, PeerHeader* const* headers, int world, int rank,
                                uint64_t timeout_ns) {
  uint64_t start = now_ns();
  Backoff backoff;
  bool published;
  while (!(published = SystemAtomic<int32_t>(error->published).load(::cuda::std::memory_order_acquire) != 0) &&
         now_ns() - start < timeout_ns)
    backoff.pause();
  bool purpose = published && on_purpose(error->outcome, error->wait);
  leave_group_for(g, headers, world, rank, timeout_ns, purpose ? error->detail : nullptr);
}

// The barrier `what` of `call`, as the host's workers enter it (formation on the first, then the
// epoch), but a rank whose record holds a failure does not arrive: it leaves the group. True when
// every rank arrived; else the failure is in `error` and the peers are told.
MOK_HD inline bool stream_barrier(GroupState& g, ErrorRecord* error, PeerHeader* const* headers, int world, int rank,
                                  uint64_t timeout_ns, WaitId what, CallKind call) {
  if (record_claimed(error)) return leave_failed(g, error, headers, world, rank, timeout_ns), false;
  Failure f = group_barrier(g, headers, world, rank, timeout_ns, what, call);
  if (f.ok()) return true;
  settle_group_failure(g, error, headers, world, rank, timeout_ns, f, nullptr);
  return false;
}

// mokLayerAbort.
MOK_HD inline void abort_group(GroupState& g, PeerHeader* const* headers, int world, int rank) {
  record_failure(&g.error, Failure{Outcome::peer_abort, WaitId::none}, rank, -1, -1);
  raise_abort(headers, world, rank);
}

}  // namespace mok::core
