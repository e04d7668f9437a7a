// The executors as the C ABI sees them: one interface every executor's layer implements, and one table from
// mokExecutor_t to the executors this libmok carries. mokLayerCreate dispatches on config.executor through it, and
// mokExecutorCompiled, mokExecutorSupportsDevice and mokLayerGetSizes read the same table, so a query never
// claims what creation then refuses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/shape.hpp"
#include "mok/mok.h"

namespace mok::api {

// One rank's layer context on one executor. api/layer.cpp calls it only with validated arguments (it checks
// them first), and an executor's failure is returned as its status with this thread's detail set. Every pass
// call carries the caller's stream (NULL, or a cudaStream_t for a device executor, which enqueues the pass on it
// and returns); the executor's own rule on streams is check_stream, run with the other argument checks.
class LayerExecutor {
 public:
  virtual ~LayerExecutor() = default;
  virtual const core::LayerShape& shape() const = 0;
  // Whether the caller's tensors are host memory, whose values api/ may read (the ids' range), or device memory,
  // whose values the executor checks on the device.
  virtual bool host_tensors() const = 0;
  // The token count of the current schedule (0 without one).
  virtual int tokens() const = 0;
  // `stream` as this executor takes it: mokSuccess, or mokInvalidArgument with a detail naming `func`, the
  // argument 'stream' and the rule. Nothing is written either way.
  virtual mokStatus_t check_stream(void* stream, const char* func) const = 0;
  // Every collective call begins here, before its checks: `pass` numbers this context's collective calls from 1
  // (the error record's `pass`).
  virtual void begin_pass(uint64_t pass) = 0;
  // Forgets the schedule and the context (a mokLayerBuildSchedule that fails leaves neither).
  virtual void drop_schedule() = 0;
  virtual mokStatus_t build_schedule(const void* topk_ids, bool int64_ids, int tokens, void* stream) = 0;
  // with_output == false: a recompute (topk_weights and out unused).
  virtual mokStatus_t forward(const mokLayerWeights_t& weights, const uint16_t* x, const float* topk_weights,
                              uint16_t* out, bool with_output, void* stream) = 0;
  virtual mokStatus_t backward(const mokLayerWeights_t& weights, const float* topk_weights, const uint16_t* dout,
                               const mokLayerGrads_t& grads, void* stream) = 0;
  virtual mokStatus_t get_slots(uint16_t* y_slots, void* stream) = 0;
  virtual mokStatus_t restore_context(const uint16_t* x, const uint16_t* y_slots, void* stream) = 0;
  // A collective call this rank refuses: `detail` becomes the reason its peers read, and the group is aborted.
  virtual void reject(mokStatus_t status, const char* detail) = 0;
  // The first failure this rank recorded, in `error`'s fields after its stamp; status mokSuccess when none.
  // Readable from any thread at any time, without waiting for a stream.
  virtual void error(mokLayerError_t* error) = 0;
  // mokLayerAbort: `reason` is never NULL here.
  virtual void abort(const char* reason) = 0;
};

// The rule a mokExecutor_t argument breaks when out of range.
inline constexpr const char* kExecutorRule =
    "must be mokExecutorHost (0), mokExecutorSm100 (1), mokExecutorPortable (2) or mokExecutorCuda (3)";

// Creates one context of an executor over validated arguments (the workspace as large as its workspace_bytes).
using CreateLayer = mokStatus_t (*)(const core::LayerShape& shape, uint64_t timeout_ns, const mokLayerMemory_t& memory,
                                    std::unique_ptr<LayerExecutor>* out);
// The workspace a layer of `shape` needs on an executor, or the executor's refusal of the shape (mokUnsupported,
// with a detail naming `func`, the config field and the rule), so that mokLayerGetSizes refuses what creation would.
using WorkspaceBytes = mokStatus_t (*)(const core::LayerShape& shape, const char* func, size_t* bytes);

struct ExecutorEntry {
  CreateLayer create;
  WorkspaceBytes workspace_bytes;
};

// The executor's layer factory and sizes, nullptr when this libmok carries no layer for `executor` (an enumerator).
// Device code built in without a layer (cuda/: device queries) does not count.
const ExecutorEntry* executor_entry(mokExecutor_t executor);

// Whether this libmok runs a layer with `executor`: executor_entry(executor) != nullptr.
bool layer_compiled(mokExecutor_t executor);
// Whether this build's grouped GEMMs run on a device of compute capability `cc_major` (cuda::gemm_architecture).
bool gemms_serve(int cc_major);
// Whether the fused executor's kernels (built for the Blackwell targets only) run on a device of compute capability
// cc_major.x.
bool fused_serves(int cc_major);

// mokNotCompiled with a detail naming `func` and the `argument` that holds `executor`, and saying that it runs no
// layer in this libmok.
mokStatus_t not_compiled(mokExecutor_t executor, const char* argument, const char* func);

// The host executor's factory (api/host_executor.cpp).
mokStatus_t create_host_layer(const core::LayerShape& shape, uint64_t timeout_ns, const mokLayerMemory_t& memory,
                              std::unique_ptr<LayerExecutor>* out);

// The device executors' (cuda/cuda_layer.cpp), in a CUDA build with the grouped GEMMs: mokExecutorCuda, and
// mokExecutorSm100 (the same layer and workspace with the fused pass, cuda/fused_pass.hpp) where the build also has a
// Blackwell target.
template <mokExecutor_t executor>
mokStatus_t create_device_layer(const core::LayerShape& shape, uint64_t timeout_ns, const mokLayerMemory_t& memory,
                                std::unique_ptr<LayerExecutor>* out);
template <mokExecutor_t executor>
mokStatus_t device_workspace_bytes(const core::LayerShape& shape, const char* func, size_t* bytes);

}  // namespace mok::api
