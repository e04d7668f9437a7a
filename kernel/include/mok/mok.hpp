// Header-only C++ wrapper over mok.h: exceptions (mok::Error) instead of status codes, RAII for the layer context
// (mok::Layer) and for the peer memory from an NCCL communicator (mok::NcclPeers).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mok/mok.h"

namespace mok {

// A failed libmok call: the status, and libmok's detail (mokGetLastError() of the failed call: which argument
// and rule, or which wait ran out). what() is "<status string>: <detail>".
class Error : public std::runtime_error {
 public:
  Error(mokStatus_t status, const std::string& detail)
      : std::runtime_error(std::string(mokGetStatusString(status)) + (detail.empty() ? "" : ": " + detail)),
        status_(status),
        detail_(detail) {}
  mokStatus_t status() const noexcept { return status_; }
  const std::string& detail() const noexcept { return detail_; }

 private:
  mokStatus_t status_;
  std::string detail_;
};

// Throw mok::Error unless `status` is mokSuccess.
inline void check(mokStatus_t status) {
  if (status != mokSuccess) throw Error(status, mokGetLastError());
}

struct Version {
  int major, minor, patch;
};

// The loaded library's version (may differ from the header's MOK_VERSION_* if the .so was swapped).
inline Version version() {
  int v = 0;
  check(mokGetVersion(&v));
  return {v / 10000, v / 100 % 100, v % 100};
}

struct ExecutorStatus {
  mokExecutor_t executor;
  std::string name;
  bool compiled;
  bool supported;      // can run here: on the CPU for the host executor, on CUDA device 0 for GPU ones
  std::string reason;  // why not, when !supported
};

// Every executor with whether it is compiled in and whether it can run on this machine. Never throws for a
// missing GPU: that is a reason.
inline std::vector<ExecutorStatus> executors() {
  std::vector<ExecutorStatus> out;
  for (int e = 0; e < mokNumExecutors; ++e) {
    auto executor = static_cast<mokExecutor_t>(e);
    int compiled = 0, supported = 0;
    check(mokExecutorCompiled(executor, &compiled));
    mokStatus_t s = mokExecutorSupportsDevice(executor, executor == mokExecutorHost ? -1 : 0, &supported);
    std::string reason = s == mokSuccess ? "" : std::string(mokGetStatusString(s)) + ": " + mokGetLastError();
    out.push_back({executor, mokExecutorName(executor), compiled != 0, supported != 0, reason});
  }
  return out;
}

// CUDA device `device`; throws mok::Error(mokNoDevice) when there is none.
inline mokDeviceInfo_t device_info(int device = 0) {
  mokDeviceInfo_t info = MOK_DEVICE_INFO_INIT;
  check(mokGetDeviceInfo(device, &info));
  return info;
}

// The peer-buffer and workspace bytes a layer with `config` needs (mokLayerGetSizes).
inline mokLayerSizes_t layer_sizes(const mokLayerConfig_t& config) {
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  check(mokLayerGetSizes(&config, &sizes));
  return sizes;
}

// One rank's layer context: mokLayerCreate in the constructor, mokLayerDestroy in the destructor. Move-only; a
// moved-from Layer holds no context, and a call on it throws mok::Error (mokInvalidArgument). Every call throws
// mok::Error with the failed call's status and detail. The collective calls (build_schedule, forward, recompute,
// backward, and the constructor with memory.shm_name) follow docs/c-api.md: every rank of the group makes them in
// the same order. bf16 tensors are raw 16-bit words.
class Layer {
 public:
  Layer() noexcept = default;
  Layer(const mokLayerConfig_t& config, const mokLayerMemory_t& memory) {
    check(mokLayerCreate(&config, &memory, &layer_));
  }
  ~Layer() { reset(); }
  Layer(Layer&& other) noexcept : layer_(std::exchange(other.layer_, nullptr)) {}
  Layer& operator=(Layer&& other) noexcept {
    if (this != &other) {
      reset();
      layer_ = std::exchange(other.layer_, nullptr);
    }
    return *this;
  }
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // Destroys the context now (the Layer is then empty).
  void reset() noexcept {
    if (layer_) mokLayerDestroy(layer_);
    layer_ = nullptr;
  }
  mokLayer_t get() const noexcept { return layer_; }
  explicit operator bool() const noexcept { return layer_ != nullptr; }

  // Every pass call takes the stream it runs on last: NULL (the default) on the host executor, which requires it;
  // a cudaStream_t for a device executor (docs/c-api.md, "Streams, completion and errors").

