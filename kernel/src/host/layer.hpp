// The host executor: one rank's layer context, running core/'s pass with CPU threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/group_state.hpp"
#include "core/pass.hpp"
#include "host/detail.hpp"
#include "host/peer_memory.hpp"
#include "host/thread_pool.hpp"
#include "mok/mok.h"

namespace mok::host {

struct Layer {
  core::LayerShape shape;
  core::PeerLayout peer;
  PeerMemory memory;
  core::PeerHeader* headers[core::kMaxWorld];
  char* local = nullptr;  // the caller's workspace
  uint64_t timeout_ns = 0;
  core::GroupState group{};  // epochs, formation, schedule and context, the error record
  ThreadPool pool;           // comm_workers + compute_workers threads, for the life of the layer
  // Fault injection (tests of the timeout and abort paths) and the row-part split, from the environment at creation:
  int64_t stall_after_tasks = -1;  // MOK_HOST_FAULT_STALL: worker 0 stops after this many tasks; -1 = off
  int exit_worker = -1;            // MOK_HOST_FAULT_EXIT: this worker leaves every pass at once; -1 = off
  int64_t slow_task_us = -1;       // MOK_HOST_FAULT_SLOW: every worker starts each task this late; -1 = off
  int row_parts = 1;               // MOK_HOST_ROW_PARTS: each row job in this many parts, < 0 last part first
  int bulk_slots = 0;              // MOK_HOST_BULK_SLOTS: this many of a row job's parts make its bulk copies
  bool bulk_lost = false;          // MOK_HOST_FAULT_BULK_LOST: and lose them
  std::mutex reason_lock;          // the own header's reason has one writer at a time (stamp_reason)
};

// Every call that returns a status writes why it failed into its `why` (host/detail.hpp).

// Map peer memory (caller bases or shared-memory rendezvous), start the workers, set up the context.
mokStatus_t create(const core::LayerShape& shape, uint64_t timeout_ns, const mokLayerMemory_t& memory, Layer** out,
                   Detail& why);

// The calls below assume validated arguments (api/layer.cpp checks them first).
// A mokLayerBuildSchedule that fails, for any reason, leaves no schedule and no context: the buffers a caller
// sized for its token count are never used with an older one. mokLayerBuildSchedule calls it first, before its
// checks; build_schedule sets the schedule only once it succeeded.
void drop_schedule(Layer& layer);
mokStatus_t build_schedule(Layer& layer, const void* topk_ids, bool int64_ids, int tokens, Detail& why);
// with_output == false: a recompute (rebuilds the context only; topk_weights and out unused).
mokStatus_t forward(Layer& layer, const mokLayerWeights_t& weights, const uint16_t* x, const float* topk_weights,
                    uint16_t* out, bool with_output, Detail& why);
mokStatus_t backward(Layer& layer, const mokLayerWeights_t& weights, const float* topk_weights, const uint16_t* dout,
                     const mokLayerGrads_t& grads, Detail& why);
// This rank's y slots [tokens, K, H] of the current context (zeros for -1 routes).
mokStatus_t get_slots(Layer& layer, uint16_t* y_slots, Detail& why);
mokStatus_t restore_context(Layer& layer, const uint16_t* x, const uint16_t* y_slots, Detail& why);
// mokLayerAbort: "rank R aborted the group: <reason>" becomes the reason every peer reads, unless the group
// had one already, and this rank's record (if it had none).
void abort(Layer& layer, const char* reason);

// A collective call this rank refuses (its arguments, or its order): `detail` becomes the reason
// every peer reads, and the group is aborted so that no peer waits for this rank. Nothing else is
// written; the caller returns `status` with its own message.
void reject(Layer& layer, mokStatus_t status, const char* detail);

// ---- the wording of failures (host/pass_errors.cpp) ----

// The status a recorded failure stands for, and its message: the record's own, and the reason a
// peer that aborted the group left in its header (nullptr from peer_reason when none did).
mokStatus_t status_for(const core::ErrorRecord& record);
void error_detail(Layer& layer, const core::ErrorRecord& record, char* out, size_t n);
const char* peer_reason(Layer& layer);
// How a rank's call fails: its own record, and the reason a peer left in its header, if any.
mokStatus_t status_of(Layer& layer, const char* func, Detail& why);
// A failure of the group outside the workers (formation, barriers): worded, settled, and returned.
mokStatus_t fail_group(Layer& layer, core::Failure f, core::CallKind call, const char* func, Detail& why);
// A call refused before it starts (core::check_call), worded; a refused order is told to the peers.
mokStatus_t refuse(Layer& layer, core::Refusal refusal, const char* func, Detail& why);
// The reason a rejected call leaves in the own header for its peers.
void write_reason(Layer& layer, bool order, const char* detail);
// The own header's reason, stamped: the first one stands (a rejected call on the calling thread and mokLayerAbort
// on another may race); cut at a character boundary of UTF-8 text where it does not fit.
void stamp_reason(Layer& layer, const char* text);
// The rank that aborted the group on purpose (a rejected call, or mokLayerAbort) as `record` tells, -1 if none.
int abort_rank(Layer& layer, const core::ErrorRecord& record);
// `text` into out[n], cut at a character boundary of UTF-8 text where it does not fit.
void copy_text(char* out, size_t n, const char* text);

// The caller's weights (bf16, or MXFP8 rowwise and colwise), read in place by the pass.
core::LayerWeights weights_in_place(const mokLayerWeights_t& weights);

}  // namespace mok::host
