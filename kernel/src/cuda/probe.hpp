// Kernels compiled with the same flags as the executors: to ask a device whether it loads them, and the self-test's
// probe kernels (api/selftest.cpp, stage "probe").
#pragma once

#include <cuda_runtime_api.h>

#include "core/protocol.hpp"

namespace mok::cuda {

// cudaFuncGetAttributes of the probe kernel on `device`: cudaSuccess when the device has an image.
cudaError_t probe_attributes(int device);

// Writes the __CUDA_ARCH__ the device ran (e.g. 1000 for sm_100a) to `*arch` (device-visible memory).
cudaError_t launch_arch_probe(int* arch, cudaStream_t stream);

// The failure the record probe writes, through core::record_failure, as a pass would.
constexpr int kProbeRecordTask = 42;
MOK_HD inline core::Failure probe_record_failure(int rank) {
  return core::Failure{core::Outcome::timeout, core::WaitId::entry_barrier, rank + 1};
}
// Records probe_record_failure(rank) in `record` (device-visible: the host-mapped record).
cudaError_t launch_record_probe(core::ErrorRecord* record, int rank, cudaStream_t stream);

}  // namespace mok::cuda
