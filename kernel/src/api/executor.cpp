// The executors as the C ABI sees them (api/executor.hpp).
#include "api/executor.hpp"

#include "api/build_config.hpp"
#include "api/error.hpp"

namespace mok::api {

CreateLayer layer_factory(mokExecutor_t executor) {
  switch (executor) {
    case mokExecutorHost: return create_host_layer;
    case mokExecutorSm100:  // no GPU executor runs a layer yet
    case mokExecutorPortable:
    case mokNumExecutors: break;
  }
  return nullptr;
}

bool layer_compiled(mokExecutor_t executor) {
  return layer_factory(executor) != nullptr;
}

mokStatus_t not_compiled(mokExecutor_t executor, const char* argument, const char* func) {
  const char* cuda = kCudaArchitectures[0] ? "; its CUDA code has device queries only" : "";
  return fail(mokNotCompiled,
              "%s: argument '%s' (%s): executor '%s' runs no layer in this libmok%s; only the host executor does so "
              "far",
              func, argument, mokExecutorName(executor), mokExecutorName(executor), cuda);
}

}  // namespace mok::api
