// A kernel compiled with the same flags as the executors, to ask a device whether it loads them.
#pragma once

#include <cuda_runtime_api.h>

namespace mok::cuda {

// cudaFuncGetAttributes of the probe kernel on `device`: cudaSuccess when the device has an image.
cudaError_t probe_attributes(int device);

}  // namespace mok::cuda
