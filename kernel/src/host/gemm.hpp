// The host executor's tile GEMM: core::Gemm computed with the bits of core::reference_gemm, fast.
//
// Each call decodes its operands once into fp32 (the MXFP8 round trip included), packs a into panels
// of 6 rows and b into panels of 16 or 32 columns, both [depth][width] with the parts' depths
// concatenated, and runs a register-blocked micro-kernel: every element multiplies, rounds, then adds,
// in k order, part 0 then part 1, from 0 or from c. The kernel is chosen at run time (AVX-512, AVX2,
// portable scalar code); all give the same bits (docs/core.md, "The host GEMM"). Where every product of
// an a panel and a b panel is exact in fp32 (bf16 and MXFP8 values away from the ends of fp32's range),
// the AVX kernels fuse each product into its add: an FMA then rounds once where the contract rounds
// twice, the first rounding being exact, so the bits are the same.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/gemm.hpp"

namespace mok::host {

// scalar: portable C++ on 4-float vectors (SSE2, NEON or scalars: one multiply, then one add, per lane).
enum class GemmIsa { scalar, avx2, avx512 };

// The fp32 scratch a call needs for a tile of at most `rows` x `cols` whose parts' depths add up to at
// most `max_depth` (parts[0].depth + parts[1].depth). Less (but at least gemm_scratch_floats(6, cols,
// max_depth)) works too: the call then packs a in chunks of rows and decodes b once per chunk.
size_t gemm_scratch_floats(int rows, int cols, int max_depth);

// c = a · bᵀ as g describes, on the path gemm_isa() names. No heap allocation: every buffer lies in
// scratch. c may not alias an operand. A scratch smaller than the minimum above is a programming error
// of the executor: the call reports it on stderr and aborts.
void gemm(const core::Gemm& g, float* scratch, size_t scratch_floats);

// The same on a given path (tests compare the paths); `isa` must be available.
void gemm(const core::Gemm& g, float* scratch, size_t scratch_floats, GemmIsa isa);

// The path gemm takes in this process: the widest the CPU supports (avx512; avx2 with FMA; scalar), or the one the
// environment variable MOK_HOST_ISA names ("scalar", "avx2", "avx512") when the CPU has it. Read once.
GemmIsa gemm_isa();
bool gemm_isa_available(GemmIsa isa);
const char* gemm_isa_name(GemmIsa isa);

namespace detail {

constexpr int kPanelRows = 6;      // rows of a per micro-kernel tile
constexpr int kMaxPanelCols = 32;  // columns of b per micro-kernel tile: 16 (scalar, AVX2) or 32 (AVX-512)
// The depth a kernel call walks: a b panel's block of it (32 x 256 floats, 32 KiB) stays in L1 while every a
// panel passes over it; a deeper GEMM keeps its tiles' running sums in scratch between blocks.
constexpr int kDepthBlock = 256;

// core::mx_round_trip_block's values, bit for bit, with bit operations and multiplications by powers of two in
// place of frexpf / ldexpf / nearbyint per element (test_host_gemm compares the two).
void mx_round_trip_block(float* v, int n, int stride);

// What decides whether the products of two panels are exact: the biased exponent range of a panel's
// nonzero values, and whether every value is finite, zero or normal, with at most 8 significant bits
// (its low 16 mantissa bits zero: every bf16 and every MXFP8 value is).
struct ValueRange {
  int min_exponent = 255, max_exponent = 0;
  bool narrow = true;
};
ValueRange value_range(const float* v, size_t n);
#if defined(__x86_64__)
ValueRange value_range_avx2(const float* v, size_t n);  // the same, 8 values at a time
// The same of n bf16 words, as the SSE2 bf16 decoder finds it while it decodes a panel.
ValueRange value_range_bf16(const core::bf16_t* v, size_t n);
#endif

// True when every product of a value in `a` and a value in `b` is 0 or a normal fp32 with at most 16
// significant bits, so exact: fma(x, y, c) then rounds as c + round(x · y) does, on any sums and under
// any MXCSR flush mode (an exact normal product is never flushed).
bool products_exact(ValueRange a, ValueRange b);

// c[r * ldc + j] += Σ_k a[k * 6 + r] · b[k * w + j] for r < 6, j < w, one product and one add at a time,
// k = 0, 1, ...; w = 16 for the scalar and AVX2 kernels, 32 for AVX-512. The _fused kernels do each
// product and add as one FMA: the same bits only where products_exact holds for the panels.
void micro_kernel_scalar(int depth, const float* a, const float* b, float* c, int64_t ldc);
#if defined(__x86_64__)
void micro_kernel_avx2(int depth, const float* a, const float* b, float* c, int64_t ldc);
void micro_kernel_avx2_fused(int depth, const float* a, const float* b, float* c, int64_t ldc);
void micro_kernel_avx512(int depth, const float* a, const float* b, float* c, int64_t ldc);
void micro_kernel_avx512_fused(int depth, const float* a, const float* b, float* c, int64_t ldc);
#endif

}  // namespace detail

}  // namespace mok::host
