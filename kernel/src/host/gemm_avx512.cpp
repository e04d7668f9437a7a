// The AVX-512 micro-kernels of host::gemm: the AVX2 kernels' order on 6 x 32 tiles (b panels of 32 columns),
// compiled for AVX-512F by a target attribute and called only when the CPU has it (host::gemm_isa).
//
// Two forms of one body. The unfused form rounds each product, then adds it (core::reference_gemm's order),
// with an empty asm between the two so that no flag fuses them. The fused form is one FMA per product;
// host::gemm runs it only on panels where every product is exact (detail::products_exact), where an FMA
// rounds exactly as the product-then-add does, so both forms give the same bits there.
#include "host/gemm.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

namespace mok::host::detail {
namespace {

// c + x·y: fused, or the product as a value of its own (an asm the compiler cannot see through) then the add.
template <bool kFused>
__attribute__((target("avx512f"), always_inline)) inline __m512 step(__m512 c, __m512 x, __m512 y) {
  if constexpr (kFused) {
    return _mm512_fmadd_ps(x, y, c);
  } else {
    __m512 p = _mm512_mul_ps(x, y);
    asm("" : "+v"(p));
    return _mm512_add_ps(c, p);
  }
}

template <bool kFused>
__attribute__((target("avx512f"))) void kernel(int depth, const float* a, const float* b, float* c, int64_t ldc) {
  static_assert(kPanelRows == 6 && kMaxPanelCols == 32, "the kernel holds a 6 x 32 tile in 12 registers");
  __m512 c00 = _mm512_loadu_ps(c + 0 * ldc), c01 = _mm512_loadu_ps(c + 0 * ldc + 16);
  __m512 c10 = _mm512_loadu_ps(c + 1 * ldc), c11 = _mm512_loadu_ps(c + 1 * ldc + 16);
  __m512 c20 = _mm512_loadu_ps(c + 2 * ldc), c21 = _mm512_loadu_ps(c + 2 * ldc + 16);
  __m512 c30 = _mm512_loadu_ps(c + 3 * ldc), c31 = _mm512_loadu_ps(c + 3 * ldc + 16);
  __m512 c40 = _mm512_loadu_ps(c + 4 * ldc), c41 = _mm512_loadu_ps(c + 4 * ldc + 16);
  __m512 c50 = _mm512_loadu_ps(c + 5 * ldc), c51 = _mm512_loadu_ps(c + 5 * ldc + 16);
  for (int k = 0; k < depth; ++k, a += 6, b += 32) {
    __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
    __m512 x;
    x = _mm512_set1_ps(a[0]);
    c00 = step<kFused>(c00, x, b0);
    c01 = step<kFused>(c01, x, b1);
    x = _mm512_set1_ps(a[1]);
    c10 = step<kFused>(c10, x, b0);
    c11 = step<kFused>(c11, x, b1);
    x = _mm512_set1_ps(a[2]);
    c20 = step<kFused>(c20, x, b0);
    c21 = step<kFused>(c21, x, b1);
    x = _mm512_set1_ps(a[3]);
    c30 = step<kFused>(c30, x, b0);
    c31 = step<kFused>(c31, x, b1);
    x = _mm512_set1_ps(a[4]);
    c40 = step<kFused>(c40, x, b0);
    c41 = step<kFused>(c41, x, b1);
    x = _mm512_set1_ps(a[5]);
    c50 = step<kFused>(c50, x, b0);
    c51 = step<kFused>(c51, x, b1);
  }
  _mm512_storeu_ps(c + 0 * ldc, c00);
  _mm512_storeu_ps(c + 0 * ldc + 16, c01);
  _mm512_storeu_ps(c + 1 * ldc, c10);
  _mm512_storeu_ps(c + 1 * ldc + 16, c11);
  _mm512_storeu_ps(c + 2 * ldc, c20);
  _mm512_storeu_ps(c + 2 * ldc + 16, c21);
  _mm512_storeu_ps(c + 3 * ldc, c30);
  _mm512_storeu_ps(c + 3 * ldc + 16, c31);
  _mm512_storeu_ps(c + 4 * ldc, c40);
  _mm512_storeu_ps(c + 4 * ldc + 16, c41);
  _mm512_storeu_ps(c + 5 * ldc, c50);
  _mm512_storeu_ps(c + 5 * ldc + 16, c51);
}

}  // namespace

void micro_kernel_avx512(int depth, const float* a, const float* b, float* c, int64_t ldc) {
  kernel<false>(depth, a, b, c, ldc);
}

void micro_kernel_avx512_fused(int depth, const float* a, const float* b, float* c, int64_t ldc) {
  kernel<true>(depth, a, b, c, ldc);
}

}  // namespace mok::host::detail
#endif
