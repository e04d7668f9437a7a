// Device queries through the statically linked CUDA runtime.
#include "cuda/runtime.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

#include "api/error.hpp"
#include "cuda/probe.hpp"

namespace mok::cuda {
namespace {

// No driver, no device, or a driver too old for this runtime: all mean "no usable GPU here".
bool means_no_device(cudaError_t err) {
  return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || err == cudaErrorInitializationError ||
         err == cudaErrorCompatNotSupportedOnDevice;
}

mokStatus_t from_cuda(cudaError_t err, const char* call) {
  if (means_no_device(err))
    return api::fail(mokNoDevice, "%s: %s (%s)", call, cudaGetErrorString(err), cudaGetErrorName(err));
  return api::fail(mokCudaError, "%s: %s (%s)", call, cudaGetErrorString(err), cudaGetErrorName(err));
}

}  // namespace

mokStatus_t device_info(int device, mokDeviceInfo_t* info) {
  cudaDriverGetVersion(&info->driver_version);
  cudaRuntimeGetVersion(&info->runtime_version);
  info->device_count = 0;
  info->device = -1;
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    cudaGetLastError();  // the runtime keeps sticky-free errors here; leave nothing behind
    return from_cuda(err, "cudaGetDeviceCount");
  }
  info->device_count = count;
  if (device < 0 || device >= count)
    return api::fail(mokInvalidArgument, "mokGetDeviceInfo: argument 'device' (%d) must be in [0, %d)", device, count);
  cudaDeviceProp prop;
  if (cudaError_t err = cudaGetDeviceProperties(&prop, device); err != cudaSuccess)
    return from_cuda(err, "cudaGetDeviceProperties");
  info->device = device;
  info->cc_major = prop.major;
  info->cc_minor = prop.minor;
  info->multiprocessors = prop.multiProcessorCount;
  info->total_memory = prop.totalGlobalMem;
  std::strncpy(info->name, prop.name, sizeof(info->name) - 1);
  info->name[sizeof(info->name) - 1] = '\0';
  return mokSuccess;
}

mokStatus_t sm100_supports(int device, int* supported) {
  *supported = 0;
  mokDeviceInfo_t info = MOK_DEVICE_INFO_INIT;
  if (mokStatus_t s = device_info(device, &info); s != mokSuccess) return s;
  // The probe kernel is compiled exactly like the executor: if the device can load it, it can load
  // the executor. cudaFuncGetAttributes fails with cudaErrorNoKernelImageForDevice otherwise.
  if (cudaError_t err = probe_attributes(device); err != cudaSuccess) {
    cudaGetLastError();
    return api::fail(mokUnsupported, "device %d (%s, sm_%d%d) cannot load libmok's device code built for %s: %s",
                     device, info.name, info.cc_major, info.cc_minor, mokCudaArchitectures(), cudaGetErrorString(err));
  }
  *supported = 1;
  return mokSuccess;
}

}  // namespace mok::cuda