  // Collective. topk_ids [num_tokens, top_k].
  void build_schedule(const int32_t* topk_ids, int num_tokens, void* stream = nullptr) {
    check(mokLayerBuildSchedule(layer_, topk_ids, mokIndexInt32, num_tokens, stream));
  }
  void build_schedule(const int64_t* topk_ids, int num_tokens, void* stream = nullptr) {
    check(mokLayerBuildSchedule(layer_, topk_ids, mokIndexInt64, num_tokens, stream));
  }
  // Collective. x [T, H] bf16, topk_weights [T, K] -> out [T, H] bf16; keeps the context for backward.
  void forward(const mokLayerWeights_t& weights, const void* x, const float* topk_weights, void* out,
               void* stream = nullptr) {
    check(mokLayerForward(layer_, &weights, x, topk_weights, out, stream));
  }
  // Collective. Rebuilds the forward's context from x (activation checkpointing).
  void recompute(const mokLayerWeights_t& weights, const void* x, void* stream = nullptr) {
    check(mokLayerRecompute(layer_, &weights, x, stream));
  }
  // Collective. The same with the forward's topk_weights [T, K], which a mokRoutingScaleInput layer needs.
  void recompute(const mokLayerWeights_t& weights, const void* x, const float* topk_weights, void* stream = nullptr) {
    check(mokLayerRecomputeWeighted(layer_, &weights, x, topk_weights, stream));
  }
  // Collective. dout [T, H] bf16 -> grads (dx, dtopk_weights, the weight gradients).
  void backward(const mokLayerWeights_t& weights, const float* topk_weights, const void* dout, mokLayerGrads_t& grads,
                void* stream = nullptr) {
    check(mokLayerBackward(layer_, &weights, topk_weights, dout, &grads, stream));
  }
  // y_slots [T, K, H] bf16 of the current context.
  void slots(void* y_slots, void* stream = nullptr) { check(mokLayerGetSlots(layer_, y_slots, stream)); }
  // An earlier forward's context (its x and slots) made current again, after a schedule of its topk_ids.
  void restore_context(const void* x, const void* y_slots, void* stream = nullptr) {
    check(mokLayerRestoreContext(layer_, x, y_slots, stream));
  }
  // The first failure this rank recorded (status mokSuccess when none; pass and abort_rank as in mok.h).
  mokLayerError_t error() const {
    mokLayerError_t error = MOK_LAYER_ERROR_INIT;
    check(mokLayerGetError(layer_, &error));
    return error;
  }
  // Every rank's current and later passes wind down with mokPeerAbort (any thread); peers read "rank R aborted
  // the group: <reason>" (nullptr: "no reason given").
  void abort(const char* reason = nullptr) { check(mokLayerAbort(layer_, reason)); }

 private:
  mokLayer_t layer_ = nullptr;
};

// The peer memory of a group from its NCCL communicator (mokNcclPeersCreate, collective): every rank's buffer of
// `bytes` (layer_sizes(config).peer_bytes) and its address on this rank, for mokLayerMemory_t.peer_bases with
// config.world = world() and config.rank = rank(). Destroy every Layer over it first: the destructor is collective
// too (mokNcclPeersDestroy). Move-only; `nccl_comm` is an ncclComm_t.
class NcclPeers {
 public:
  NcclPeers() noexcept = default;
  NcclPeers(void* nccl_comm, size_t bytes) {
    check(mokNcclPeersCreate(nccl_comm, bytes, &peers_));
    mokStatus_t read = mokNcclPeersGetBases(peers_, &bases_, &world_, &rank_);
    if (read != mokSuccess) {
      std::string detail = mokGetLastError();
      reset();
      throw Error(read, detail);
    }
  }
  ~NcclPeers() { reset(); }
  NcclPeers(NcclPeers&& other) noexcept { *this = std::move(other); }
  NcclPeers& operator=(NcclPeers&& other) noexcept {
    if (this != &other) {
      reset();
      peers_ = std::exchange(other.peers_, nullptr);
      bases_ = std::exchange(other.bases_, nullptr);
      world_ = std::exchange(other.world_, 0);
      rank_ = std::exchange(other.rank_, -1);
    }
    return *this;
  }
  NcclPeers(const NcclPeers&) = delete;
  NcclPeers& operator=(const NcclPeers&) = delete;

  // Destroys the table now (collective: every rank resets, and no layer uses the buffers any more); a move onto a
  // live NcclPeers does it too. Its status is not reported: a caller who needs it destroys release()'s table itself.
  void reset() noexcept {
    if (peers_) mokNcclPeersDestroy(peers_);
    peers_ = nullptr;
    bases_ = nullptr;
    world_ = 0;
    rank_ = -1;
  }
  mokNcclPeers_t get() const noexcept { return peers_; }
  // Gives the table up without destroying it: the caller calls mokNcclPeersDestroy on it and reads its status.
  mokNcclPeers_t release() noexcept {
    bases_ = nullptr;
    world_ = 0;
    rank_ = -1;
    return std::exchange(peers_, nullptr);
  }
  void* const* peer_bases() const noexcept { return bases_; }
  int world() const noexcept { return world_; }
  int rank() const noexcept { return rank_; }

 private:
  mokNcclPeers_t peers_ = nullptr;
  void* const* bases_ = nullptr;
  int world_ = 0, rank_ = -1;
};

}  // namespace mok
