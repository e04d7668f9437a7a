// The self-test's GPU stages (mok.h: mokSelftestRun; api/selftest.cpp words the rest). Each returns the stage's
// verdict as a status and writes what it checked and found into its Text, passed or not.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

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

// The device, its driver's entry points, the probe kernels and the host-mapped error record.
mokStatus_t selftest_probe(const SelftestSetup& setup, Text* text);
// The SM100 grouped GEMM (gate and down) against core's host GEMM of the same bytes.
mokStatus_t selftest_gemm_tile(const SelftestSetup& setup, Text* text);

// Shared by the stages: the device is there, loads libmok's code, and is current. `info` describes it.
mokStatus_t open_device(const SelftestSetup& setup, mokDeviceInfo_t* info, Text* text);

}  // namespace mok::cuda
