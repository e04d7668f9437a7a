// The self-test's GPU stages (mok.h: mokSelftestRun; api/selftest.cpp words the rest). Each returns the stage's
// verdict as a status and writes what it checked and found into its Text, passed or not.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/mxfp8_layout.hpp"
#include "core/numeric.hpp"
#include "mok/mok.h"

namespace mok::cuda {

struct SelftestSetup {
  int device;
  int timeout_ms;
  uint64_t seed;
};

// A stage's message, appended to piece by piece.
struct Text {
  char text[1024] = "";
  void add(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    size_t used = std::strlen(text);
    if (used + 1 >= sizeof(text)) return;
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(text + used, sizeof(text) - used, fmt, args);
    va_end(args);
  }
};

// Device memory a stage owns; freed unless a wait ran out (cudaFree would wait for the kernel that did not end).
struct DeviceBuffers {
  std::vector<void*> blocks;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  bool keep = false;
  cudaError_t alloc(size_t bytes, void** p) {
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e == cudaSuccess) blocks.push_back(*p);
    return e;
  }
  ~DeviceBuffers() {
    if (keep) return;
    if (done) cudaEventDestroy(done);
    if (stream) cudaStreamDestroy(stream);
    for (void* p : blocks) cudaFree(p);
  }
};

// n bf16 values drawn uniformly from [-scale, scale]: the stages' inputs and weights.
inline std::vector<core::bf16_t> random_bf16(size_t n, float scale, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<core::bf16_t> v(n);
  for (core::bf16_t& x : v) x = core::float_to_bf16(uniform(rng));
  return v;
}

// The routed experts' weights in MXFP8 as a caller stores them (mokMxfp8Quantize, on the host): gate, up and down, each
// rowwise (at 2 i: the forward's) and colwise (at 2 i + 1: the backward's, which the host executor's layer takes too).
struct MxWeights {
  std::vector<uint8_t> codes[6], scales[6];
  mokMxfp8Matrix_t matrix(int at) const { return {codes[at].data(), scales[at].data()}; }
};

// gate, up [E, I, H] and down [E, H, I] quantised. mokMxfp8Quantize refuses only arguments this code sets; where it
// would, every matrix is left empty and the layer's weight checks name the first.
inline MxWeights quantize_weights(int64_t experts, int64_t hidden, int64_t intermediate,
                                  const std::vector<core::bf16_t>* weights[3]) {
  MxWeights mx;
  for (int i = 0; i < 3; ++i) {
    int64_t rows = i < 2 ? intermediate : hidden, cols = i < 2 ? hidden : intermediate;
    int row = 2 * i, col = 2 * i + 1;
    mx.codes[row].resize(static_cast<size_t>(experts * rows * cols));
    mx.codes[col].resize(mx.codes[row].size());
    mx.scales[row].resize(static_cast<size_t>(core::MxScaleLayout::of(rows, cols).batch_bytes(experts)));
    mx.scales[col].resize(static_cast<size_t>(core::MxScaleLayout::of(cols, rows).batch_bytes(experts)));
    if (mokMxfp8Quantize(weights[i]->data(), mokDataBF16, experts, rows, cols, mx.codes[row].data(),
                         mx.scales[row].data(), mx.codes[col].data(), mx.scales[col].data(), nullptr) != mokSuccess)
      return MxWeights{};
  }
  return mx;
}

// bf16 results widened, to compare with fp32 ones.
inline std::vector<float> as_floats(const std::vector<core::bf16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = core::bf16_to_float(v[i]);
  return f;
}

// A CUDA call that failed, worded into the stage's text (`what` it was doing); its status.
mokStatus_t cuda_failed(Text* text, const char* what, cudaError_t e);

// The device, its driver's entry points, the probe kernels and the host-mapped error record.
mokStatus_t selftest_probe(const SelftestSetup& setup, Text* text);
// The grouped GEMM of the device's architecture (gate and down) against core's host GEMM of the same bytes.
mokStatus_t selftest_gemm_tile(const SelftestSetup& setup, Text* text);
// One rank's layer (the split executor's pass: forward, then backward) against the host executor's bytes.
mokStatus_t selftest_one_rank(const SelftestSetup& setup, Text* text);
// The cuda executor's layer (selftest_layer.cpp): a group of ranks on one GPU and one rank on every GPU of compute
// capability 10.x against the host executor; three times on one context with the same bits; a benchmark line.
mokStatus_t selftest_virtual_ranks(const SelftestSetup& setup, Text* text);
mokStatus_t selftest_every_gpu(const SelftestSetup& setup, Text* text);
mokStatus_t selftest_determinism(const SelftestSetup& setup, Text* text);
mokStatus_t selftest_benchmark(const SelftestSetup& setup, Text* text);

// Shared by the stages: the device is there, loads libmok's code, and is current. `info` describes it.
mokStatus_t open_device(const SelftestSetup& setup, mokDeviceInfo_t* info, Text* text);
// open_device, then a device whose grouped GEMMs this build carries: compute capability 10.x (the SM100 units) or 9.0
// (the SM90 ones), else mokUnsupported; its compute capability's major into `cc_major` (where given), read once.
mokStatus_t open_gemm_device(const SelftestSetup& setup, Text* text, int* cc_major = nullptr);

}  // namespace mok::cuda
