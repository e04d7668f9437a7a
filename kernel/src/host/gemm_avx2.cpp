// The AVX2 micro-kernel of host::gemm, compiled for AVX2 by a target attribute (the library itself is
// built for baseline x86-64) and called only when the CPU has AVX2 (host::gemm_isa). The product and the
// sum are separate steps: each element rounds its product, then its sum, as core::reference_gemm does.
#include "host/gemm.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

namespace mok::host::detail {

// The product as a value of its own: an empty asm the compiler cannot see through, so no flag or target
// (-ffp-contract=fast, g++'s default in C++; "fma" added to the target) fuses it into the add.
__attribute__((target("avx2"), always_inline)) static inline __m256 product(__m256 x, __m256 y) {
  __m256 p = _mm256_mul_ps(x, y);
  asm("" : "+x"(p));
  return p;
}

__attribute__((target("avx2"))) void micro_kernel_avx2(int depth, const float* a, const float* b, float* c,
                                                       int64_t ldc) {
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
    c00 = _mm256_add_ps(c00, product(x, b0));
    c01 = _mm256_add_ps(c01, product(x, b1));
    x = _mm256_broadcast_ss(a + 1);
    c10 = _mm256_add_ps(c10, product(x, b0));
    c11 = _mm256_add_ps(c11, product(x, b1));
    x = _mm256_broadcast_ss(a + 2);
    c20 = _mm256_add_ps(c20, product(x, b0));
    c21 = _mm256_add_ps(c21, product(x, b1));
    x = _mm256_broadcast_ss(a + 3);
    c30 = _mm256_add_ps(c30, product(x, b0));
    c31 = _mm256_add_ps(c31, product(x, b1));
    x = _mm256_broadcast_ss(a + 4);
    c40 = _mm256_add_ps(c40, product(x, b0));
    c41 = _mm256_add_ps(c41, product(x, b1));
    x = _mm256_broadcast_ss(a + 5);
    c50 = _mm256_add_ps(c50, product(x, b0));
    c51 = _mm256_add_ps(c51, product(x, b1));
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

}  // namespace mok::host::detail
#endif
