// host::gemm: decode and pack the operands once per call, then run the micro-kernel tile by tile.
// The bits are core::reference_gemm's because every element's sum is the same chain of roundings:
// the packed values are the values load_operand_row gives (same decoders, same MXFP8 round trip,
// same blocks), the kernel starts from the same value and multiplies, rounds, adds, rounds, k by k,
// with the parts' depths laid end to end in the panels. Zero padding of edge panels only feeds rows
// and columns that are never stored.
#include "host/gemm.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/mxfp8.hpp"
#include "core/numeric.hpp"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace mok::host {
namespace {

using core::Dtype;
using core::Operand;
using detail::kDepthBlock;
using detail::kMaxPanelCols;
using detail::kPanelRows;

using KernelFn = void (*)(int depth, const float* a, const float* b, float* c, int64_t ldc);
using RangeFn = detail::ValueRange (*)(const float* v, size_t n);

// A path's micro-kernels and the width of the b panels they read (their tile is 6 x cols): `fused` runs
// where the panels' products are exact, as `range` reads them (null: the path has no FMA).
struct Kernel {
  KernelFn run, fused;
  int cols;
  RangeFn range;
};

// core's e4m3 and e8m0 decoders, tabulated once: a code's value is then one load, the same float.
struct Tables {
  float e4m3[256], e8m0[256];
  Tables() {
    for (int q = 0; q < 256; ++q) {
      e4m3[q] = core::e4m3_decode(static_cast<uint8_t>(q));
      e8m0[q] = core::e8m0_decode(static_cast<uint8_t>(q));
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

// 2^e as a float, e in [-127, 127] (2^-127 is subnormal, still exact).
float power_of_two(int e) {
  return e >= -126 ? core::bits_float(static_cast<uint32_t>(e + 127) << 23) : core::bits_float(0x00400000u);
}

// The nearest e4m3fn value to s, ties to even (|s| <= 448): what e4m3_decode(e4m3_encode(s)) gives.
float e4m3_nearest(float s) {
  float a = fabsf(s), q;
  if (a < 0.015625f) {
    q = (a + 16384.0f) - 16384.0f;  // the ulp of 2^14 is 2^-9, e4m3's subnormal step: a rounds to it, ties even
  } else {
    // keep 3 of the 23 mantissa bits, ties to even; a carry moves into the exponent
    uint32_t u = core::float_bits(a);
    q = core::bits_float((u + 0x7ffffu + ((u >> 20) & 1u)) & ~0xfffffu);
  }
  return copysignf(q, s);
}

int total_depth(const core::Gemm& g) {
  int depth = 0;
  for (int p = 0; p < g.num_parts; ++p) depth += g.parts[p].depth;
  return depth;
}

// panel[k * width + r] = value(r, k, r * rs + k * ds) for rows r < n, walking the operand's contiguous
// direction innermost (the unit stride known to the compiler); rows n .. width - 1 are 0.
template <class Value>
void fill_panel(int n, int depth, int width, int64_t rs, int64_t ds, float* panel, Value value) {
  if (ds == 1) {
    // K-major: a row's depth is contiguous. Blocks of 64 k keep the panel lines being written in L1.
    for (int k0 = 0; k0 < depth; k0 += 64)
      for (int r = 0, k1 = std::min(depth, k0 + 64); r < n; ++r)
        for (int k = k0; k < k1; ++k) panel[static_cast<int64_t>(k) * width + r] = value(r, k, r * rs + k);
  } else if (rs == 1) {
    for (int k = 0; k < depth; ++k)
      for (int r = 0; r < n; ++r) panel[static_cast<int64_t>(k) * width + r] = value(r, k, r + k * ds);
  } else {
    for (int k = 0; k < depth; ++k)
      for (int r = 0; r < n; ++r) panel[static_cast<int64_t>(k) * width + r] = value(r, k, r * rs + k * ds);
  }
  for (int k = 0; k < depth; ++k)
    for (int r = n; r < width; ++r) panel[static_cast<int64_t>(k) * width + r] = 0.0f;
}

#if defined(__x86_64__)
// The first n (4, 6 or 8) of 8 bf16 values as fp32 (each one's bits in the high half of a 32-bit lane:
// bf16_to_float exactly).
void store_bf16(float* out, __m128i v, int n) {
  __m128i zero = _mm_setzero_si128();
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_unpacklo_epi16(zero, v));
  __m128i high = _mm_unpackhi_epi16(zero, v);
  if (n == 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 4), high);
  if (n == 6) _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 4), high);
}

