// The AVX2 micro-kernels of host::gemm on 6 x 16 tiles (b panels of 16 columns), compiled for AVX2 and FMA by
// a target attribute (the library itself is built for baseline x86-64) and called only when the CPU has both
// (host::gemm_isa).
//
// Two forms of one body. The unfused form rounds each product, then adds it (core::reference_gemm's order),
// with an empty asm between the two so that no flag fuses them. The fused form is one FMA per product;
// host::gemm runs it only on panels where every product is exact (detail::products_exact), where an FMA
// rounds exactly as the product-then-add does, so both forms give the same bits there.
#include "host/gemm.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>

namespace mok::host::detail {
namespace {

// c + x·y: fused, or the product as a value of its own (an asm the compiler cannot see through) then the add.
template <bool kFused>
__attribute__((target("avx2,fma"), always_inline)) inline __m256 step(__m256 c, __m256 x, __m256 y) {
  if constexpr (kFused) {
    return _mm256_fmadd_ps(x, y, c);
  } else {
    __m256 p = _mm256_mul_ps(x, y);
    asm("" : "+x"(p));
    return _mm256_add_ps(c, p);
  }
}

template <bool kFused>
__attribute__((target("avx2,fma"))) void kernel(int depth, const float* a, const float* b, float* c, int64_t ldc) {
  static_assert(kPanelRows == 6, "the kernel holds a 6 x 16 tile in 12 registers");
  __m256 c00 = _mm256_loadu_ps(c + 0 * ldc), c01 = _mm256_loadu_ps(c + 0 * ldc + 8);
  __m256 c10 = _mm256_loadu_ps(c + 1 * ldc), c11 = _mm256_loadu_ps(c + 1 * ldc + 8);
  __m256 c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
  __m256 c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
  __m256 c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
  __m256 c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
  for (int k = 0; k < depth; ++k, a += 6, b += 16) {
    __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    __m256 x;
    x = _mm256_broadcast_ss(a + 0);
    c00 = step<kFused>(c00, x, b0);
    c01 = step<kFused>(c01, x, b1);
    x = _mm256_broadcast_ss(a + 1);
    c10 = step<kFused>(c10, x, b0);
    c11 = step<kFused>(c11, x, b1);
    x = _mm256_broadcast_ss(a + 2);
    c20 = step<kFused>(c20, x, b0);
    c21 = step<kFused>(c21, x, b1);
    x = _mm256_broadcast_ss(a + 3);
    c30 = step<kFused>(c30, x, b0);
    c31 = step<kFused>(c31, x, b1);
    x = _mm256_broadcast_ss(a + 4);
    c40 = step<kFused>(c40, x, b0);
    c41 = step<kFused>(c41, x, b1);
    x = _mm256_broadcast_ss(a + 5);
    c50 = step<kFused>(c50, x, b0);
    c51 = step<kFused>(c51, x, b1);
  }
  _mm256_storeu_ps(c + 0 * ldc, c00);
  _mm256_storeu_ps(c + 0 * ldc + 8, c01);
  _mm256_storeu_ps(c + 1 * ldc, c10);
  _mm256_storeu_ps(c + 1 * ldc + 8, c11);
  _mm256_storeu_ps(c + 2 * ldc, c20);
  _mm256_storeu_ps(c + 2 * ldc + 8, c21);
  _mm256_storeu_ps(c + 3 * ldc, c30);
  _mm256_storeu_ps(c + 3 * ldc + 8, c31);
  _mm256_storeu_ps(c + 4 * ldc, c40);
  _mm256_storeu_ps(c + 4 * ldc + 8, c41);
  _mm256_storeu_ps(c + 5 * ldc, c50);
  _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}

}  // namespace

__attribute__((target("avx2"))) ValueRange value_range_avx2(const float* v, size_t n) {
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff), low_bits = _mm256_set1_epi32(0xffff);
  const __m256i none = _mm256_set1_epi32(255), zero = _mm256_setzero_si256();
  __m256i lowest = none, highest = zero, wide = zero;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i bits = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i)), magnitude);
    __m256i exponent = _mm256_srli_epi32(bits, 23), is_zero = _mm256_cmpeq_epi32(bits, zero);
    // a zero's exponent is 0: or-ing in 255 takes it out of the minimum
    lowest = _mm256_min_epu32(lowest, _mm256_or_si256(exponent, _mm256_and_si256(is_zero, none)));
    highest = _mm256_max_epu32(highest, exponent);
    __m256i special = _mm256_or_si256(_mm256_cmpeq_epi32(exponent, zero), _mm256_cmpeq_epi32(exponent, none));
    wide =
        _mm256_or_si256(wide, _mm256_or_si256(_mm256_and_si256(bits, low_bits), _mm256_andnot_si256(is_zero, special)));
  }
  alignas(32) uint32_t lo[8], hi[8], wi[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lo), lowest);
  _mm256_store_si256(reinterpret_cast<__m256i*>(hi), highest);
  _mm256_store_si256(reinterpret_cast<__m256i*>(wi), wide);
  ValueRange range = value_range(v + i, n - i);
  for (int lane = 0; lane < 8; ++lane) {
    range.min_exponent = std::min(range.min_exponent, static_cast<int>(lo[lane]));
    range.max_exponent = std::max(range.max_exponent, static_cast<int>(hi[lane]));
    range.narrow = range.narrow && wi[lane] == 0;
  }
  return range;
}

void micro_kernel_avx2(int depth, const float* a, const float* b, float* c, int64_t ldc) {
  kernel<false>(depth, a, b, c, ldc);
}

void micro_kernel_avx2_fused(int depth, const float* a, const float* b, float* c, int64_t ldc) {
  kernel<true>(depth, a, b, c, ldc);
}

}  // namespace mok::host::detail
#endif
