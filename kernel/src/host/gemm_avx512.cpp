// The AVX-512 micro-kernel of host::gemm: the AVX2 kernel's order on 6 x 32 tiles (b panels of 32 columns),
// compiled for AVX-512F by a target attribute and called only when the CPU has it (host::gemm_isa). As in
// gemm_avx2.cpp the product and the sum are separate intrinsics: each element rounds its product, then its
// sum, as core::reference_gemm does.
#include "host/gemm.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

namespace mok::host::detail {

// The product as a value of its own: an empty asm the compiler cannot see through, so no flag
// (-ffp-contract=fast, g++'s default in C++, or clang's "on") fuses it into the add. AVX-512F has FMA.
__attribute__((target("avx512f"), always_inline)) static inline __m512 product(__m512 x, __m512 y) {
  __m512 p = _mm512_mul_ps(x, y);
  asm("" : "+v"(p));
  return p;
}

__attribute__((target("avx512f"))) void micro_kernel_avx512(int depth, const float* a, const float* b, float* c,
                                                            int64_t ldc) {
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
    c00 = _mm512_add_ps(c00, product(x, b0));
    c01 = _mm512_add_ps(c01, product(x, b1));
    x = _mm512_set1_ps(a[1]);
    c10 = _mm512_add_ps(c10, product(x, b0));
    c11 = _mm512_add_ps(c11, product(x, b1));
    x = _mm512_set1_ps(a[2]);
    c20 = _mm512_add_ps(c20, product(x, b0));
    c21 = _mm512_add_ps(c21, product(x, b1));
    x = _mm512_set1_ps(a[3]);
    c30 = _mm512_add_ps(c30, product(x, b0));
    c31 = _mm512_add_ps(c31, product(x, b1));
    x = _mm512_set1_ps(a[4]);
    c40 = _mm512_add_ps(c40, product(x, b0));
    c41 = _mm512_add_ps(c41, product(x, b1));
    x = _mm512_set1_ps(a[5]);
    c50 = _mm512_add_ps(c50, product(x, b0));
    c51 = _mm512_add_ps(c51, product(x, b1));
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

}  // namespace mok::host::detail
#endif