__m128i load8(const core::bf16_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// n (6 or 8) consecutive bf16 values, reading no further.
__m128i load_row(const core::bf16_t* p, int n) {
  if (n == 8) return load8(p);
  int32_t last;
  std::memcpy(&last, p + 4, sizeof(last));
  return _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), _mm_cvtsi32_si128(last));
}

// detail::value_range of bf16 words as they are decoded, 8 at a time with SSE2 (no second pass over the panel):
// each word's exponent field stays in place (bits 7..14), a zero takes part in the maximum only. Every bf16 value
// has 8 significant bits; a subnormal (exponent 0) or an Inf or NaN (exponent 255) clears `narrow`.
struct Bf16Range {
  __m128i lowest = _mm_set1_epi16(0x7f80), highest = _mm_setzero_si128();

  void add(__m128i words) {
    const __m128i field = _mm_set1_epi16(0x7f80);
    __m128i exponent = _mm_and_si128(words, field);
    __m128i zero = _mm_cmpeq_epi16(_mm_and_si128(words, _mm_set1_epi16(0x7fff)), _mm_setzero_si128());
    lowest = _mm_min_epi16(lowest, _mm_or_si128(exponent, _mm_and_si128(zero, field)));
    highest = _mm_max_epi16(highest, exponent);
  }
  void add(core::bf16_t word) { add(_mm_set1_epi16(static_cast<int16_t>(word))); }

  detail::ValueRange range() const {
    alignas(16) int16_t low[8], high[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(low), lowest);
    _mm_store_si128(reinterpret_cast<__m128i*>(high), highest);
    int min_field = 0x7f80, max_field = 0;
    for (int lane = 0; lane < 8; ++lane) min_field = std::min<int>(min_field, low[lane]);
    for (int lane = 0; lane < 8; ++lane) max_field = std::max<int>(max_field, high[lane]);
    return detail::ValueRange{min_field >> 7, max_field >> 7, min_field >= 0x80 && max_field <= 0x7f00};
  }
};

// n (6 or 8) rows x 8 k of a K-major bf16 operand (row i at d + i * rs) into panel[k * width + i]: an 8 x 8
// transpose of 16-bit values in three rounds of unpacks, rows n .. 7 zero and never stored; `range` (if any)
// takes in the values.
void transpose_bf16_8k(const core::bf16_t* d, int64_t rs, int n, float* panel, int width, Bf16Range* range) {
  __m128i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    __m128i zero = _mm_setzero_si128();
    __m128i x = i < n ? load8(d + i * rs) : zero, y = i + 1 < n ? load8(d + (i + 1) * rs) : zero;
    if (range != nullptr) range->add(x), range->add(y);
    t[i] = _mm_unpacklo_epi16(x, y);      // k 0..3 of rows i, i + 1, interleaved
    t[i + 1] = _mm_unpackhi_epi16(x, y);  // k 4..7
  }
  for (int h = 0; h < 2; ++h)  // rows 0..3, then 4..7
    for (int q = 0; q < 2; ++q) {
      u[4 * h + 2 * q] = _mm_unpacklo_epi32(t[4 * h + q], t[4 * h + 2 + q]);      // k 4q, 4q + 1 of 4 rows
      u[4 * h + 2 * q + 1] = _mm_unpackhi_epi32(t[4 * h + q], t[4 * h + 2 + q]);  // k 4q + 2, 4q + 3
    }
  for (int p = 0; p < 4; ++p) {  // k 2p and 2p + 1 of all 8 rows
    store_bf16(panel + (2 * p) * width, _mm_unpacklo_epi64(u[p], u[4 + p]), n);
    store_bf16(panel + (2 * p + 1) * width, _mm_unpackhi_epi64(u[p], u[4 + p]), n);
  }
}
#endif

