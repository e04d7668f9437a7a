// Device queries through the statically linked CUDA runtime.
#include "cuda/runtime.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

#include "cuda/probe.hpp"

namespace mok::cuda {
namespace {

// No driver, no device, or a driver too old for this runtime: all mean "no usable GPU here".
bool means_no_device(cudaError_t err) {
  return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || err == cudaErrorInitializationError ||
         err == cudaErrorCompatNotSupportedOnDevice;
}

QueryFailure from_cuda(cudaError_t err, const char* call, int device_count) {
  QueryFailure f;
  f.call = call;
  f.error_name = cudaGetErrorName(err);
  f.error_text = cudaGetErrorString(err);
  f.no_device = means_no_device(err);
  f.device_count = device_count;
  return f;
}

}  // namespace

QueryFailure current_device(int* device) {
  if (cudaError_t err = cudaGetDevice(device); err != cudaSuccess) {
    cudaGetLastError();
    return from_cuda(err, "cudaGetDevice", 0);
  }
  return {};
}

QueryFailure device_info(int device, mokDeviceInfo_t* info) {
  cudaDriverGetVersion(&info->driver_version);
  cudaRuntimeGetVersion(&info->runtime_version);
  info->device_count = 0;
  info->device = -1;
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    cudaGetLastError();  // the runtime keeps sticky-free errors here; leave nothing behind
    return from_cuda(err, "cudaGetDeviceCount", 0);
  }
  info->device_count = count;
  if (device < 0 || device >= count) {
    QueryFailure f;
    f.bad_device = true;
    f.device_count = count;
    return f;
  }
  cudaDeviceProp prop;
  if (cudaError_t err = cudaGetDeviceProperties(&prop, device); err != cudaSuccess)
    return from_cuda(err, "cudaGetDeviceProperties", count);
  info->device = device;
  info->cc_major = prop.major;
  info->cc_minor = prop.minor;
  info->multiprocessors = prop.multiProcessorCount;
  info->total_memory = prop.totalGlobalMem;
  std::strncpy(info->name, prop.name, sizeof(info->name) - 1);
  info->name[sizeof(info->name) - 1] = '\0';
  return QueryFailure{};
}

QueryFailure sm100_supports(int device, mokDeviceInfo_t* info) {
  QueryFailure f = device_info(device, info);
  if (f.call || f.bad_device) return f;
  // The probe kernel is compiled exactly like the executor: if the device can load it, it can load
  // the executor. cudaFuncGetAttributes fails with cudaErrorNoKernelImageForDevice otherwise.
  if (cudaError_t err = probe_attributes(device); err != cudaSuccess) {
    cudaGetLastError();
    f.no_image = true;
    f.error_name = cudaGetErrorName(err);
    f.error_text = cudaGetErrorString(err);
  }
  return f;
}

}  // namespace mok::cuda
