// The CUDA runtime as the API layer sees it: device queries that never crash without a GPU. They report what
// failed (the CUDA call and its error) and api/info.cpp turns that into a status and the caller's message.
#pragma once

#include "mok/mok.h"

namespace mok::cuda {

// What a device query found out. `call` is the CUDA runtime call that failed (nullptr when none did), with its
// error's name and text; `no_device` when that error means no usable GPU or driver here. `device_count` is the
// count of visible devices when it was known.
struct QueryFailure {
  const char* call = nullptr;
  const char* error_name = "";
  const char* error_text = "";
  bool no_device = false;
  int device_count = 0;
  bool bad_device = false;  // the device ordinal is not in [0, device_count)
  bool no_image = false;    // the device cannot load libmok's device code (sm100_supports)
};

// Fill `info` for `device` (driver and runtime versions always, the rest when the device exists).
QueryFailure device_info(int device, mokDeviceInfo_t* info);

// The calling thread's current CUDA device (cudaGetDevice).
QueryFailure current_device(int* device);

// Whether the sm100 executor's kernels carry an image that `device` can load; `info` describes the device.
QueryFailure sm100_supports(int device, mokDeviceInfo_t* info);

}  // namespace mok::cuda
