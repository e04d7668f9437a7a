// What every executor's mokLayerGetError shares: the numbering of the call a failure belongs to, and the record's
// fields that read the same on every executor (status, rank, task).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>

#include "core/protocol.hpp"
#include "core/tasks.hpp"
#include "host/layer.hpp"
#include "mok/mok.h"

namespace mok::api {

// Once a failure is recorded, the record is about the call that was running, or last begun, then: the first look
// at the record after it (a call's start, mokLayerGetError, mokLayerAbort) fixes that call's number.
class CallNumbers {
 public:
  // A collective call begins: `failed` says whether a failure is recorded (it belongs to the calls before).
  void begin(uint64_t call, bool failed) {
    settle(failed);
    current_.store(call);
  }
  void settle(bool failed) {
    if (!failed) return;
    uint64_t unsettled = kUnsettled;
    failed_.compare_exchange_strong(unsettled, current_.load());
  }
  uint64_t current() const { return current_.load(); }
  uint64_t failed() const { return failed_.load(); }

 private:
  static constexpr uint64_t kUnsettled = UINT64_MAX;
  std::atomic<uint64_t> current_{0};  // the collective call running, or last begun (0: none yet)
  std::atomic<uint64_t> failed_{kUnsettled};
};

// The status, rank and task of a recorded failure.
inline void record_fields(const core::ErrorRecord& rec, mokLayerError_t* out) {
  out->status = host::status_for(rec);
  out->rank = rec.rank;
  std::snprintf(out->task, sizeof(out->task), "%s", rec.task_kind < 0 ? "" : core::task_name(rec.task_kind));
  out->task_index = rec.task_index;
}

}  // namespace mok::api
