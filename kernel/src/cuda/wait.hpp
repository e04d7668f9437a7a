// Bounded waits of the host for the GPU: a kernel that never ends must not hang its caller.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mok::cuda {

// Polls `event` until it completes or `deadline_ns` (core::now_ns's clock) passes: cudaSuccess once it completed,
// cudaErrorNotReady when the deadline passed first (the GPU may still be running what precedes the event), or the
// error the event's work failed with.
cudaError_t wait_event(cudaEvent_t event, uint64_t deadline_ns);

}  // namespace mok::cuda
