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

MOK_HD inline Refusal check_call(GroupState& g, PeerHeader* own, CallKind call) {
  if (group_aborted(g, own)) return Refusal::aborted_earlier;
  if ((call == CallKind::forward || call == CallKind::recompute) && !g.has_schedule) return Refusal::needs_schedule;
  if (call == CallKind::backward && !g.has_context) return Refusal::needs_context;
  return Refusal::none;
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

// A failure of the group outside the workers (formation, barriers), recorded with the executor's
// wording of it. A timeout or an abort is passed on to every rank; a mismatch is not: every rank finds
// it itself, and an abort could reach a peer before it sees the mismatch and hide the message.
MOK_HD inline void settle_group_failure(GroupState& g, PeerHeader* const* headers, int world, int rank,
                                        uint64_t timeout_ns, Failure f, const char* detail) {
  record_failure(&g.error, f, rank, -1, -1, detail);
  // Before the group has formed, the peer that aborted it may not trust this rank's header yet, so
  // its reason is not readable: wait (bounded) until every peer has joined.
  if (f.outcome == Outcome::peer_abort) tell_unformed_peers(g, headers, world, rank, timeout_ns);
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

// mokLayerAbort.
MOK_HD inline void abort_group(GroupState& g, PeerHeader* const* headers, int world, int rank) {
  record_failure(&g.error, Failure{Outcome::peer_abort, WaitId::none}, rank, -1, -1);
  raise_abort(headers, world, rank);
}

}  // namespace mok::core
