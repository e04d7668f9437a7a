// Bounded waits for the GPU (cuda/wait.hpp).
#include "cuda/wait.hpp"

#include <time.h>

#include "core/platform.hpp"

namespace mok::cuda {

cudaError_t wait_event(cudaEvent_t event, uint64_t deadline_ns) {
  uint64_t sleep_ns = 20000;  // 20 us, growing to 5 ms: quick for short kernels, idle for long ones
  for (;;) {
    cudaError_t e = cudaEventQuery(event);
    if (e != cudaErrorNotReady) return e;
    if (core::now_ns() >= deadline_ns) return cudaErrorNotReady;
    timespec ts{0, static_cast<long>(sleep_ns)};
    nanosleep(&ts, nullptr);
    sleep_ns = sleep_ns < 5000000 ? sleep_ns * 2 : sleep_ns;
  }
}

}  // namespace mok::cuda
