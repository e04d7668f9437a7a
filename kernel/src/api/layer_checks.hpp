// Argument rules of the layer's C ABI: every check names the argument and the rule it breaks, and
// runs before anything is written.
#pragma once

#include <cstdint>

#include "core/shape.hpp"
#include "mok/mok.h"

namespace mok::api {

// Each stamped struct is checked on a copy in this libmok's layout (api/stamp.hpp: an older caller's struct gets
// defaults for the fields it lacks); the copy is what the executor is given.

// The pass an executor runs, which decides what its workspace holds (core::PassForm).
inline core::PassForm pass_form(mokExecutor_t executor) {
  switch (executor) {
    case mokExecutorCuda: return core::PassForm::split;
    case mokExecutorSm100: return core::PassForm::fused;
    default: return core::PassForm::host;
  }
}
// The config as a core shape; fails on a broken rule.
mokStatus_t check_config(const mokLayerConfig_t* config, const char* func, mokLayerConfig_t* copy,
                         core::LayerShape* shape);
// workspace_need: what the config's executor asks for (executor.hpp, workspace_bytes).
mokStatus_t check_memory(const mokLayerMemory_t* memory, const core::LayerShape& shape, size_t workspace_need,
                         const char* func, mokLayerMemory_t* copy);
// `type` by reference: the caller's parameter is read as the int a C caller passed, without an
// enum-typed load, before its range is checked (see api/c_enum.hpp). The ids' values only with `read_ids` (host
// memory; a device executor checks them on the device).
mokStatus_t check_topk_ids(const void* ids, const mokIndexType_t& type, int tokens, const core::LayerShape& shape,
                           bool read_ids, const char* func);
mokStatus_t check_weights(const mokLayerWeights_t* weights, const core::LayerShape& shape, const char* func,
                          mokLayerWeights_t* copy);
mokStatus_t check_grads(const mokLayerGrads_t* grads, const mokLayerWeights_t& weights, const core::LayerShape& shape,
                        int tokens, const char* func, mokLayerGrads_t* copy);

// `ptr` may be NULL only when `count` is 0; otherwise it must be aligned to `align` bytes.
mokStatus_t check_array(const void* ptr, const char* name, int64_t count, size_t align, const char* func);

}  // namespace mok::api
