// core/mxfp8_layout.hpp without CUTLASS: the scale layout is a bijection of the padded (row, k block)
// domain onto its bytes, mx_quantize_rows writes exactly core::mx_quantize_block's bytes at those
// offsets (fp32 and bf16 sources, strided rows, partial blocks and tiles) and a finite scale into every
// padding byte, and mx_decode inverts it; an e4m3 GEMM operand over those bytes (core::Operand, from any
// first row) reads back the round trip of its rows. test_sf_layout_cute holds the offsets against CuTe.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "check.hpp"
#include "core/compute_tasks.hpp"
#include "core/mxfp8_layout.hpp"

using mok::core::kMxBlock;
using mok::core::MxScaleLayout;

namespace {

struct Shape {
  int rows, depth;
};
// Whole tiles, a partial row tile, a partial k tile, a partial last block, and one block.
constexpr Shape kShapes[] = {{128, 128}, {256, 1024}, {200, 96}, {37, 1000}, {1, 32}, {129, 132}, {300, 7}};

TEST(offsets_are_a_bijection_onto_the_padded_bytes) {
  for (Shape s : kShapes) {
    MxScaleLayout layout = MxScaleLayout::of(s.rows, s.depth);
    CHECK(layout.padded_rows() >= s.rows && layout.padded_rows() < s.rows + 128);
    CHECK(layout.padded_k_blocks() * kMxBlock >= s.depth && layout.padded_k_blocks() * kMxBlock < s.depth + 128);
    CHECK(layout.matrix_bytes() == layout.padded_rows() * layout.padded_k_blocks());
    std::vector<int> hits(layout.matrix_bytes(), 0);
    bool in_range = true;
    for (int64_t r = 0; r < layout.padded_rows(); ++r)
      for (int64_t b = 0; b < layout.padded_k_blocks(); ++b) {
        int64_t at = layout.offset(r, b);
        if (at < 0 || at >= layout.matrix_bytes())
          in_range = false;
        else
          ++hits[at];
      }
    CHECK_MSG(in_range, "rows %d depth %d: an offset outside [0, %lld)", s.rows, s.depth,
              static_cast<long long>(layout.matrix_bytes()));
    bool once = true;
    for (int h : hits) once = once && h == 1;
    CHECK_MSG(once, "rows %d depth %d: some byte is not hit exactly once", s.rows, s.depth);
  }
}

// docs/mxfp8.md's formula at hand-computed points of a [300, 7168] operand (3 row tiles, 56 k tiles).
TEST(offsets_follow_the_documented_formula) {
  MxScaleLayout layout = MxScaleLayout::of(300, 7168);
  CHECK(layout.k_blocks == 224 && layout.k_tiles() == 56 && layout.row_tiles() == 3);
  CHECK(layout.matrix_bytes() == 3 * 56 * 512);
  CHECK(layout.offset(0, 0) == 0);
  CHECK(layout.offset(0, 1) == 1);           // k blocks of a row: adjacent bytes of one 32-bit word
  CHECK(layout.offset(1, 0) == 16);          // rows 0..31 step 16 bytes
  CHECK(layout.offset(32, 0) == 4);          // rows 32 apart share a 16-byte line
  CHECK(layout.offset(0, 4) == 512);         // the next k tile
  CHECK(layout.offset(128, 0) == 56 * 512);  // the next row tile, after all k tiles of the first
  // matrix 2, row 171 = tile 1 + 32 * 1 + 11, k block 6 = tile 1 + 2
  CHECK(layout.offset(2, 171, 6) == 2 * (3 * 56 * 512) + 56 * 512 + 512 + 11 * 16 + 1 * 4 + 2);
}

// Values of a row with a dynamic range of 2^+-20 between rows and between blocks, and 2^-12..2^0 inside a
// block (e4m3 subnormals and zeros appear), signs random.
std::vector<float> random_rows(int rows, int stride, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> row_exp(-20, 20), block_exp(-20, 20), elem_exp(-12, 0);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> v(static_cast<size_t>(rows) * stride, NAN);  // NaN past depth: must never be read
  for (int r = 0; r < rows; ++r) {
    int re = row_exp(rng), be = 0;
    for (int k = 0; k < stride; ++k) {
      if (k % kMxBlock == 0) be = block_exp(rng);
      float x = std::ldexp(mant(rng), re + be + elem_exp(rng));
      v[static_cast<size_t>(r) * stride + k] = negative(rng) ? -x : x;
    }
  }
  return v;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

constexpr uint8_t kUnwritten = 0xA5;  // a code and a scale no correct run leaves where this test looks

// mx_quantize_rows' data and scales against mx_quantize_block block by block, the padding scales, and
// mx_decode against the block round trip, bit for bit. `src` holds fp32 values; T is what is quantised.
template <class T>
void check_round_trip(Shape s, const std::vector<float>& values, int src_stride) {
  std::vector<T> src(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if constexpr (sizeof(T) == 2)
      src[i] = mok::core::float_to_bf16(values[i]);
    else
      src[i] = values[i];
  }
  MxScaleLayout layout = MxScaleLayout::of(s.rows, s.depth);
  int data_stride = s.depth + 5;  // bytes past depth belong to someone else: left alone
  std::vector<uint8_t> data(static_cast<size_t>(s.rows) * data_stride, kUnwritten);
  std::vector<uint8_t> scales(layout.matrix_bytes(), kUnwritten);
  mok::core::mx_quantize_rows(src.data(), src_stride, s.rows, s.depth, data.data(), data_stride, scales.data());

  long long wrong_data = 0, wrong_scale = 0, wrong_pad = 0, wrong_decode = 0, touched = 0;
  for (int r = 0; r < s.rows; ++r) {
    for (int b = 0; b < layout.k_blocks; ++b) {
      int n = std::min(kMxBlock, s.depth - b * kMxBlock);
      float block[kMxBlock], trip[kMxBlock];
      uint8_t codes[kMxBlock];
      for (int i = 0; i < n; ++i)
        block[i] = trip[i] = mok::core::mx_load_float(src.data(), int64_t(r) * src_stride + b * kMxBlock + i);
      uint8_t scale = mok::core::mx_quantize_block(block, n, 1, codes, 1);
      mok::core::mx_round_trip_block(trip, n, 1);
      wrong_scale += scales[layout.offset(r, b)] != scale;
      for (int i = 0; i < n; ++i) {
        int64_t k = int64_t(b) * kMxBlock + i;
        wrong_data += data[size_t(r) * data_stride + k] != codes[i];
        float got = mok::core::mx_decode(data.data(), data_stride, scales.data(), layout, r, k);
        wrong_decode += bits(got) != bits(trip[i]);
      }
    }
    for (int k = s.depth; k < data_stride; ++k) touched += data[size_t(r) * data_stride + k] != kUnwritten;
  }
  for (int64_t r = 0; r < layout.padded_rows(); ++r)
    for (int64_t b = 0; b < layout.padded_k_blocks(); ++b)
      if (r >= s.rows || b >= layout.k_blocks) wrong_pad += scales[layout.offset(r, b)] != mok::core::kMxPadScale;
  CHECK_MSG(wrong_data == 0, "rows %d depth %d: %lld codes differ from mx_quantize_block", s.rows, s.depth, wrong_data);
  CHECK_MSG(wrong_scale == 0, "rows %d depth %d: %lld scales differ", s.rows, s.depth, wrong_scale);
  CHECK_MSG(wrong_pad == 0, "rows %d depth %d: %lld padding scales not 2^0", s.rows, s.depth, wrong_pad);
  CHECK_MSG(wrong_decode == 0, "rows %d depth %d: %lld decodes differ from the round trip", s.rows, s.depth,
            wrong_decode);
  CHECK_MSG(touched == 0, "rows %d depth %d: %lld bytes past depth written", s.rows, s.depth, touched);
}

TEST(quantize_rows_writes_the_block_codec_bytes_in_the_layout) {
  std::mt19937_64 rng(mok_test::seed());
  for (Shape s : kShapes) {
    int src_stride = s.depth + 3;  // a strided source: the values past depth are NaN and never read
    std::vector<float> v = random_rows(s.rows, src_stride, rng);
    for (int r = 0; r < s.rows; ++r)
      for (int k = s.depth; k < src_stride; ++k) v[size_t(r) * src_stride + k] = NAN;
    check_round_trip<float>(s, v, src_stride);
    check_round_trip<mok::core::bf16_t>(s, v, src_stride);
  }
}

// A NaN gets its block (and only its block) the NaN scale; every padding scale stays finite.
TEST(nan_block_keeps_padding_finite) {
  Shape s{200, 96};
  std::mt19937_64 rng(mok_test::seed() + 7);
  std::vector<float> v = random_rows(s.rows, s.depth, rng);
  v[size_t(150) * s.depth + 40] = NAN;  // row 150, block 1
  MxScaleLayout layout = MxScaleLayout::of(s.rows, s.depth);
  std::vector<uint8_t> data(size_t(s.rows) * s.depth), scales(layout.matrix_bytes(), kUnwritten);
  mok::core::mx_quantize_rows(v.data(), s.depth, s.rows, s.depth, data.data(), s.depth, scales.data());
  int nan_scales = 0;
  for (uint8_t x : scales) nan_scales += x == mok::core::kE8m0Nan;
  CHECK(nan_scales == 1);
  CHECK(scales[layout.offset(150, 1)] == mok::core::kE8m0Nan);
  CHECK(std::isnan(mok::core::mx_decode(data.data(), s.depth, scales.data(), layout, 150, 33)));
  CHECK(!std::isnan(mok::core::mx_decode(data.data(), s.depth, scales.data(), layout, 150, 64)));
}

// The GEMM's view of laid-out bytes: e4m3_operand over a [rows, depth] matrix, advanced by from_row to
// first rows (a block of output columns starts mid-matrix, mid-tile or in a later tile), reads element
// (i, k) as the MXFP8 round trip of source element (first + i, k). Rows carry scales 2^+-20 apart, so a
// scale taken from another row's or block's byte changes the value.
TEST(e4m3_operand_reads_the_layout_from_any_first_row) {
  std::mt19937_64 rng(mok_test::seed() + 11);
  for (Shape s : kShapes) {
    std::vector<float> v = random_rows(s.rows, s.depth, rng);
    MxScaleLayout layout = MxScaleLayout::of(s.rows, s.depth);
    std::vector<uint8_t> data(size_t(s.rows) * s.depth), scales(layout.matrix_bytes());
    mok::core::mx_quantize_rows(v.data(), s.depth, s.rows, s.depth, data.data(), s.depth, scales.data());
    std::vector<float> trip = v;
    for (int r = 0; r < s.rows; ++r) mok::core::mx_round_trip_row(trip.data() + size_t(r) * s.depth, s.depth);
    mok::core::Operand whole = mok::core::e4m3_operand(data.data(), s.depth, scales.data(), layout);
    long long wrong = 0;
    for (int first : {0, 1, 31, 33, 127, 130}) {
      if (first >= s.rows) continue;
      mok::core::Operand o = mok::core::from_row(whole, first);
      for (int i = 0; first + i < s.rows; ++i)
        for (int k = 0; k < s.depth; ++k)
          wrong += bits(mok::core::stored_value(o, i, k)) != bits(trip[size_t(first + i) * s.depth + k]);
    }
    CHECK_MSG(wrong == 0, "rows %d depth %d: %lld operand values differ from the round trip", s.rows, s.depth, wrong);
  }
}

}  // namespace

MOK_TEST_MAIN