// A full bf16 panel (n == width: 6 rows of a, or a multiple of 8 columns of b) stored K-major or MN-major,
// with SSE2 (x86-64's baseline): the same values as the element loop, and, when `range` is asked for, their
// detail::value_range. False when the panel is not one of those.
bool decode_bf16_sse2(const core::bf16_t* d, int64_t rs, int64_t ds, int n, int depth, int width, float* panel,
                      detail::ValueRange* range) {
#if defined(__x86_64__)
  int group = width == 6 ? 6 : 8;  // rows per load: an a panel's 6, or 8 of a b panel's columns
  if (n != width || width % group != 0 || (ds != 1 && rs != 1)) return false;
  Bf16Range seen;
  Bf16Range* track = range != nullptr ? &seen : nullptr;
  if (rs == 1) {  // MN-major: a k's rows are contiguous
    for (int k = 0; k < depth; ++k)
      for (int i = 0; i < n; i += group) {
        __m128i words = load_row(d + k * ds + i, group);  // a 6-row load's last two words are 0
        if (track != nullptr) track->add(words);
        store_bf16(panel + static_cast<int64_t>(k) * width + i, words, group);
      }
  } else {
    int k = 0;
    for (; k + 8 <= depth; k += 8)
      for (int i = 0; i < n; i += group)
        transpose_bf16_8k(d + i * rs + k, rs, group, panel + static_cast<int64_t>(k) * width + i, width, track);
    for (; k < depth; ++k)
      for (int i = 0; i < n; ++i) {
        if (track != nullptr) track->add(d[i * rs + k]);
        panel[static_cast<int64_t>(k) * width + i] = core::bf16_to_float(d[i * rs + k]);
      }
  }
  if (range != nullptr) *range = seen.range();
  return true;
#else
  (void)d, (void)rs, (void)ds, (void)n, (void)depth, (void)width, (void)panel, (void)range;
  return false;
#endif
}

// Rows row0 .. row0 + n - 1 of o over `depth` as the GEMM reads them (core::load_operand_row's
// values), into a [depth][width] panel; with `range`, their value range as `range` finds it.
detail::ValueRange decode_panel(const Operand& o, int row0, int n, int depth, int width, float* panel, RangeFn range) {
  detail::ValueRange seen;
  bool found = false;
  int64_t rs = o.row_stride, ds = o.depth_stride;
  switch (o.dtype) {
    case Dtype::f32: {
      const float* d = static_cast<const float*>(o.data) + row0 * rs;
      fill_panel(n, depth, width, rs, ds, panel, [&](int, int, int64_t at) { return d[at]; });
      break;
    }
    case Dtype::bf16: {
      const core::bf16_t* d = static_cast<const core::bf16_t*>(o.data) + row0 * rs;
      found = range != nullptr && !o.quantize;  // the SSE2 decoder finds the values' range on the way
      if (!decode_bf16_sse2(d, rs, ds, n, depth, width, panel, found ? &seen : nullptr)) {
        found = false;
        fill_panel(n, depth, width, rs, ds, panel, [&](int, int, int64_t at) { return core::bf16_to_float(d[at]); });
      }
      break;
    }
    case Dtype::e4m3: {
      // A row's scale is found in the SM100 layout once per block of 32 values, then multiplies each code's
      // value; blocks of 64 k (two scale blocks) keep the panel lines being written in L1.
      const uint8_t* d = static_cast<const uint8_t*>(o.data) + row0 * rs;
      const Tables& t = tables();
      for (int k0 = 0; k0 < depth; k0 += 64)
        for (int r = 0, k1 = std::min(depth, k0 + 64); r < n; ++r)
          for (int b0 = k0; b0 < k1; b0 += core::kMxBlock) {
            float scale = t.e8m0[core::operand_scale(o, row0 + r, b0 / core::kMxBlock)];
            for (int k = b0, b1 = std::min(k1, b0 + core::kMxBlock); k < b1; ++k)
              panel[static_cast<int64_t>(k) * width + r] = t.e4m3[d[r * rs + k * ds]] * scale;
          }
      for (int k = 0; k < depth; ++k)
        for (int r = n; r < width; ++r) panel[static_cast<int64_t>(k) * width + r] = 0.0f;
      break;
    }
  }
  if (o.quantize)  // the round trip along depth, blocks of 32 from the part's k = 0, on each row (stride width)
    for (int r = 0; r < n; ++r)
      for (int k = 0; k < depth; k += core::kMxBlock)
        detail::mx_round_trip_block(panel + static_cast<int64_t>(k) * width + r, std::min(core::kMxBlock, depth - k),
                                    width);
  if (range == nullptr || found) return seen;
  return range(panel, static_cast<size_t>(depth) * width);
}

detail::ValueRange merge(detail::ValueRange x, detail::ValueRange y) {
  return detail::ValueRange{std::min(x.min_exponent, y.min_exponent), std::max(x.max_exponent, y.max_exponent),
                            x.narrow && y.narrow};
}

