// The wording of the host executor's failures: what a recorded failure, a failed barrier or a refused
// call says to the caller and to its peers. The protocol itself (what is recorded, who is told) is
// core's (core/group_state.hpp).
#include <cstdio>
#include <cstring>
#include <mutex>

#include "host/layer.hpp"

namespace mok::host {
namespace {

using core::Failure;
using core::WaitId;

// A group shape field as its config value: swiglu_limit and swiglu_alpha are compared as float bits.
void field_value(int field, int32_t bits, char* out, size_t n) {
  if (field != core::kGroupShapeLimit && field != core::kGroupShapeAlpha) {
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

mokStatus_t aborted_earlier(Layer& l, const char* func, Detail& why) {
  core::note_earlier_abort(l.group, l.headers, l.shape.world, l.shape.rank, l.timeout_ns);
  if (const char* reason = peer_reason(l))
    return fail(why, mokPeerAbort, "%s: the group was aborted: %s; create new contexts", func, reason);
  return fail(why, mokPeerAbort, "%s: the group was aborted (this or an earlier call); create new contexts", func);
}

}  // namespace

mokStatus_t status_of(Layer& l, const char* func, Detail& why) {
  core::ErrorRecord e{};
  core::read_record(&l.group.error, &e);
  char detail[512];
  error_detail(l, e, detail, sizeof(detail));
  mokStatus_t s = status_for(e);
  if (detail[0] != '\0') return fail(why, s, "%s: %s", func, detail);
  return fail(why, s, "%s: rank %d: %s (task %s %d, wait '%s')", func, e.rank,
              s == mokTimeout ? "a wait ran out" : "the pass was aborted", core::task_name(e.task_kind), e.task_index,
              core::wait_name(static_cast<WaitId>(e.wait)));
}

mokStatus_t fail_group(Layer& l, Failure f, core::CallKind call, const char* func, Detail& why) {
  char detail[256];
  describe(l, f, call, detail, sizeof(detail));
  core::settle_group_failure(l.group, &l.group.error, l.headers, l.shape.world, l.shape.rank, l.timeout_ns, f, detail);
  return status_of(l, func, why);
}

mokStatus_t refuse(Layer& l, core::Refusal refusal, const char* func, Detail& why) {
  mokStatus_t s = mokInvalidUsage;
  switch (refusal) {
    case core::Refusal::none: return mokSuccess;
    case core::Refusal::aborted_earlier: return aborted_earlier(l, func, why);
    case core::Refusal::needs_schedule:
    case core::Refusal::needs_context: s = fail(why, s, "%s: %s", func, core::order_rule(refusal)); break;
  }
  reject(l, s, why.text);  // a call refused for its order: the peers are told
  return s;
}

void write_reason(Layer& l, bool order, const char* detail) {
  char text[core::kReasonBytes];
  int n = std::snprintf(text, sizeof(text), "rank %d rejected its %s: ", l.shape.rank, order ? "call" : "arguments");
  copy_text(text + n, sizeof(text) - n, detail);
  stamp_reason(l, text);
}

void stamp_reason(Layer& l, const char* text) {
  std::lock_guard<std::mutex> hold(l.reason_lock);
  core::PeerHeader* own = l.headers[l.shape.rank];
  uint64_t incarnation = core::load_word(own->incarnation);
  if (core::load_word(own->reason_stamp) == incarnation) return;  // peers may be reading the first one
  copy_text(own->reason, sizeof(own->reason), text);
  core::store_word(own->reason_stamp, incarnation);
}

void copy_text(char* out, size_t n, const char* text) {
  size_t len = std::strlen(text);
  if (len >= n) {
    len = n - 1;
    while (len > 0 && (static_cast<unsigned char>(text[len]) & 0xC0) == 0x80) --len;  // not inside a character
  }
  std::memcpy(out, text, len);
  out[len] = '\0';
}

namespace {

// The peer (of this group) whose header holds a stamped reason, -1 if none.
int peer_with_reason(Layer& l) {
  for (int q = 0; q < l.shape.world; ++q) {
    core::PeerHeader* h = l.headers[q];
    if (q != l.shape.rank && core::joined(l.headers, l.shape.rank, q) &&
        core::load_word(h->reason_stamp) == core::load_word(h->incarnation))
      return q;
  }
  return -1;
}

}  // namespace

const char* peer_reason(Layer& l) {
  int q = peer_with_reason(l);
  return q < 0 ? nullptr : l.headers[q]->reason;
}

int abort_rank(Layer& l, const core::ErrorRecord& e) {
  switch (static_cast<core::Outcome>(e.outcome)) {
    case core::Outcome::rejected_arguments:
    case core::Outcome::rejected_order: return l.shape.rank;
    case core::Outcome::peer_abort: break;
    default: return -1;
  }
  core::PeerHeader* own = l.headers[l.shape.rank];
  bool own_reason = core::load_word(own->reason_stamp) == core::load_word(own->incarnation);
  if (e.wait == static_cast<int32_t>(WaitId::none) && own_reason) return l.shape.rank;  // its own mokLayerAbort
  return peer_with_reason(l);
}

mokStatus_t status_for(const core::ErrorRecord& e) {
  switch (static_cast<core::Outcome>(e.outcome)) {
    case core::Outcome::ok: return mokSuccess;
    case core::Outcome::timeout: return mokTimeout;
    case core::Outcome::shape_mismatch: return mokInvalidArgument;
    case core::Outcome::call_mismatch: return mokInvalidUsage;
    case core::Outcome::rejected_arguments: return mokInvalidArgument;
    case core::Outcome::rejected_order: return mokInvalidUsage;
    case core::Outcome::launch_failed: return mokCudaError;
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
