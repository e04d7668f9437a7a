// host::gemm fuses a product into its add (one FMA) only where every product of the two panels is exact
// (detail::products_exact), so the fused kernels keep core::reference_gemm's bits. These tests hold the rule
// itself against brute force on bf16 values at the ends of fp32's range, and run tiles built so that an FMA
// changes the result (a product that overflows on its own but not inside its sum; a product that rounds to
// fp32's subnormal grid, then rounds again in a sum) through every path: a rule that lets either fuse fails.
#include <cmath>
#include <limits>

#include "check.hpp"
#include "core/gemm.hpp"
#include "host/gemm.hpp"

using namespace mok_test;
using mok::core::bf16_t;
using mok::host::GemmIsa;
using mok::host::detail::products_exact;
using mok::host::detail::value_range;
using mok::host::detail::ValueRange;

namespace {

float bf16_value(uint16_t bits) {
  return mok::core::bf16_to_float(bits);
}

// A bf16 value with the given biased exponent and 7-bit mantissa.
uint16_t bf16_bits(bool negative, int exponent, int mantissa) {
  return static_cast<uint16_t>((negative ? 0x8000 : 0) | (exponent << 7) | mantissa);
}

float round_then_add(float c, float x, float y) {
  volatile float product = x * y;  // rounded on its own
  return c + product;
}

std::vector<GemmIsa> isas() {
  std::vector<GemmIsa> all;
  for (GemmIsa isa : {GemmIsa::scalar, GemmIsa::avx2, GemmIsa::avx512})
    if (mok::host::gemm_isa_available(isa)) all.push_back(isa);
  return all;
}

// c (rows x cols, fp32, accumulated from 0) = a · bᵀ for K-major bf16 a [rows, depth], b [cols, depth].
std::vector<uint32_t> product_bits(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b, int rows, int cols,
                                   int depth, bool reference, GemmIsa isa) {
  std::vector<float> c(static_cast<size_t>(rows) * cols, 0.0f);
  mok::core::Gemm g{};
  g.rows = rows;
  g.cols = cols;
  g.num_parts = 1;
  g.parts[0] = {mok::core::bf16_operand(a.data(), depth, 1, false), mok::core::bf16_operand(b.data(), depth, 1, false),
                depth};
  g.c = c.data();
  g.c_stride = cols;
  g.epilogue = mok::core::Epilogue::accumulate_f32;
  if (reference) {
    std::vector<float> scratch(mok::core::gemm_scratch_floats(rows, cols, depth, false));
    mok::core::reference_gemm(g, scratch.data());
  } else {
    std::vector<float> scratch(mok::host::gemm_scratch_floats(rows, cols, depth));
    mok::host::gemm(g, scratch.data(), scratch.size(), isa);
  }
  std::vector<uint32_t> bits;
  for (float v : c) bits.push_back(mok::core::float_bits(v));
  return bits;
}

// Rows and columns of two-term sums x0·y0 + x1·y1 where fusing the second product changes the result.
struct Trap {
  const char* name;
  uint16_t x0, y0, x1, y1;
};

}  // namespace