// Rows i0 .. i0 + n - 1 of every part's a, as panels of 6 rows, [depth][6] each, parts end to end in k; their
// value range when `range` is given.
detail::ValueRange pack_a(const core::Gemm& g, int i0, int n, int depth, float* packed, RangeFn range) {
  detail::ValueRange seen;
  for (int p = 0; p * kPanelRows < n; ++p) {
    float* panel = packed + static_cast<int64_t>(p) * kPanelRows * depth;
    int rows = std::min(kPanelRows, n - p * kPanelRows);
    for (int q = 0, k0 = 0; q < g.num_parts; k0 += g.parts[q].depth, ++q)
      seen = merge(seen, decode_panel(g.parts[q].a, i0 + p * kPanelRows, rows, g.parts[q].depth, kPanelRows,
                                      panel + k0 * kPanelRows, range));
  }
  return seen;
}

// Columns j0 .. j0 + n - 1 (n <= width) of every part's b as one [depth][width] panel, and its range likewise.
detail::ValueRange pack_b(const core::Gemm& g, int j0, int n, int width, float* panel, RangeFn range) {
  detail::ValueRange seen;
  for (int q = 0, k0 = 0; q < g.num_parts; k0 += g.parts[q].depth, ++q)
    seen = merge(seen, decode_panel(g.parts[q].b, j0, n, g.parts[q].depth, width, panel + k0 * width, range));
  return seen;
}

// Where a 6 x w tile of c (nr x nc of it inside c) keeps its running sums while the kernel walks the depth
// block by block: c itself for a whole tile that accumulates, otherwise `sums` (6 x w, from 0 for a store,
// from c's values for an accumulation), copied into c after the last block.
struct TileSums {
  const core::Gemm& g;
  int i0, nr, j0, nc, w;
  float* sums;

  bool in_place() const { return g.epilogue == core::Epilogue::accumulate_f32 && nr == kPanelRows && nc == w; }
  float* c32() const { return static_cast<float*>(g.c) + i0 * g.c_stride + j0; }
  float* target() const { return in_place() ? c32() : sums; }
  int64_t stride() const { return in_place() ? g.c_stride : w; }

  void start() const {
    if (in_place()) return;
    std::memset(sums, 0, sizeof(float) * kPanelRows * w);
    if (g.epilogue == core::Epilogue::accumulate_f32)
      for (int r = 0; r < nr; ++r)
        for (int j = 0; j < nc; ++j) sums[r * w + j] = c32()[r * g.c_stride + j];
  }

  void finish() const {
    if (in_place()) return;
    if (g.epilogue == core::Epilogue::accumulate_f32) {
      for (int r = 0; r < nr; ++r)
        for (int j = 0; j < nc; ++j) c32()[r * g.c_stride + j] = sums[r * w + j];
      return;
    }
    core::bf16_t* c16 = static_cast<core::bf16_t*>(g.c) + i0 * g.c_stride + j0;
    for (int r = 0; r < nr; ++r)
      for (int j = 0; j < nc; ++j)
        c16[r * g.c_stride + j] = core::float_to_bf16(core::with_bias(g, j0 + j, sums[r * w + j]));
  }
};

Kernel kernel_for(GemmIsa isa) {
#if defined(__x86_64__)
  if (isa == GemmIsa::avx512)
    return {detail::micro_kernel_avx512, detail::micro_kernel_avx512_fused, 32, detail::value_range_avx2};
  if (isa == GemmIsa::avx2)
    return {detail::micro_kernel_avx2, detail::micro_kernel_avx2_fused, 16, detail::value_range_avx2};
#endif
  (void)isa;
  return {detail::micro_kernel_scalar, nullptr, 16, nullptr};
}

[[noreturn]] void misuse(const char* what) {
  std::fprintf(stderr, "mok: host::gemm: %s\n", what);
  std::abort();
}

}  // namespace

size_t gemm_scratch_floats(int rows, int cols, int max_depth) {
  (void)cols;  // b is packed one panel (at most 32 columns, whichever kernel runs) at a time
  size_t row_panels = (static_cast<size_t>(rows) + kPanelRows - 1) / kPanelRows;
  size_t sums = max_depth > kDepthBlock ? row_panels * kPanelRows * kMaxPanelCols : 0;
  return (row_panels * kPanelRows + kMaxPanelCols) * static_cast<size_t>(max_depth) + sums;
}

