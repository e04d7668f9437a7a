// The elementwise stages of a tile, one row at a time, on the rows' bf16 bytes: SwiGLU forward and
// backward (computed in fp32 from the stored values, stored bf16, DESIGN 1) and the row moves of the
// comm tasks. The GEMMs are gemm.hpp's.
#pragma once

#include <cstdint>

#include "core/numeric.hpp"

namespace mok::core {

// h = SwiGLU(g, u).
MOK_HD inline void swiglu_row(const Swiglu& sw, const bf16_t* g, const bf16_t* u, int n, bf16_t* h) {
  for (int i = 0; i < n; ++i) h[i] = float_to_bf16(sw.forward(bf16_to_float(g[i]), bf16_to_float(u[i])));
}

// g, u, dh become dg, du in place of g, u.
MOK_HD inline void swiglu_gradient_row(const Swiglu& sw, bf16_t* g, bf16_t* u, const bf16_t* dh, int n) {
  for (int i = 0; i < n; ++i) {
    float dg, du;
    sw.backward(bf16_to_float(g[i]), bf16_to_float(u[i]), bf16_to_float(dh[i]), &dg, &du);
    g[i] = float_to_bf16(dg);
    u[i] = float_to_bf16(du);
  }
}

// g, u, dh become dg, du and h, element by element in place (each is read before it is replaced): the
// backward keeps h for dW_down where the forward's dh was.
MOK_HD inline void swiglu_backward_row(const Swiglu& sw, bf16_t* g, bf16_t* u, bf16_t* hd, int n) {
  for (int i = 0; i < n; ++i) {
    float gv = bf16_to_float(g[i]), uv = bf16_to_float(u[i]), dg, du;
    sw.backward(gv, uv, bf16_to_float(hd[i]), &dg, &du);
    hd[i] = float_to_bf16(sw.forward(gv, uv));
    g[i] = float_to_bf16(dg);
    u[i] = float_to_bf16(du);
  }
}

// Weight-gradient sums into the caller's gradient from its element `at` on: bf16, or added into fp32
// main_grad (each element once, so the sum is main_grad + the whole fp32 sum).
MOK_HD inline void write_gradient(const float* sums, int64_t n, bool accumulate, void* grad, int64_t at) {
  if (accumulate) {
    float* main = static_cast<float*>(grad) + at;
    for (int64_t i = 0; i < n; ++i) main[i] = add_rn(main[i], sums[i]);
  } else {
    bf16_t* out = static_cast<bf16_t*>(grad) + at;
    for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(sums[i]);
  }
}

// n bf16 zeros: the padding rows of a block on its way to quantisation.
MOK_HD inline void zero_rows(bf16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = 0;
}

MOK_HD inline void copy_row(const bf16_t* src, int n, bf16_t* dst) {
  for (int i = 0; i < n; ++i) dst[i] = src[i];
}

// dst = bf16(w · src): a row of dy = w_k · dOut_t.
MOK_HD inline void scaled_row(float w, const bf16_t* src, int n, bf16_t* dst) {
  for (int i = 0; i < n; ++i) dst[i] = float_to_bf16(mul_rn(w, bf16_to_float(src[i])));
}

}  // namespace mok::core
