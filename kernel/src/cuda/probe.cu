// The probe kernel: compiled for MOK_CUDA_ARCHITECTURES like every executor kernel.
#include "cuda/probe.hpp"

namespace mok::cuda {
// A named namespace: nvcc names an anonymous one after the source's absolute path, which would make
// builds from two directories differ (tests/packaging/test_repro.py).
namespace probe_detail {

__global__ void probe_kernel(int* arch) {
#ifdef __CUDA_ARCH__
  if (threadIdx.x == 0 && blockIdx.x == 0) *arch = __CUDA_ARCH__;
#endif
}

}  // namespace probe_detail

cudaError_t probe_attributes(int device) {
  int previous = 0;
  if (cudaError_t err = cudaGetDevice(&previous); err != cudaSuccess) return err;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) return err;
  cudaFuncAttributes attr;
  cudaError_t err = cudaFuncGetAttributes(&attr, probe_detail::probe_kernel);
  cudaSetDevice(previous);
  return err;
}

}  // namespace mok::cuda