void gemm(const core::Gemm& g, float* scratch, size_t scratch_floats, GemmIsa isa) {
  if (!gemm_isa_available(isa)) misuse("the ISA path asked for is not available on this CPU");
  if (g.rows <= 0 || g.cols <= 0) return;
  int depth = total_depth(g);
  if (scratch_floats < gemm_scratch_floats(kPanelRows, g.cols, depth))
    misuse("scratch smaller than gemm_scratch_floats(6, cols, depth)");
  Kernel kernel = kernel_for(isa);
  // The b panel first, then as many a panels as the scratch holds (all of them when sized for the tile),
  // each with room for its tile's running sums when the depth takes more than one block.
  bool blocked = depth > kDepthBlock;
  size_t b_floats = static_cast<size_t>(kMaxPanelCols) * depth;
  size_t panel_floats = static_cast<size_t>(kPanelRows) * depth + (blocked ? kPanelRows * kMaxPanelCols : 0);
  int chunk = g.rows;
  if (depth > 0)
    chunk = static_cast<int>(
        std::min<size_t>(static_cast<size_t>(g.rows), (scratch_floats - b_floats) / panel_floats * kPanelRows));
  float *b = scratch, *a = scratch + b_floats;
  float* sums = a + static_cast<size_t>(chunk + kPanelRows - 1) / kPanelRows * kPanelRows * depth;
  alignas(64) float tile[kPanelRows * kMaxPanelCols];
  for (int i0 = 0; i0 < g.rows; i0 += chunk) {
    int rows = std::min(chunk, g.rows - i0), panels = (rows + kPanelRows - 1) / kPanelRows;
    RangeFn range = kernel.fused ? kernel.range : nullptr;  // a path without FMA needs no range
    detail::ValueRange a_range = pack_a(g, i0, rows, depth, a, range);
    for (int j0 = 0; j0 < g.cols; j0 += kernel.cols) {
      int cols = std::min(kernel.cols, g.cols - j0);
      detail::ValueRange b_range = pack_b(g, j0, cols, kernel.cols, b, range);
      bool exact = kernel.fused && detail::products_exact(a_range, b_range);
      KernelFn run = exact ? kernel.fused : kernel.run;
      // Block by block of depth, every a panel over the b panel's block while it is in L1; each element's
      // sum still runs k = 0, 1, ... (a block continues from the sums the last one left).
      for (int k0 = 0; k0 == 0 || k0 < depth; k0 += kDepthBlock) {
        int block = std::min(kDepthBlock, depth - k0);
        for (int p = 0; p < panels; ++p) {
          TileSums t{g,    i0 + p * kPanelRows, std::min(kPanelRows, rows - p * kPanelRows),           j0,
                     cols, kernel.cols,         blocked ? sums + p * kPanelRows * kMaxPanelCols : tile};
          if (k0 == 0) t.start();
          run(block, a + (static_cast<int64_t>(p) * depth + k0) * kPanelRows,
              b + static_cast<int64_t>(k0) * kernel.cols, t.target(), t.stride());
          if (k0 + block >= depth) t.finish();
        }
      }
    }
  }
}

void gemm(const core::Gemm& g, float* scratch, size_t scratch_floats) {
  gemm(g, scratch, scratch_floats, gemm_isa());
}

bool gemm_isa_available(GemmIsa isa) {
  if (isa == GemmIsa::scalar) return true;
#if defined(__x86_64__)
  __builtin_cpu_init();  // idempotent; needed when the first call comes from another object's constructor
  if (isa == GemmIsa::avx512) return __builtin_cpu_supports("avx512f");
  return isa == GemmIsa::avx2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

GemmIsa gemm_isa() {
  static const GemmIsa chosen = [] {
    const char* forced = std::getenv("MOK_HOST_ISA");
    for (GemmIsa isa : {GemmIsa::scalar, GemmIsa::avx2, GemmIsa::avx512})
      if (forced != nullptr && std::strcmp(forced, gemm_isa_name(isa)) == 0 && gemm_isa_available(isa)) return isa;
    for (GemmIsa isa : {GemmIsa::avx512, GemmIsa::avx2})
      if (gemm_isa_available(isa)) return isa;
    return GemmIsa::scalar;
  }();
  return chosen;
}

const char* gemm_isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::avx512: return "avx512";
    case GemmIsa::avx2: return "avx2";
    case GemmIsa::scalar: break;
  }
  return "scalar";
}

