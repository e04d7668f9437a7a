// host::gemm against core::reference_gemm, bit for bit, on every path this CPU has (scalar, AVX2, AVX-512), and
// core::gemm_element (an element at a time, in any order):
// random tiles over every operand encoding (f32, bf16, e4m3), orientation (K-major, MN-major, padded
// strides), MXFP8 round trip on read, one or two parts, both epilogues and odd sizes. Values span 2^±40
// (2^±20 per row times 2^±20 per depth index) and cancel in pairs, so a product fused into its add, a
// k order changed anywhere or a misplaced edge changes bits; some operands hold NaN or ±Inf. Guards
// after the scratch and c catch writes past their ends. CTest runs it with MOK_HOST_ISA unset, =scalar and =avx2.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>

#include "check.hpp"
#include "core/gemm.hpp"
#include "core/gemm_element.hpp"
#include "host/gemm.hpp"

using namespace mok_test;
using mok::core::Dtype;
using mok::host::GemmIsa;

namespace {

constexpr uint32_t kGuard = 0x3fa5a5a5u;  // bits no path writes there (not a NaN: compared exactly)
constexpr int kGuardFloats = 37;

struct Spec {
  Dtype dtype;
  bool mn_major;  // row_stride 1, depth_stride >= rows; otherwise depth_stride 1, row_stride >= depth
  bool quantize;
  bool special;  // one NaN or ±Inf somewhere
};

// An operand's bytes and its descriptor (kept in a deque: the descriptor points into the vectors).
struct Stored {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> codes, scales;
  mok::core::Operand op{};
};

float special_value(std::mt19937_64& rng) {
  const float inf = std::numeric_limits<float>::infinity();
  float values[] = {std::numeric_limits<float>::quiet_NaN(), inf, -inf};
  return values[rng() % 3];
}

// Values with a per-row and a per-depth-index power-of-two scale, and pairs (k - 1, k) whose products
// cancel: a repeats its value, b negates it.
std::vector<float> wide_values(int rows, int depth, bool negate_pairs, const std::vector<int>& pair,
                               std::mt19937_64& rng) {
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<int> row_exp(rows), k_exp(depth);
  for (int& e : row_exp) e = exponent(rng);
  for (int& e : k_exp) e = exponent(rng);
  std::vector<float> v(static_cast<size_t>(rows) * depth);
  for (int i = 0; i < rows; ++i)
    for (int k = 0; k < depth; ++k) {
      float& x = v[static_cast<size_t>(i) * depth + k];
      if (k > 0 && pair[k])
        x = negate_pairs ? -v[static_cast<size_t>(i) * depth + k - 1] : v[static_cast<size_t>(i) * depth + k - 1];
      else
        x = std::ldexp(mantissa(rng), row_exp[i] + k_exp[k]);
    }
  return v;
}

void make_operand(Stored& s, const Spec& spec, int rows, int depth, const std::vector<float>& values,
                  std::mt19937_64& rng) {
  int pad = static_cast<int>(rng() % 3);
  int64_t row_stride = spec.mn_major ? 1 : depth + pad;
  int64_t depth_stride = spec.mn_major ? rows + pad : 1;
  size_t size = static_cast<size_t>((rows - 1) * row_stride + (depth - 1) * depth_stride + 1);
  auto at = [&](int i, int k) { return static_cast<size_t>(i * row_stride + k * depth_stride); };
  int special_i = static_cast<int>(rng() % rows), special_k = static_cast<int>(rng() % depth);
  switch (spec.dtype) {
    case Dtype::f32:
      s.f32.assign(size, 0.0f);
      for (int i = 0; i < rows; ++i)
        for (int k = 0; k < depth; ++k) s.f32[at(i, k)] = values[static_cast<size_t>(i) * depth + k];
      if (spec.special) s.f32[at(special_i, special_k)] = special_value(rng);
      s.op = {s.f32.data(), Dtype::f32, row_stride, depth_stride, nullptr, {0, 0}, 0, spec.quantize};
      break;
    case Dtype::bf16:
      s.bf16.assign(size, 0);
      for (int i = 0; i < rows; ++i)
        for (int k = 0; k < depth; ++k)
          s.bf16[at(i, k)] = mok::core::float_to_bf16(values[static_cast<size_t>(i) * depth + k]);
      if (spec.special) s.bf16[at(special_i, special_k)] = mok::core::float_to_bf16(special_value(rng));
      s.op = mok::core::bf16_operand(s.bf16.data(), row_stride, depth_stride, spec.quantize);
      break;
    case Dtype::e4m3: {
      // Codes of the values' sign and random magnitude (every code but NaN); scales 2^±20 per block, in the
      // SM100 layout of a matrix whose rows first_row .. first_row + rows - 1 are the operand (first_row up to
      // 200: the operand may start inside a 128-row scale tile or in the second one).
      int first_row = rng() % 2 ? static_cast<int>(rng() % 201) : 0;
      mok::core::MxScaleLayout layout = mok::core::MxScaleLayout::of(first_row + rows, depth);
      s.codes.assign(size, 0);
      s.scales.resize(static_cast<size_t>(layout.matrix_bytes()));
      for (uint8_t& e : s.scales) e = static_cast<uint8_t>(107 + rng() % 41);
      for (int i = 0; i < rows; ++i)
        for (int k = 0; k < depth; ++k) {
          uint8_t sign = std::signbit(values[static_cast<size_t>(i) * depth + k]) ? 0x80 : 0;
          s.codes[at(i, k)] = sign | static_cast<uint8_t>(rng() % 0x7f);
        }
      if (spec.special) {
        if (rng() % 2)
          s.codes[at(special_i, special_k)] |= 0x7f;  // e4m3fn's NaN
        else
          s.scales[layout.offset(first_row + special_i, special_k / mok::core::kMxBlock)] = mok::core::kE8m0Nan;
      }
      s.op = {s.codes.data(), Dtype::e4m3, row_stride, depth_stride, s.scales.data(), layout, first_row, spec.quantize};
      break;
    }
  }
}

Spec random_spec(std::mt19937_64& rng) {
  Spec s;
  s.dtype = static_cast<Dtype>(rng() % 3);
  s.mn_major = rng() % 2;
  s.quantize = s.dtype != Dtype::e4m3 && rng() % 2;  // the round trip applies to f32 / bf16 operands
  s.special = rng() % 6 == 0;
  return s;
}

int random_size(std::mt19937_64& rng, int small, int large) {
  return 1 + static_cast<int>(rng() % (rng() % 4 == 0 ? large : small));
}

int random_depth(std::mt19937_64& rng) {
  const int edges[] = {1, 2, 31, 32, 33, 63, 64, 65, 96, 97};
  if (rng() % 3 == 0) return edges[rng() % 10];
  return random_size(rng, 40, 140);
}

bool same_float(uint32_t x, uint32_t y) {
  float fx = mok::core::bits_float(x), fy = mok::core::bits_float(y);
  return x == y || (fx != fx && fy != fy);
}

bool same_bf16(uint16_t x, uint16_t y) {
  return same_float(static_cast<uint32_t>(x) << 16, static_cast<uint32_t>(y) << 16);
}

// One random GEMM with its operands' bytes and c's initial words.
struct Tile {
  mok::core::Gemm g{};
  std::deque<Stored> operands;
  std::vector<uint32_t> c0;  // c's initial bits (fp32, or bf16 in the low half-words), guards after it
  size_t c_words = 0;
  int depth = 0;
  std::string text;
};

void make_case(Tile& t, std::mt19937_64& rng) {
  mok::core::Gemm& g = t.g;
  g.rows = random_size(rng, 20, 70);
  g.cols = random_size(rng, 40, 70);
  g.num_parts = 1 + static_cast<int>(rng() % 2);
  g.epilogue = rng() % 2 ? mok::core::Epilogue::store_bf16 : mok::core::Epilogue::accumulate_f32;
  g.c_stride = g.cols + static_cast<int>(rng() % 3);
  char buf[160];
  std::snprintf(buf, sizeof(buf), "rows %d cols %d c_stride %lld %s", g.rows, g.cols,
                static_cast<long long>(g.c_stride),
                g.epilogue == mok::core::Epilogue::store_bf16 ? "store_bf16" : "accumulate_f32");
  t.text = buf;
  const char* names[] = {"f32", "bf16", "e4m3"};
  for (int p = 0; p < g.num_parts; ++p) {
    int depth = rng() % 40 == 0 ? 0 : random_depth(rng);
    Spec sa = random_spec(rng), sb = random_spec(rng);
    std::vector<int> pair(depth + 1);
    for (int& x : pair) x = rng() % 4 == 0;
    auto av = wide_values(g.rows, std::max(depth, 1), false, pair, rng);
    auto bv = wide_values(g.cols, std::max(depth, 1), true, pair, rng);
    t.operands.emplace_back();
    make_operand(t.operands.back(), sa, g.rows, std::max(depth, 1), av, rng);
    g.parts[p].a = t.operands.back().op;
    t.operands.emplace_back();
    make_operand(t.operands.back(), sb, g.cols, std::max(depth, 1), bv, rng);
    g.parts[p].b = t.operands.back().op;
    g.parts[p].depth = depth;
    t.depth += depth;
    std::snprintf(buf, sizeof(buf), "; part %d depth %d a %s%s%s%s b %s%s%s%s", p, depth, names[int(sa.dtype)],
                  sa.mn_major ? " mn" : " k", sa.quantize ? " quantize" : "", sa.special ? " special" : "",
                  names[int(sb.dtype)], sb.mn_major ? " mn" : " k", sb.quantize ? " quantize" : "",
                  sb.special ? " special" : "");
    t.text += buf;
  }
  // c: random fp32 (with a NaN or Inf now and then) when accumulating; junk bits that must survive
  // in the stride padding either way.
  t.c_words = static_cast<size_t>(g.rows) * g.c_stride;
  t.c0.resize(t.c_words + kGuardFloats, kGuard);
  std::uniform_real_distribution<float> start(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  for (size_t e = 0; e < t.c_words; ++e) {
    float v = std::ldexp(start(rng), exponent(rng));
    if (rng() % 500 == 0) v = special_value(rng);
    t.c0[e] = mok::core::float_bits(v);
  }
}

// c's words after `compute` ran on the tile with a copy of its c (store_bf16 writes 16-bit elements: c as bf16 has the
// same element count, in half the words); empty when `compute` says it failed.
template <class Compute>
std::vector<uint32_t> computed(const Tile& t, Compute compute) {
  std::vector<uint32_t> c = t.c0;
  mok::core::Gemm g = t.g;
  g.c = c.data();
  bool store = g.epilogue == mok::core::Epilogue::store_bf16;
  std::vector<uint16_t> c16;
  if (store) {
    c16.resize(c.size());
    for (size_t e = 0; e < c.size(); ++e) c16[e] = static_cast<uint16_t>(c[e]);
    g.c = c16.data();
  }
  if (!compute(g)) return {};
  if (store)
    for (size_t e = 0; e < c.size(); ++e) c[e] = c16[e];
  return c;
}

// c's words as the path leaves them, or empty after reporting a guard overwritten.
std::vector<uint32_t> run(const Tile& t, bool reference, GemmIsa isa, bool default_path, size_t scratch_rows) {
  return computed(t, [&](const mok::core::Gemm& g) {
    if (reference) {
      bool store = g.epilogue == mok::core::Epilogue::store_bf16;
      int depth = g.parts[0].depth + (g.num_parts > 1 ? g.parts[1].depth : 0);
      std::vector<float> scratch(mok::core::gemm_scratch_floats(g.rows, g.cols, depth, store) + 1);
      mok::core::reference_gemm(g, scratch.data());
      return true;
    }
    size_t need = mok::host::gemm_scratch_floats(static_cast<int>(scratch_rows), g.cols, t.depth);
    std::vector<uint32_t> scratch(need + kGuardFloats, kGuard);
    float* s = reinterpret_cast<float*>(scratch.data());
    if (default_path)
      mok::host::gemm(g, s, need);
    else
      mok::host::gemm(g, s, need, isa);
    for (size_t e = need; e < scratch.size(); ++e)
      if (scratch[e] != kGuard) {
        CHECK_MSG(false, "%s: scratch written past gemm_scratch_floats (word %zu of %zu): %s", gemm_isa_name(isa), e,
                  need, t.text.c_str());
        return false;
      }
    return true;
  });
}

// Every element of the tile by core::gemm_element, in a shuffled order (as a CTA's threads share a tile).
std::vector<uint32_t> run_elements(const Tile& t, std::mt19937_64& rng) {
  std::vector<std::pair<int, int>> order;
  for (int i = 0; i < t.g.rows; ++i)
    for (int j = 0; j < t.g.cols; ++j) order.emplace_back(i, j);
  std::shuffle(order.begin(), order.end(), rng);
  return computed(t, [&](const mok::core::Gemm& g) {
    for (auto [i, j] : order) mok::core::gemm_element(g, i, j);
    return true;
  });
}

// got against want word by word (the guards after c and the stride's padding included); false after reporting the
// first difference.
bool agrees(const Tile& t, const std::vector<uint32_t>& got, const std::vector<uint32_t>& want, const char* path) {
  bool store = t.g.epilogue == mok::core::Epilogue::store_bf16;
  for (size_t e = 0; e < got.size(); ++e) {
    bool same =
        store ? same_bf16(static_cast<uint16_t>(got[e]), static_cast<uint16_t>(want[e])) : same_float(got[e], want[e]);
    if (!same) {
      CHECK_MSG(false, "%s: element %zu (row %lld col %lld): got %#x want %#x; %s", path, e,
                static_cast<long long>(e / t.g.c_stride), static_cast<long long>(e % t.g.c_stride), got[e], want[e],
                t.text.c_str());
      return false;
    }
  }
  return true;
}

std::vector<GemmIsa> isas() {
  std::vector<GemmIsa> all;
  for (GemmIsa isa : {GemmIsa::scalar, GemmIsa::avx2, GemmIsa::avx512})
    if (mok::host::gemm_isa_available(isa)) all.push_back(isa);
  return all;
}

// Every path against the reference on one case; false after reporting the first difference.
bool check_case(const Tile& t, std::mt19937_64& rng) {
  std::vector<uint32_t> want = run(t, true, GemmIsa::scalar, false, 0);
  // The full scratch, or now and then one too small for all of a's rows (a packed in chunks).
  size_t rows = rng() % 4 == 0 ? 6 * (1 + rng() % 2) : static_cast<size_t>(t.g.rows);
  for (int path = 0; path <= static_cast<int>(isas().size()); ++path) {
    bool default_path = path == static_cast<int>(isas().size());
    GemmIsa isa = default_path ? mok::host::gemm_isa() : isas()[path];
    std::vector<uint32_t> got = run(t, false, isa, default_path, rows);
    if (got.empty()) return false;
    char name[96];
    std::snprintf(name, sizeof(name), "%s%s, scratch for %zu rows", gemm_isa_name(isa),
                  default_path ? " (default)" : "", rows);
    if (!agrees(t, got, want, name)) return false;
  }
  return true;
}

}  // namespace

TEST(host_gemm_is_bitwise_the_reference) {
  std::mt19937_64 rng(seed());
  std::printf("  paths:");
  for (GemmIsa isa : isas()) std::printf(" %s", gemm_isa_name(isa));
  std::printf("; default %s\n", gemm_isa_name(mok::host::gemm_isa()));
  for (int n = 0; n < 1500; ++n) {
    Tile t;
    make_case(t, rng);
    if (!check_case(t, rng)) return;
  }
}

// core::gemm_element, the fused executor's CUDA-core tile (an element per thread, no scratch), against the reference
// bit for bit on the same random tiles, those that quantise on read included (a block's round trip per element).
TEST(gemm_elements_are_bitwise_the_reference) {
  std::mt19937_64 rng(seed() + 3);
  int quantised = 0;
  for (int n = 0; n < 1500; ++n) {
    Tile t;
    make_case(t, rng);
    bool quantises = false;
    for (int p = 0; p < t.g.num_parts; ++p) quantises |= t.g.parts[p].a.quantize || t.g.parts[p].b.quantize;
    if (!agrees(t, run_elements(t, rng), run(t, true, GemmIsa::scalar, false, 0), "gemm_element")) return;
    quantised += quantises;
  }
  CHECK_MSG(quantised > 100, "only %d of 1500 cases quantise on read", quantised);
}

// Real tile heights and depths: many row panels, several chunks of the scratch, deep sums.
TEST(host_gemm_is_bitwise_the_reference_on_layer_tiles) {
  std::mt19937_64 rng(seed() + 1);
  for (int n = 0; n < 12; ++n) {
    Tile t;
    make_case(t, rng);
    // regrow the tile: same specs at layer scale
    mok::core::Gemm& g = t.g;
    int rows = 64 + static_cast<int>(rng() % 80), cols = 33 + static_cast<int>(rng() % 64);
    int depth = 200 + static_cast<int>(rng() % 400);
    Tile big;
    big.g = g;
    big.g.rows = rows;
    big.g.cols = cols;
    big.g.c_stride = cols;
    big.text = "layer tile " + std::to_string(rows) + "x" + std::to_string(cols);
    for (int p = 0; p < g.num_parts; ++p) {
      std::vector<int> pair(depth + 1);
      for (int& x : pair) x = rng() % 4 == 0;
      Spec sa{g.parts[p].a.dtype, g.parts[p].a.row_stride == 1, g.parts[p].a.quantize, rng() % 4 == 0};
      Spec sb{g.parts[p].b.dtype, g.parts[p].b.row_stride == 1, g.parts[p].b.quantize, false};
      big.operands.emplace_back();
      make_operand(big.operands.back(), sa, rows, depth, wide_values(rows, depth, false, pair, rng), rng);
      big.g.parts[p].a = big.operands.back().op;
      big.operands.emplace_back();
      make_operand(big.operands.back(), sb, cols, depth, wide_values(cols, depth, true, pair, rng), rng);
      big.g.parts[p].b = big.operands.back().op;
      big.g.parts[p].depth = depth;
      big.depth += depth;
      big.text += std::string("; part ") + std::to_string(p) + " depth " + std::to_string(depth);
    }
    big.c_words = static_cast<size_t>(rows) * cols;
    big.c0.assign(big.c_words + kGuardFloats, kGuard);
    for (size_t e = 0; e < big.c_words; ++e) big.c0[e] = mok::core::float_bits(std::ldexp(1.0f, -(int)(e % 40)));
    if (!check_case(big, rng)) return;
  }
}

// host's MXFP8 round trip against core's, bit for bit: blocks whose values sit on e4m3 values and on the
// midpoints between them (the ties), around the subnormal/normal boundary, at the saturation edge, over the
// whole float range (subnormal floats, FLT_MAX) and with signed zeros, NaN and Inf.
TEST(host_mx_round_trip_is_cores) {
  std::mt19937_64 rng(seed() + 2);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> grid;  // e4m3's non-negative values and their midpoints
  for (int c = 0; c < 0x7e; ++c) {
    float x = mok::core::e4m3_decode(static_cast<uint8_t>(c)), y = mok::core::e4m3_decode(static_cast<uint8_t>(c + 1));
    grid.push_back(x);
    grid.push_back((x + y) / 2);
  }
  grid.push_back(448.0f);
  std::vector<float> block(64), want(64), got(64);
  for (int n = 0; n < 400000; ++n) {
    int size = 1 + static_cast<int>(rng() % 32), stride = 1 + static_cast<int>(rng() % 2);
    int shift = static_cast<int>(rng() % 300) - 150;  // the block's scale, anywhere in float's range
    for (int i = 0; i < size; ++i) {
      float x;
      switch (rng() % 6) {
        case 0: x = grid[rng() % grid.size()]; break;
        case 1: x = std::nextafter(grid[rng() % grid.size()], rng() % 2 ? 0.0f : 1000.0f); break;
        case 2: x = unit(rng) * 448.0f; break;
        case 3: x = std::ldexp(unit(rng), -static_cast<int>(rng() % 30)); break;
        case 4: x = rng() % 8 == 0 ? mok::core::kFloatMax : 0.0f; break;
        default: x = unit(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 12) - 10);
      }
      x = std::ldexp(x, shift);
      if (rng() % 2) x = -x;
      if (rng() % 20000 == 0) x = special_value(rng);
      block[i * stride] = x;
    }
    want = block;
    got = block;
    mok::core::mx_round_trip_block(want.data(), size, stride);
    mok::host::detail::mx_round_trip_block(got.data(), size, stride);
    for (int i = 0; i < size; ++i)
      if (mok::core::float_bits(got[i * stride]) != mok::core::float_bits(want[i * stride])) {
        CHECK_MSG(false, "block of %d, element %d = %a: got %a want %a", size, i,
                  static_cast<double>(block[i * stride]), static_cast<double>(got[i * stride]),
                  static_cast<double>(want[i * stride]));
        return;
      }
  }
}

