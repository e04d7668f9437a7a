// Per-row tile math in fp32: the part a GPU executor replaces with its tensor-core GEMM. Sums run
// in a fixed order (index order), so a result never depends on how rows were batched.
#pragma once

#include <cstdint>

#include "core/numeric.hpp"

namespace mok::core {

MOK_HD inline float dot(const float* a, const float* b, int n, float acc = 0.0f) {
  for (int i = 0; i < n; ++i) acc = add_rn(acc, mul_rn(a[i], b[i]));
  return acc;
}

// out[j] = round_bf16(a . w[j]) for w [n_out, n_in] row-major: a row times a weight transposed.
MOK_HD inline void row_times_wt(const float* a, const float* w, int n_in, int n_out, float* out) {
  for (int j = 0; j < n_out; ++j) out[j] = round_bf16(dot(a, w + static_cast<int64_t>(j) * n_in, n_in));
}

// acc[j] += sum_i a[i] * w[i][j] for w [n_in, n_out], i in order: a row times a weight.
MOK_HD inline void row_times_w_acc(const float* a, const float* w, int n_in, int n_out, float* acc) {
  for (int i = 0; i < n_in; ++i) {
    const float* wi = w + static_cast<int64_t>(i) * n_out;
    for (int j = 0; j < n_out; ++j) acc[j] = add_rn(acc[j], mul_rn(a[i], wi[j]));
  }
}

// acc[i][j] += a[i] * b[j]: one row's contribution to a weight gradient.
MOK_HD inline void outer_acc(const float* a, const float* b, int n_a, int n_b, float* acc) {
  for (int i = 0; i < n_a; ++i) {
    float* row = acc + static_cast<int64_t>(i) * n_b;
    for (int j = 0; j < n_b; ++j) row[j] = add_rn(row[j], mul_rn(a[i], b[j]));
  }
}

// acc[i][j] += sum_r a[r][i] * b[r][j] over `rows` rows, r in order: a block of rows' contribution
// to a weight gradient. Each acc row stays hot across the block; every element still adds its
// terms in row order, so the bits equal those of one outer_acc per row.
MOK_HD inline void outer_acc_rows(const float* a, const float* b, int rows, int n_a, int n_b, float* acc) {
  for (int i = 0; i < n_a; ++i) {
    float* out = acc + static_cast<int64_t>(i) * n_b;
    for (int r = 0; r < rows; ++r) {
      float ai = a[static_cast<int64_t>(r) * n_a + i];
      const float* br = b + static_cast<int64_t>(r) * n_b;
      for (int j = 0; j < n_b; ++j) out[j] = add_rn(out[j], mul_rn(ai, br[j]));
    }
  }
}

MOK_HD inline void bf16_row_to_float(const bf16_t* src, int n, float* dst) {
  for (int i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

MOK_HD inline void float_row_to_bf16(const float* src, int n, bf16_t* dst) {
  for (int i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

MOK_HD inline void fill(float* dst, int64_t n, float v) {
  for (int64_t i = 0; i < n; ++i) dst[i] = v;
}

MOK_HD inline void copy(const float* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

}  // namespace mok::core