namespace detail {

#if defined(__x86_64__)
ValueRange value_range_bf16(const core::bf16_t* v, size_t n) {
  Bf16Range seen;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) seen.add(load8(v + i));
  for (; i < n; ++i) seen.add(v[i]);
  return seen.range();
}
#endif

ValueRange value_range(const float* v, size_t n) {
  // Branch-free over the bits so the compiler vectorises it: zeros leave the minimum alone; a subnormal
  // (exponent 0, nonzero), an Inf or NaN (255) or a value with low mantissa bits clears `narrow`.
  uint32_t min_exponent = 255, max_exponent = 0, wide = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = core::float_bits(v[i]) & 0x7fffffffu, exponent = bits >> 23;
    uint32_t zero = bits == 0;
    min_exponent = std::min(min_exponent, zero ? 255u : exponent);
    max_exponent = std::max(max_exponent, exponent);
    wide |= (bits & 0xffffu) | static_cast<uint32_t>(!zero && (exponent == 0 || exponent == 255));
  }
  return ValueRange{static_cast<int>(min_exponent), static_cast<int>(max_exponent), wide == 0};
}

bool products_exact(ValueRange a, ValueRange b) {
  // Nonzero x, y with at most 8 significant bits and biased exponents ex, ey: 2^(ex+ey-254) <= |x·y| <
  // 2^(ex+ey-252), with at most 16 significant bits. It is normal when ex+ey-254 >= -126 and finite (below
  // 2^128, where 16 bits always fit under fp32's largest value) when ex+ey-252 <= 128.
  return a.narrow && b.narrow && a.min_exponent + b.min_exponent >= 128 && a.max_exponent + b.max_exponent <= 380;
}

void mx_round_trip_block(float* v, int n, int stride) {
  float amax = core::mx_block_amax(v, n, stride);
  if (amax != amax) {
    for (int i = 0; i < n; ++i) v[i * stride] = core::quiet_nan();
    return;
  }
  int e = core::mx_scale_exponent(amax);
  // ldexpf(x, ±e) is the correctly rounded x · 2^±e: one multiplication by the exact power of two
  float down = power_of_two(-e), up = power_of_two(e);
  for (int i = 0; i < n; ++i) {
    float scaled = fminf(fmaxf(v[i * stride] * down, -core::kE4m3Max), core::kE4m3Max);
    v[i * stride] = e4m3_nearest(scaled) * up;
  }
}

// Four floats as one value: GCC and clang lower it to SSE2 on x86-64, NEON on arm64, scalars elsewhere;
// its * and + are the same IEEE operations per lane (-ffp-contract=off keeps them apart).
typedef float Vec4 __attribute__((vector_size(16)));

static Vec4 load4(const float* p) {
  Vec4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

static void store4(float* p, Vec4 v) {
  std::memcpy(p, &v, sizeof(v));
}

// Two halves of 8 columns: a half's 6 x 8 sums are 12 vectors, which fit in SSE2's 16 registers.
void micro_kernel_scalar(int depth, const float* a, const float* b, float* c, int64_t ldc) {
  constexpr int kCols = 16;
  for (int j0 = 0; j0 < kCols; j0 += 8) {
    Vec4 acc[kPanelRows][2];
#pragma GCC unroll 6
    for (int r = 0; r < kPanelRows; ++r) {
      acc[r][0] = load4(c + r * ldc + j0);
      acc[r][1] = load4(c + r * ldc + j0 + 4);
    }
    for (int k = 0; k < depth; ++k) {
      Vec4 b0 = load4(b + k * kCols + j0), b1 = load4(b + k * kCols + j0 + 4);
#pragma GCC unroll 6
      for (int r = 0; r < kPanelRows; ++r) {
        float x = a[k * kPanelRows + r];
        Vec4 xs = {x, x, x, x};
        Vec4 p0 = xs * b0, p1 = xs * b1;
        acc[r][0] = acc[r][0] + p0;
        acc[r][1] = acc[r][1] + p1;
      }
    }
#pragma GCC unroll 6
    for (int r = 0; r < kPanelRows; ++r) {
      store4(c + r * ldc + j0, acc[r][0]);
      store4(c + r * ldc + j0 + 4, acc[r][1]);
    }
  }
}

}  // namespace detail

}  // namespace mok::host
