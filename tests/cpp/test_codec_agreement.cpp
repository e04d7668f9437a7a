// One MXFP8 codec inside libmok: the in-layer round trips core/ applies to activations and gradients
// (mx_round_trip_row along a row, mx_round_trip_block down a strided column: the weight-gradient token
// blocks) give bit for bit decode(mokMxfp8Quantize(v)), the codec whose bytes equal mok.quant's
// (tests/python/test_codec_agreement.py) and so mok.reference's MXFP8 emulation; and both equal
// reference.hpp's exact search. Inputs as in the Python test: random rows and columns scaled by
// 2^[-20, 20], partial blocks, every e4m3 value and tie and their fp32 neighbours, every scale exponent,
// subnormals, signed zeros, float32's extremes.
#include <cfloat>

#include "core/mxfp8.hpp"
#include "core/mxfp8_layout.hpp"
#include "group.hpp"

using namespace mok_test;

namespace {

using Floats = std::vector<float>;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Every non-negative finite e4m3 value, the midpoints between neighbours, and the floats beside them.
Floats grid() {
  Floats v;
  for (int c = 0; c < 0x7f; ++c) v.push_back(static_cast<float>(ref::e4m3_value(c)));
  for (int c = 0; c + 1 < 0x7f; ++c) {
    float mid = static_cast<float>((ref::e4m3_value(c) + ref::e4m3_value(c + 1)) / 2);
    v.push_back(mid);
    v.push_back(std::nextafter(mid, 0.0f));
    v.push_back(std::nextafter(mid, INFINITY));
  }
  for (float x : {447.0f, 447.5f, 463.9f}) v.push_back(x);
  size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

// Rows of 32: a leading 448 * 2^e pins each block's scale at 2^e, then 31 grid values times 2^e.
std::vector<Floats> grid_rows(int e) {
  Floats g = grid();
  std::vector<Floats> rows;
  for (size_t i = 0; i < g.size(); i += 31) {
    Floats row{std::ldexp(448.0f, e)};
    for (size_t j = i; j < std::min(g.size(), i + 31); ++j) row.push_back(std::ldexp(g[j], e));
    rows.push_back(row);
  }
  return rows;
}

std::vector<Floats> edge_rows() {
  std::vector<Floats> rows;
  for (int e = -127; e <= 120; ++e) {
    float top = std::ldexp(448.0f, e);
    for (float amax :
         {top, std::nextafter(top, INFINITY), std::nextafter(top, 0.0f), std::ldexp(256.0f, e), std::ldexp(1.0f, e)}) {
      if (!std::isfinite(amax)) continue;
      Floats row{amax, -amax / 3, amax / 1024, -std::ldexp(1.0f, -149)};
      for (int i = 0; i < 28; ++i) row.push_back(amax / 29 * static_cast<float>(i - 14));  // no overflow
      rows.push_back(row);
    }
  }
  Floats sub;
  for (int k = 1; k < 24; ++k) sub.push_back(std::ldexp(FLT_MIN, -k));
  rows.push_back(sub);
  Floats neg;
  for (float s : sub) neg.push_back(-s);
  neg.push_back(-0.0f);
  rows.push_back(neg);
  rows.push_back(Floats(32, 0.0f));
  rows.push_back(Floats(32, -0.0f));
  rows.push_back(Floats{FLT_MAX, -FLT_MAX, 1.0f, -1e-30f, 3e30f});
  Floats low{1.0f};
  for (int k = 8; k < 39; ++k) low.push_back(std::ldexp(1.0f, -k));
  rows.push_back(low);
  return rows;
}

// decode(mokMxfp8Quantize(v)) along v, blocks of 32 from its start.
Floats codec_round_trip(const Floats& v) {
  int n = static_cast<int>(v.size());
  mok::core::MxScaleLayout layout = mok::core::MxScaleLayout::of(1, n);
  std::vector<uint8_t> data(n), scales(layout.matrix_bytes());
  mokStatus_t s =
      mokMxfp8Quantize(v.data(), mokDataFloat32, 1, 1, n, data.data(), scales.data(), nullptr, nullptr, nullptr);
  CHECK_MSG(s == mokSuccess, "%s", mokGetLastError());
  Floats out(n);
  for (int i = 0; i < n; ++i)
    out[i] = static_cast<float>(
        std::ldexp(ref::e4m3_value(data[i]), static_cast<int>(scales[layout.offset(0, i / 32)]) - 127));
  return out;
}

Floats exact_round_trip(const Floats& v) {
  ref::Vec d = ref::mx_round_trip(ref::Vec(v.begin(), v.end()));
  return Floats(d.begin(), d.end());
}

// Reports the first element where `got` and `want` differ in any bit.
bool same_bits(const char* what, size_t line, const Floats& source, const Floats& got, const Floats& want) {
  for (size_t i = 0; i < got.size(); ++i)
    if (bits(got[i]) != bits(want[i])) {
      CHECK_MSG(false, "%s, line %zu, element %zu: source %a, got %a, want %a", what, line, i,
                static_cast<double>(source[i]), static_cast<double>(got[i]), static_cast<double>(want[i]));
      return false;
    }
  return true;
}

void check_rows(const std::vector<Floats>& rows) {
  for (size_t r = 0; r < rows.size(); ++r) {
    Floats core = rows[r];
    mok::core::mx_round_trip_row(core.data(), static_cast<int>(core.size()));
    Floats codec = codec_round_trip(rows[r]);
    if (!same_bits("mx_round_trip_row vs mokMxfp8Quantize", r, rows[r], core, codec)) return;
    if (!same_bits("mokMxfp8Quantize vs the exact search", r, rows[r], codec, exact_round_trip(rows[r]))) return;
  }
}

}  // namespace

TEST(row_round_trip_on_every_code_and_tie) {
  for (int e : {-127, -126, -120, -100, -60, -9, -1, 0, 1, 20, 60, 100, 119}) check_rows(grid_rows(e));
}

TEST(row_round_trip_on_scale_edges_subnormals_zeros) {
  check_rows(edge_rows());
}

// Random [R, C] with per-row and per-column scales: rows through mx_round_trip_row, columns through
// mx_round_trip_block with a stride (as token_block does), against the codec along each.
TEST(row_and_strided_column_round_trips_wide_range) {
  std::mt19937_64 rng(seed());
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-20, 20);
  const int R = 45, C = 70;  // partial last blocks both ways
  std::vector<int> row_exp(R), col_exp(C);
  for (int& e : row_exp) e = exponent(rng);
  for (int& e : col_exp) e = exponent(rng);
  Floats m(R * C);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) m[r * C + c] = std::ldexp(normal(rng), row_exp[r] + col_exp[c]);
  std::vector<Floats> rows;
  for (int r = 0; r < R; ++r) rows.emplace_back(m.begin() + r * C, m.begin() + (r + 1) * C);
  check_rows(rows);
  Floats strided = m;
  for (int c = 0; c < C; ++c)
    for (int b = 0; b < R; b += 32) mok::core::mx_round_trip_block(&strided[b * C + c], std::min(32, R - b), C);
  for (int c = 0; c < C; ++c) {
    Floats column(R), got(R);
    for (int r = 0; r < R; ++r) column[r] = m[r * C + c], got[r] = strided[r * C + c];
    if (!same_bits("strided mx_round_trip_block vs mokMxfp8Quantize", c, column, got, codec_round_trip(column))) return;
  }
}

MOK_TEST_MAIN
