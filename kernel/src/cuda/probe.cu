// The probe kernels: compiled for MOK_CUDA_ARCHITECTURES like every executor kernel.
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

// One failure recorded as a pass records it: claimed at device scope, published at system scope.
__global__ void record_probe(core::ErrorRecord* record, int rank) {
  if (threadIdx.x == 0 && blockIdx.x == 0)
    core::record_failure(record, probe_record_failure(rank), rank, -1, kProbeRecordTask, "probe");
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

cudaError_t launch_arch_probe(int* arch, cudaStream_t stream) {
  probe_detail::probe_kernel<<<1, 32, 0, stream>>>(arch);
  return cudaGetLastError();
}

cudaError_t launch_record_probe(core::ErrorRecord* record, int rank, cudaStream_t stream) {
  probe_detail::record_probe<<<1, 32, 0, stream>>>(record, rank);
  return cudaGetLastError();
}

}  // namespace mok::cuda
