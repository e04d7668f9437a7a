// The host executor: one rank's layer context, running core/'s task graph with CPU threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/pass.hpp"
#include "host/peer_memory.hpp"
#include "mok/mok.h"

namespace mok::host {

constexpr int kMaxWorkers = 64 + 256;  // comm + compute workers a config may ask for

struct Layer {
  core::LayerShape shape;
  core::PeerLayout peer;
  core::LocalLayout local_layout;
  PeerMemory memory;
  core::PeerHeader* headers[core::kMaxWorld];
  char* local = nullptr;  // the caller's workspace
  uint64_t timeout_ns = 0;
  uint64_t epoch = 0;      // barriers this rank has entered; the same sequence on every rank
  int tokens = 0;          // this rank's tokens in the current schedule
  int64_t total_rows = 0;  // rows this rank receives in the current schedule, padding included
  bool has_schedule = false;
  bool has_context = false;  // a forward or recompute ran on the current schedule
  bool formed = false;       // every peer acknowledged this context (the first collective call's wait)
  core::ErrorRecord error{};
  int64_t stall_after_tasks = -1;  // fault injection (MOK_HOST_FAULT_STALL), -1 = off
};

// Map peer memory (caller bases or shared-memory rendezvous) and set up the context.
mokStatus_t create(const core::LayerShape& shape, uint64_t timeout_ns, const mokLayerMemory_t& memory, Layer** out);

// The calls below assume validated arguments (api/layer.cpp checks them first).
// A mokLayerBuildSchedule that fails, for any reason, leaves no schedule and no context: the buffers a caller
// sized for its token count are never used with an older one. mokLayerBuildSchedule calls it first, before its
// checks; build_schedule sets the schedule only once it succeeded.
void drop_schedule(Layer& layer);
mokStatus_t build_schedule(Layer& layer, const void* topk_ids, bool int64_ids, int tokens);
// with_output == false: a recompute (rebuilds the context only; topk_weights and out unused).
mokStatus_t forward(Layer& layer, const mokLayerWeights_t& weights, const uint16_t* x, const float* topk_weights,
                    uint16_t* out, bool with_output);
mokStatus_t backward(Layer& layer, const mokLayerWeights_t& weights, const float* topk_weights, const uint16_t* dout,
                     const mokLayerGrads_t& grads);
// This rank's y slots [tokens, K, H] of the current context (zeros for -1 routes).
mokStatus_t get_slots(Layer& layer, uint16_t* y_slots);
void abort(Layer& layer);

// A collective call this rank refuses (its arguments, or its order): `detail` becomes the reason
// every peer reads, and the group is aborted so that no peer waits for this rank. Nothing else is
// written; the caller returns `status` with its own message.
void reject(Layer& layer, mokStatus_t status, const char* detail);

// The status a recorded failure stands for, and its message: the record's own, and the reason a
// peer that aborted the group left in its header (nullptr from peer_reason when none did).
mokStatus_t status_for(const core::ErrorRecord& record);
void error_detail(Layer& layer, const core::ErrorRecord& record, char* out, size_t n);
const char* peer_reason(Layer& layer);

// The caller's weights (bf16, or MXFP8 rowwise and colwise), read in place by the pass.
core::LayerWeights weights_in_place(const mokLayerWeights_t& weights);

}  // namespace mok::host
