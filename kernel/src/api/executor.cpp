// The executors as the C ABI sees them (api/executor.hpp).
#include "api/executor.hpp"

#include "api/build_config.hpp"
#include "api/error.hpp"

#if MOK_WITH_CUDA && MOK_WITH_GROUPED_GEMM
#include "cuda/grouped_gemm.hpp"
#endif

namespace mok::api {
namespace {

mokStatus_t host_workspace_bytes(const core::LayerShape& shape, const char*, size_t* bytes) {
  *bytes = core::local_layout(shape).bytes;
  return mokSuccess;
}

constexpr ExecutorEntry kHost{create_host_layer, host_workspace_bytes};
#if MOK_WITH_CUDA && MOK_WITH_GROUPED_GEMM
constexpr ExecutorEntry kCuda{create_device_layer<mokExecutorCuda>, device_workspace_bytes<mokExecutorCuda>};
constexpr bool kCudaCompiled = true;
#else
constexpr bool kCudaCompiled = false;
#endif
#if MOK_WITH_CUDA && MOK_WITH_GROUPED_GEMM && MOK_WITH_FUSED
constexpr ExecutorEntry kSm100{create_device_layer<mokExecutorSm100>, device_workspace_bytes<mokExecutorSm100>};
constexpr bool kSm100Compiled = true;
#else
constexpr bool kSm100Compiled = false;
#endif

}  // namespace

const ExecutorEntry* executor_entry(mokExecutor_t executor) {
  switch (executor) {
    case mokExecutorHost: return &kHost;
#if MOK_WITH_CUDA && MOK_WITH_GROUPED_GEMM
    case mokExecutorCuda: return &kCuda;
#else
    case mokExecutorCuda:  // its pass needs the grouped GEMMs (a CUDA build with CUTLASS's headers)
#endif
#if MOK_WITH_CUDA && MOK_WITH_GROUPED_GEMM && MOK_WITH_FUSED
    case mokExecutorSm100: return &kSm100;
#else
    case mokExecutorSm100:  // the fused kernel: a CUDA build with the grouped GEMMs and a Blackwell target
#endif
    case mokExecutorPortable:
    case mokNumExecutors: break;
  }
  return nullptr;
}

bool fused_serves(int cc_major) {
  return kSm100Compiled && cc_major == 10;
}

bool gemms_serve(int cc_major) {
#if MOK_WITH_CUDA && MOK_WITH_GROUPED_GEMM
  return cuda::gemm_architecture(cc_major) != cuda::GemmArchitecture::none;
#else
  (void)cc_major;
  return false;
#endif
}

bool layer_compiled(mokExecutor_t executor) {
  return executor_entry(executor) != nullptr;
}

mokStatus_t not_compiled(mokExecutor_t executor, const char* argument, const char* func) {
  const char* why = "";
  if (executor == mokExecutorCuda)
    why = kCudaArchitectures[0] ? "; it needs the grouped GEMMs, which a CUDA build without CUTLASS's headers lacks"
                                : "; it needs a CUDA build (MOK_ENABLE_CUDA=ON) with CUTLASS's headers";
  if (executor == mokExecutorSm100)
    why =
        "; it needs a CUDA build with CUTLASS's headers and a Blackwell target (100a or 103a in "
        "MOK_CUDA_ARCHITECTURES)";
  const char* runs = kSm100Compiled ? "host, cuda and sm100" : kCudaCompiled ? "host and cuda" : "host";
  return fail(mokNotCompiled,
              "%s: argument '%s' (%s): executor '%s' runs no layer in this libmok%s; the executors here: %s", func,
              argument, mokExecutorName(executor), mokExecutorName(executor), why, runs);
}

}  // namespace mok::api
