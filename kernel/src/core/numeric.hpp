// Scalar math of the layer that every executor shares: bf16 rounding and SwiGLU (DESIGN 1).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/platform.hpp"

namespace mok::core {

using bf16_t = uint16_t;  // raw bfloat16 bits

MOK_HD inline uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

MOK_HD inline float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

MOK_HD inline float bf16_to_float(bf16_t b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}

// Round to nearest even; NaN stays a (quiet) NaN. Both outcomes computed, then one chosen: no branch, so a
// loop of these vectorises.
MOK_HD inline bf16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quieted = (u >> 16) | 0x40u;
  return static_cast<bf16_t>((u & 0x7fffffffu) > 0x7f800000u ? quieted : rounded);
}

// The value a bf16 store of `f` keeps.
MOK_HD inline float round_bf16(float f) {
  return bf16_to_float(float_to_bf16(f));
}

// Products and sums whose rounding is part of the contract: nvcc would otherwise fuse them (FMA).
MOK_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

MOK_HD inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

MOK_HD inline float sigmoid(float z) {
  return 1.0f / (1.0f + expf(-z));
}

// sigmoid of every bf16 value, indexed by its 16 bits: SwiGLU's inputs are bf16, so with this table
// (memory the executor supplies, filled once) almost every sigmoid is one load of the same float.
constexpr int kSigmoidTableSize = 1 << 16;

MOK_HD inline void fill_sigmoid_table(float* table) {
  for (int b = 0; b < kSigmoidTableSize; ++b) table[b] = sigmoid(bf16_to_float(static_cast<bf16_t>(b)));
}

// Which gated activation h(g, u) the experts use (mok.h's mokActivation_t).
enum class Activation : int32_t {
  swiglu = 0,      // h = silu(g') * u'
  swiglu_oai = 1,  // h = g' * sigmoid(alpha * g') * (u' + 1) (gpt-oss)
};

// The gated activation with its clamp L: g' = min(g, L), u' = clamp(u, -L, L); no clamp is L = +inf.
// NaN propagates (docs/semantics.md, "NaN"): the clamps are written as comparisons that keep a NaN
// (fminf / fmaxf would replace it by the other argument), and a gradient is masked only where the clamp
// moved the value, which a NaN never is.
struct Swiglu {
  float limit;
  const float* sigmoid_table = nullptr;  // fill_sigmoid_table's, or null: expf every time
  Activation activation = Activation::swiglu;
  float alpha = 1.0f;  // swiglu_oai's alpha; swiglu ignores it

  // sigmoid(z): looked up when z is a bf16 value (its low 16 bits zero) and the table is there. The table
  // holds sigmoid()'s own bits, so an fp32 z (swiglu_oai's alpha * g') that happens to be a bf16 value gets
  // the same bits from either path.
  MOK_HD float sigmoid_of(float z) const {
    uint32_t bits = float_bits(z);
    if (sigmoid_table != nullptr && (bits & 0xffffu) == 0) return sigmoid_table[bits >> 16];
    return sigmoid(z);
  }

  MOK_HD float clamp_g(float g) const { return g > limit ? limit : g; }
  MOK_HD float clamp_u(float u) const { return u > limit ? limit : (u < -limit ? -limit : u); }

  MOK_HD bool oai() const { return activation == Activation::swiglu_oai; }
  // The sigmoid's argument: g' (swiglu), or the fp32 product alpha * g' (swiglu_oai).
  MOK_HD float gate_argument(float gc) const { return oai() ? mul_rn(alpha, gc) : gc; }
  // The up factor: u' (swiglu), or the fp32 sum u' + 1 (swiglu_oai).
  MOK_HD float up_factor(float uc) const { return oai() ? add_rn(uc, 1.0f) : uc; }

  // h = (g' * s) * f with s = sigmoid(gate_argument(g')), f = up_factor(u'), in fp32, in that order.
  MOK_HD float forward(float g, float u) const {
    float gc = clamp_g(g);
    return mul_rn(mul_rn(gc, sigmoid_of(gate_argument(gc))), up_factor(clamp_u(u)));
  }

  // dg, du from the stored g, u and the incoming dh: dg = (dh * f) * s (1 + a g' (1 - s)) with a = 1
  // (swiglu) or alpha (swiglu_oai), du = dh * (g' * s). The gradient is 0 where g > L, and where |u| > L:
  // torch.clamp's masks for every number (inclusive at +-L); a NaN passes as NaN.
  MOK_HD void backward(float g, float u, float dh, float* dg, float* du) const {
    float gc = clamp_g(g), f = up_factor(clamp_u(u));
    float s = sigmoid_of(gate_argument(gc));
    float dsilu = mul_rn(s, add_rn(1.0f, mul_rn(gate_argument(gc), add_rn(1.0f, -s))));
    *dg = g > limit ? 0.0f : mul_rn(mul_rn(dh, f), dsilu);
    *du = (u > limit || u < -limit) ? 0.0f : mul_rn(dh, mul_rn(gc, s));
  }
};

}  // namespace mok::core
