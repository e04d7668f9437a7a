// What the grouped-GEMM launch tests (test_grouped_gemm_launch, test_grouped_gemm_mxfp8_launch) share: random
// draws, fake device addresses, a random shape, and whether a GPU is usable (then the launches that pass every
// check are skipped: their pointers are not device memory).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>

#include "core/shape.hpp"

namespace mok_test {

inline int pick(std::mt19937_64& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

// 256-byte aligned and never dereferenced: every case is refused, or fails at the first CUDA call, before
// anything reads them.
template <class T>
T* address(std::mt19937_64& rng) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(pick(rng, 1, 1 << 20)) * 256);
}

// One rank, up to 300 local experts, H and I whole multiples of `block` elements, up to `blocks` of them.
inline mok::core::LayerShape random_shape(std::mt19937_64& rng, int block, int blocks) {
  mok::core::LayerShape s{};
  s.world = 1;
  s.experts_per_rank = pick(rng, 1, 300);
  s.hidden = block * pick(rng, 1, blocks);
  s.intermediate = block * pick(rng, 1, blocks);
  return s;
}

inline bool gpu_usable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace mok_test