TEST(value_range_reads_exponents_and_narrowness) {
  float values[] = {0.0f, -0.0f, 1.0f, -3.5f, std::ldexp(1.0f, -60)};
  ValueRange r = value_range(values, 5);
  CHECK(r.narrow && r.min_exponent == 127 - 60 && r.max_exponent == 128);
  ValueRange zeros = value_range(values, 2);
  CHECK(zeros.narrow && zeros.min_exponent == 255 && zeros.max_exponent == 0);
  float wide[] = {1.0f + std::ldexp(1.0f, -20)};  // a bit below bf16's mantissa
  CHECK(!value_range(wide, 1).narrow);
  float subnormal[] = {std::ldexp(1.0f, -130)};
  CHECK(!value_range(subnormal, 1).narrow);
  float specials[] = {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  CHECK(!value_range(specials, 1).narrow && !value_range(specials + 1, 1).narrow);
}

// The AVX2 scan gives the portable scan's range on random runs of every kind of value, at every length.
TEST(value_range_avx2_is_the_portable_scan) {
#if defined(__x86_64__)
  if (!mok::host::gemm_isa_available(GemmIsa::avx2)) return;
  std::mt19937_64 rng(seed() + 7);
  float kinds[] = {0.0f,
                   -0.0f,
                   1.5f,
                   std::ldexp(1.0f, -126),
                   std::ldexp(1.0f, -140),
                   1.0f + std::ldexp(1.0f, -23),
                   std::numeric_limits<float>::infinity(),
                   std::numeric_limits<float>::quiet_NaN(),
                   -3e38f};
  for (int n = 0; n < 20000; ++n) {
    std::vector<float> v(rng() % 40);
    for (float& x : v)
      x = rng() % 4 ? bf16_value(bf16_bits(rng() % 2, 1 + static_cast<int>(rng() % 254), static_cast<int>(rng() % 128)))
                    : kinds[rng() % 9];
    ValueRange want = value_range(v.data(), v.size()), got = mok::host::detail::value_range_avx2(v.data(), v.size());
    if (got.min_exponent != want.min_exponent || got.max_exponent != want.max_exponent || got.narrow != want.narrow) {
      CHECK_MSG(false, "%zu values: avx2 (%d, %d, %d), portable (%d, %d, %d)", v.size(), got.min_exponent,
                got.max_exponent, got.narrow, want.min_exponent, want.max_exponent, want.narrow);
      return;
    }
  }
#endif
}

// The range the SSE2 bf16 decoder finds on the way is the portable scan's of the decoded values, on random runs
// of every kind of bf16 word (subnormals, Inf and NaN among them), at every length.
TEST(value_range_bf16_is_the_portable_scan) {
#if defined(__x86_64__)
  std::mt19937_64 rng(seed() + 8);
  const uint16_t kinds[] = {0x0000, 0x8000, 0x3fc0, 0x0080, 0x0001, 0x807f, 0x7f80, 0xff80, 0x7fc1, 0x7f7f};
  for (int n = 0; n < 20000; ++n) {
    std::vector<bf16_t> words(rng() % 40);
    std::vector<float> values;
    for (bf16_t& w : words) {
      w = rng() % 4 ? bf16_bits(rng() % 2, 1 + static_cast<int>(rng() % 254), static_cast<int>(rng() % 128))
                    : kinds[rng() % 10];
      values.push_back(bf16_value(w));
    }
    ValueRange want = value_range(values.data(), values.size());
    ValueRange got = mok::host::detail::value_range_bf16(words.data(), words.size());
    if (got.min_exponent != want.min_exponent || got.max_exponent != want.max_exponent || got.narrow != want.narrow) {
      CHECK_MSG(false, "%zu words: bf16 (%d, %d, %d), portable (%d, %d, %d)", words.size(), got.min_exponent,
                got.max_exponent, got.narrow, want.min_exponent, want.max_exponent, want.narrow);
      return;
    }
  }
#endif
}

// Every pair of bf16 values the rule accepts gives fma == round-then-add on random sums; at the ends of the
// range the rule refuses (exponent sums of 127 and 381 are where products stop being normal and finite).
TEST(products_exact_holds_against_brute_force) {
  std::mt19937_64 rng(seed());
  CHECK(products_exact({64, 64, true}, {64, 64, true}));
  CHECK(!products_exact({63, 63, true}, {64, 64, true}));
  CHECK(products_exact({190, 190, true}, {190, 190, true}));
  CHECK(!products_exact({190, 190, true}, {191, 191, true}));
  CHECK(!products_exact({127, 127, false}, {127, 127, true}));
  int accepted = 0;
  for (int n = 0; n < 400000; ++n) {
    // exponents clustered at both ends of the accepted sums, and anywhere
    int ex = 1 + static_cast<int>(rng() % 254), ey = 1 + static_cast<int>(rng() % 254);
    if (n % 3 == 0) ey = std::clamp(128 - ex + static_cast<int>(rng() % 5) - 2, 1, 254);
    if (n % 3 == 1) ey = std::clamp(380 - ex + static_cast<int>(rng() % 5) - 2, 1, 254);
    float x = bf16_value(bf16_bits(rng() % 2, ex, static_cast<int>(rng() % 128)));
    float y = bf16_value(bf16_bits(rng() % 2, ey, static_cast<int>(rng() % 128)));
    if (!products_exact(value_range(&x, 1), value_range(&y, 1))) continue;
    ++accepted;
    // sums near the product's size (where a double rounding shows) and far from it
    float p = static_cast<float>(static_cast<double>(x) * y);
    float c = std::ldexp(static_cast<float>(rng() % 2000) / 1000.0f - 1.0f,
                         std::ilogb(p == 0 ? 1.0f : p) + static_cast<int>(rng() % 60) - 30);
    float fused = std::fma(x, y, c), split = round_then_add(c, x, y);
    if (mok::core::float_bits(fused) != mok::core::float_bits(split)) {
      CHECK_MSG(false, "fma(%a, %a, %a) = %a, round then add = %a", static_cast<double>(x), static_cast<double>(y),
                static_cast<double>(c), static_cast<double>(fused), static_cast<double>(split));
      return;
    }
  }
  CHECK_MSG(accepted > 100000, "only %d pairs accepted", accepted);
}

// Tiles where fusing changes bits, on every path: each must still match the reference, which a fused kernel
// run on them does not (checked too, so the tiles stay traps).
TEST(fused_kernels_run_only_where_products_are_exact) {
  Trap traps[] = {
      // -1.8984375·2^127 + 1.1015625·2^128: the second product alone overflows to inf, the fused sum is finite
      {"overflow", bf16_bits(true, 190, 115), bf16_bits(false, 191, 0), bf16_bits(false, 191, 13),
       bf16_bits(false, 191, 0)},
      // 2^-125 + 1.4973·2^-149: the product rounds up to 2^-149, a tie the sum breaks to even (2^-125); fused,
      // the exact sum rounds up to 2^-125 + 2^-148
      {"subnormal product", bf16_bits(false, 65, 0), bf16_bits(false, 64, 0), bf16_bits(false, 52, 93),
       bf16_bits(false, 52, 94)},
  };
  int rows = 13, cols = 70, depth = 2;  // edge panels in both directions, on every path's widths
  for (const Trap& trap : traps) {
    std::vector<bf16_t> a(static_cast<size_t>(rows) * depth), b(static_cast<size_t>(cols) * depth);
    for (int i = 0; i < rows; ++i) a[i * depth] = trap.x0, a[i * depth + 1] = trap.x1;
    for (int j = 0; j < cols; ++j) b[j * depth] = trap.y0, b[j * depth + 1] = trap.y1;
    std::vector<uint32_t> want = product_bits(a, b, rows, cols, depth, true, GemmIsa::scalar);
    float fused = std::fma(bf16_value(trap.x1), bf16_value(trap.y1), bf16_value(trap.x0) * bf16_value(trap.y0));
    CHECK_MSG(mok::core::float_bits(fused) != want[0], "%s: an FMA gives the reference's bits; not a trap", trap.name);
    for (GemmIsa isa : isas()) {
      std::vector<uint32_t> got = product_bits(a, b, rows, cols, depth, false, isa);
      for (size_t e = 0; e < got.size(); ++e)
        if (got[e] != want[e]) {
          CHECK_MSG(false, "%s, %s: element %zu got %#x want %#x", trap.name, gemm_isa_name(isa), e, got[e], want[e]);
          break;
        }
    }
  }
}

MOK_TEST_MAIN
