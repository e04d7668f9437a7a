// The only place where host and device differ for core/: qualifiers, the clock, the backoff sleep.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MOK_HD __host__ __device__
#else
#define MOK_HD
#endif

// A function kept out of line on the device: a large body inlined into the worker's loop can push the
// loop itself out of line, and a call then stacks the loop's frame on its caller's. Still `inline`: every
// unit that includes core/ holds the same definition (the device units link into one libmok).
#if defined(__CUDACC__)
#define MOK_HD_NOINLINE inline __host__ __device__ __noinline__
#else
#define MOK_HD_NOINLINE inline
#endif

#if !defined(__CUDA_ARCH__)
#include <sched.h>
#include <time.h>
#endif

namespace mok::core {

// Monotonic nanoseconds (the global timer on the device).
MOK_HD inline uint64_t now_ns() {
#if defined(__CUDA_ARCH__)
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
#endif
}

// Waiting politely: ranks (threads) may far outnumber cores on the host, so a waiter spins only
// briefly, then yields, then sleeps with growing intervals.
struct Backoff {
  uint32_t round = 0;

  MOK_HD void pause() {
    ++round;
#if defined(__CUDA_ARCH__)
    unsigned ns = round < 8 ? 32u : (round < 20 ? (32u << (round - 8)) : (1u << 17));
    __nanosleep(ns);
#else
    if (round <= 8) return;
    if (round <= 24) {
      sched_yield();
      return;
    }
    uint32_t shift = round - 24 < 8 ? round - 24 : 8;  // 2 us .. 512 us
    timespec ts{0, static_cast<long>(2000u << shift)};
    nanosleep(&ts, nullptr);
#endif
  }
};

}  // namespace mok::core