// MOK_HOST_ISA names the path (scalar, avx2, avx512) when the CPU has it; otherwise the widest one the CPU has.
TEST(host_gemm_isa_follows_the_environment) {
  const char* forced = std::getenv("MOK_HOST_ISA");
  GemmIsa want = isas().back();
  for (GemmIsa isa : isas())
    if (forced != nullptr && std::strcmp(forced, gemm_isa_name(isa)) == 0) want = isa;
  CHECK_MSG(mok::host::gemm_isa() == want, "MOK_HOST_ISA=%s: path %s, want %s", forced ? forced : "(unset)",
            gemm_isa_name(mok::host::gemm_isa()), gemm_isa_name(want));
#if defined(__x86_64__)
  CHECK(mok::host::gemm_isa_available(GemmIsa::avx2) == static_cast<bool>(__builtin_cpu_supports("avx2")));
  CHECK(mok::host::gemm_isa_available(GemmIsa::avx512) == static_cast<bool>(__builtin_cpu_supports("avx512f")));
#endif
}

// core sizes every worker's scratch with core::gemm_scratch_floats (shape.hpp's local_layout): the host GEMM
// must never need more, at any tile shape a pass gives it.
TEST(host_gemm_fits_in_cores_scratch) {
  for (int rows : {1, 5, 6, 7, 31, 32, 256, 1000, 7168})
    for (int cols : {1, 16, 33, 3072, 7168})
      for (int depth : {1, 32, 97, 256, 6144, 7168})
        for (bool stores : {false, true})
          CHECK_MSG(mok::host::gemm_scratch_floats(rows, cols, depth) <=
                        mok::core::gemm_scratch_floats(rows, cols, depth, stores),
                    "rows %d cols %d depth %d: host needs %zu floats, core gives %zu", rows, cols, depth,
                    mok::host::gemm_scratch_floats(rows, cols, depth),
                    mok::core::gemm_scratch_floats(rows, cols, depth, stores));
}

MOK_TEST_MAIN
