// The CUDA runtime as the API layer sees it: device queries that never crash without a GPU.
#pragma once

#include "mok/mok.h"

namespace mok::cuda {

// Fill `info` for `device`; mokNoDevice (with the detail set) when there is no GPU or driver.
mokStatus_t device_info(int device, mokDeviceInfo_t* info);

// Whether the sm100 executor's kernels carry an image that `device` can load.
mokStatus_t sm100_supports(int device, int* supported);

}  // namespace mok::cuda
