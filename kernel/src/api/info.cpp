// C ABI: version, executors, devices.
#include "api/build_config.hpp"
#include "api/c_enum.hpp"
#include "api/error.hpp"
#include "api/executor.hpp"
#include "api/stamp.hpp"

#if MOK_WITH_CUDA
#include "cuda/runtime.hpp"
#endif

using mok::api::fail;

namespace {

// The caller's `executor` (by reference: read as an int before any enum-typed load), checked.
mokStatus_t check_executor(const mokExecutor_t& executor, const char* func) {
  int32_t bits = mok::api::enum_bits(executor);
  if (!mok::api::enum_in_range(bits, mokNumExecutors))
    return fail(mokInvalidArgument, "%s: argument 'executor' (%d) %s", func, bits, mok::api::kExecutorRule);
  return mokSuccess;
}

#if MOK_WITH_CUDA
// A device query's failure (cuda/runtime.hpp) as a status and this thread's detail; `func` is the C call.
mokStatus_t worded(const mok::cuda::QueryFailure& f, int device, const mokDeviceInfo_t& info, const char* func) {
  if (f.call)
    return fail(f.no_device ? mokNoDevice : mokCudaError, "%s: %s: %s (%s)", func, f.call, f.error_text, f.error_name);
  if (f.bad_device)
    return fail(mokInvalidArgument, "%s: argument 'device' (%d) must be in [0, %d)", func, device, f.device_count);
  if (f.no_image)
    return fail(mokUnsupported, "%s: device %d (%s, sm_%d%d) cannot load libmok's device code built for %s: %s", func,
                device, info.name, info.cc_major, info.cc_minor, mok::api::kCudaArchitectures, f.error_text);
  return mokSuccess;
}
#endif

}  // namespace

extern "C" {

MOK_API mokStatus_t mokGetVersion(int* version) {
  mok::api::clear_error();
  MOK_REQUIRE_OUT(version);
  *version = MOK_VERSION;
  return mokSuccess;
}

MOK_API const char* mokExecutorName(mokExecutor_t executor) {
  int32_t bits = mok::api::enum_bits(executor);
  if (!mok::api::enum_in_range(bits, mokNumExecutors)) return nullptr;
  switch (static_cast<mokExecutor_t>(bits)) {
    case mokExecutorHost: return "host";
    case mokExecutorSm100: return "sm100";
    case mokExecutorPortable: return "portable";
    case mokExecutorCuda: return "cuda";
    case mokNumExecutors: break;
  }
  return nullptr;
}

MOK_API mokStatus_t mokExecutorCompiled(mokExecutor_t executor, int* compiled) {
  mok::api::clear_error();
  MOK_REQUIRE_OUT(compiled);
  if (mokStatus_t s = check_executor(executor, __func__); s != mokSuccess) return s;
  *compiled = mok::api::layer_compiled(executor) ? 1 : 0;
  return mokSuccess;
}

MOK_API const char* mokCudaArchitectures(void) {
  return mok::api::kCudaArchitectures;
}

MOK_API mokStatus_t mokGetDeviceInfo(int device, mokDeviceInfo_t* info) {
  mok::api::clear_error();
  size_t layout = 0;
  if (mokStatus_t s = mok::api::check_stamp(info, mok::api::kDeviceInfo, "info", __func__, &layout); s != mokSuccess)
    return s;
  // One layout so far (api/stamp.cpp), so the executor fills the caller's struct itself.
#if MOK_WITH_CUDA
  return worded(mok::cuda::device_info(device, info), device, *info, __func__);
#else
  (void)device;
  info->device_count = 0;
  info->device = -1;
  return fail(mokNotCompiled, "mokGetDeviceInfo: libmok was built without CUDA (MOK_ENABLE_CUDA=OFF)");
#endif
}

MOK_API mokStatus_t mokExecutorSupportsDevice(mokExecutor_t executor, int device, int* supported) {
  mok::api::clear_error();
  MOK_REQUIRE_OUT(supported);
  *supported = 0;
  if (mokStatus_t s = check_executor(executor, __func__); s != mokSuccess) return s;
  if (executor == mokExecutorHost) {
    if (device != -1)
      return fail(mokUnsupported, "mokExecutorSupportsDevice: the host executor runs on device -1 (the CPU), not %d",
                  device);
    *supported = 1;
    return mokSuccess;
  }
  if (!mok::api::layer_compiled(executor)) return mok::api::not_compiled(executor, "executor", __func__);
#if MOK_WITH_CUDA
  // A GPU executor with a layer: its image must load on the device, whose architecture its kernels are for.
  mokDeviceInfo_t info = MOK_DEVICE_INFO_INIT;
  if (mokStatus_t s = worded(mok::cuda::sm100_supports(device, &info), device, info, __func__); s != mokSuccess)
    return s;
  if (!mok::api::gemms_serve(info.cc_major))
    return fail(mokUnsupported,
                "%s: device %d (%s, sm_%d%d): executor '%s' runs this libmok's grouped GEMMs, built for %s: compute "
                "capability 10.x (100a, 103a) and 9.0 (90a) as built",
                __func__, device, info.name, info.cc_major, info.cc_minor, mokExecutorName(executor),
                mok::api::kCudaArchitectures);
  if (executor == mokExecutorSm100 && !mok::api::fused_serves(info.cc_major))
    return fail(mokUnsupported,
                "%s: device %d (%s, sm_%d%d): executor 'sm100' runs its fused kernel, built for compute capability "
                "10.x (100a, 103a) only",
                __func__, device, info.name, info.cc_major, info.cc_minor);
  *supported = 1;
  return mokSuccess;
#else
  return mokInternalError;
#endif
}

}  // extern "C"
