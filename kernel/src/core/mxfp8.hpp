// The MXFP8 codec (DESIGN 1.2, contracts "MXFP8"): blocks of up to 32 values share an e8m0 scale
// 2^e, the smallest power of two with amax / 2^e <= 448; values are e4m3fn, nearest even, saturated.
// A block holding a NaN or an infinity has no such scale: it gets e8m0's NaN scale 0xFF and decodes
// to NaN in every element (docs/mxfp8.md), so a NaN activation stays NaN through an MXFP8 GEMM.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/numeric.hpp"

namespace mok::core {

constexpr int kMxBlock = 32;
constexpr float kE4m3Max = 448.0f;
constexpr uint8_t kE8m0Nan = 0xff;
constexpr uint8_t kE4m3Nan = 0x7f;
constexpr float kFloatMax = 3.40282347e38f;

// Blocks of 32 along n values (the last may be shorter): the scales of one row quantised along itself.
MOK_HD inline int64_t mx_blocks(int64_t n) {
  return (n + kMxBlock - 1) / kMxBlock;
}

MOK_HD inline float quiet_nan() {
  return bits_float(0x7fc00000u);
}

// A value as the codec reads it: fp32 as is, bf16 widened (exactly).
MOK_HD inline float mx_load_float(const float* v, int64_t i) {
  return v[i];
}
MOK_HD inline float mx_load_float(const bf16_t* v, int64_t i) {
  return bf16_to_float(v[i]);
}

// The largest |v| of a block (fp32 or bf16 values), or NaN when the block holds a NaN or an infinity
// (fmaxf would skip a NaN).
// `load(i)`: value i of n.
template <class Load>
MOK_HD float mx_amax(int n, Load load) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    float a = fabsf(load(i));
    if (!(a <= kFloatMax)) return quiet_nan();
    amax = a > amax ? a : amax;
  }
  return amax;
}
template <class T>
MOK_HD float mx_block_amax(const T* v, int n, int64_t stride) {
  return mx_amax(n, [&](int i) { return mx_load_float(v, i * stride); });
}

// The scale exponent e for a block whose largest magnitude is `amax` (finite, >= 0). Exact: from
// amax = m * 2^x with m in [0.5, 1), and 448 = 0.875 * 2^9, the answer is x - 9 when m <= 0.875.
MOK_HD inline int mx_scale_exponent(float amax) {
  if (amax == 0.0f) return -127;
  int x;
  float m = frexpf(amax, &x);
  int e = m <= 0.875f ? x - 9 : x - 8;
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}

MOK_HD inline uint8_t e8m0_encode(int e) {
  return static_cast<uint8_t>(e + 127);
}
MOK_HD inline float e8m0_decode(uint8_t s) {
  return s == kE8m0Nan ? quiet_nan() : ldexpf(1.0f, static_cast<int>(s) - 127);
}

MOK_HD inline float round_half_even(float v) {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  return std::nearbyint(v);  // the default rounding mode is nearest even
#endif
}

// e4m3fn bits of v, |v| already <= 448 (saturated by the caller); nearest even.
MOK_HD inline uint8_t e4m3_encode(float v) {
  uint8_t sign = (float_bits(v) >> 31) ? 0x80 : 0x00;
  float a = fabsf(v);
  if (a < 0.015625f) {  // below 2^-6: subnormal steps of 2^-9; 8 steps is the smallest normal
    return sign | static_cast<uint8_t>(round_half_even(a * 512.0f));
  }
  int x;
  frexpf(a, &x);
  int exponent = x - 1;  // a in [2^exponent, 2^(exponent+1))
  int mantissa = static_cast<int>(round_half_even((ldexpf(a, -exponent) - 1.0f) * 8.0f));
  if (mantissa == 8) {
    mantissa = 0;
    ++exponent;
  }
  return sign | static_cast<uint8_t>(((exponent + 7) << 3) | mantissa);
}

MOK_HD inline float e4m3_decode(uint8_t q) {
  if ((q & 0x7f) == kE4m3Nan) return quiet_nan();  // e4m3fn has no infinities: S.1111.111 is NaN
  int exponent = (q >> 3) & 0xf;
  int mantissa = q & 0x7;
  float a = exponent == 0 ? ldexpf(static_cast<float>(mantissa), -9)
                          : ldexpf(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  return (q & 0x80) ? -a : a;
}

// An MXFP8 element's value: its code times its block's scale (e8m0_decode's), one fp32 product.
MOK_HD inline float mx_value(uint8_t code, float scale) {
  return e4m3_decode(code) * scale;
}

// One block of n <= 32 values (fp32 or bf16) read with `stride`: writes n codes (stride `qstride`) and
// returns the e8m0 scale; a non-finite block gets the NaN scale and NaN codes. No local array: a device
// thread quantises a column of rows in place.
template <class T>
MOK_HD uint8_t mx_quantize_block(const T* v, int n, int64_t stride, uint8_t* q, int64_t qstride) {
  float amax = mx_block_amax(v, n, stride);
  if (amax != amax) {
    for (int i = 0; i < n; ++i) q[i * qstride] = kE4m3Nan;
    return kE8m0Nan;
  }
  int e = mx_scale_exponent(amax);
  for (int i = 0; i < n; ++i) {
    float scaled = ldexpf(mx_load_float(v, i * stride), -e);  // exact: a power-of-two scale
    scaled = fminf(fmaxf(scaled, -kE4m3Max), kE4m3Max);
    q[i * qstride] = e4m3_encode(scaled);
  }
  return e8m0_encode(e);
}

// One value of a finite block whose scale exponent is e (mx_scale_exponent) after the MXFP8 round trip.
MOK_HD inline float mx_round_trip_value(float value, int e) {
  float scaled = fminf(fmaxf(ldexpf(value, -e), -kE4m3Max), kE4m3Max);
  return ldexpf(e4m3_decode(e4m3_encode(scaled)), e);
}

// What a block becomes after an MXFP8 round trip, in place (the operand a GEMM actually sees).
MOK_HD inline void mx_round_trip_block(float* v, int n, int stride) {
  float amax = mx_block_amax(v, n, stride);
  if (amax != amax) {
    for (int i = 0; i < n; ++i) v[i * stride] = quiet_nan();
    return;
  }
  int e = mx_scale_exponent(amax);
  for (int i = 0; i < n; ++i) v[i * stride] = mx_round_trip_value(v[i * stride], e);
}

// A row of n values quantised along itself (blocks of 32 from its start), in place.
MOK_HD inline void mx_round_trip_row(float* v, int n) {
  for (int b = 0; b < n; b += kMxBlock) mx_round_trip_block(v + b, n - b < kMxBlock ? n - b : kMxBlock, 1);
}

}  // namespace mok::core
