// core/'s scalar pieces against the independent reference: bf16 rounding, the e4m3 codec and e8m0
// scale, mokMxfp8Quantize bit for bit, NaN through SwiGLU and an MXFP8 block, and the schedule's
// canonical row order.
#include <limits>
#include <map>
#include <tuple>

#include "core/mxfp8.hpp"
#include "core/mxfp8_layout.hpp"
#include "core/numeric.hpp"
#include "core/schedule.hpp"
#include "group.hpp"

using namespace mok_test;

TEST(bf16_round_to_nearest_even) {
  std::mt19937_64 rng(seed());
  std::uniform_int_distribution<uint32_t> bits(0x00800000u,
                                               0x7f7effffu);  // positive normals that round to a finite bf16
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(rng);
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;  // an exact tie
    float f;
    std::memcpy(&f, &u, 4);
    for (float v : {f, -f}) {
      double want = ref::bf16(v);
      double got = mok::core::round_bf16(v);
      if (got != want) {
        CHECK_MSG(false, "bf16(%a): got %a want %a", static_cast<double>(v), got, want);
        return;
      }
    }
  }
}

// The ends of the range: NaNs stay NaN (payload in the low half only: quieted), Inf stays Inf, the largest
// floats round up to Inf, subnormals and zeros keep their sign.
TEST(bf16_specials) {
  struct Case {
    uint32_t f;
    uint16_t want;
  } cases[] = {{0x7f800001u, 0x7fc0}, {0xff800001u, 0xffc0}, {0x7fc00000u, 0x7fc0}, {0x7f812345u, 0x7fc1},
               {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80}, {0x7f7fffffu, 0x7f80}, {0xff7f8000u, 0xff80},
               {0x00008000u, 0x0000}, {0x00018000u, 0x0002}, {0x80000000u, 0x8000}, {0x3f808000u, 0x3f80}};
  for (const Case& c : cases)
    CHECK_MSG(mok::core::float_to_bf16(mok::core::bits_float(c.f)) == c.want, "%#x: got %#x want %#x", c.f,
              mok::core::float_to_bf16(mok::core::bits_float(c.f)), c.want);
}

TEST(e4m3_encode_matches_nearest_value_search) {
  std::vector<double> probes;
  for (int c = 0; c < 0x7f; ++c) {  // every value and every midpoint (the ties)
    double a = ref::e4m3_value(c), b = ref::e4m3_value(c + 1);
    probes.push_back(a);
    if (c + 1 < 0x7f) probes.push_back((a + b) / 2);
  }
  std::mt19937_64 rng(seed());
  std::uniform_real_distribution<double> any(0, 448), tiny(0, 0.02);
  for (int i = 0; i < 20000; ++i) probes.push_back(i % 2 ? any(rng) : tiny(rng));
  for (double p : probes)
    for (double v : {p, -p}) {
      int got = mok::core::e4m3_encode(static_cast<float>(v));
      int want = ref::e4m3_nearest(static_cast<float>(v));
      if (got != want) {
        CHECK_MSG(false, "e4m3(%a): got %#x want %#x", v, got, want);
        return;
      }
      CHECK(mok::core::e4m3_decode(static_cast<uint8_t>(got)) == ref::e4m3_value(got));
    }
}

TEST(e8m0_scale_is_the_smallest_power_of_two) {
  std::mt19937_64 rng(seed());
  std::uniform_real_distribution<double> mant(0.5, 1.0);
  std::uniform_int_distribution<int> ex(-140, 120);
  std::vector<float> probes = {0.0f, 448.0f, 448.00003f, 447.99997f, 896.0f, 1e-40f, 3e38f};
  for (int k = -130; k < 120; ++k) probes.push_back(std::ldexp(448.0f, k));
  for (int i = 0; i < 20000; ++i) probes.push_back(static_cast<float>(std::ldexp(mant(rng), ex(rng))));
  for (float a : probes) {
    int got = mok::core::mx_scale_exponent(a), want = ref::mx_exponent(a);
    if (got != want) {
      CHECK_MSG(false, "scale of amax %a: got %d want %d", static_cast<double>(a), got, want);
      return;
    }
  }
}

// mokMxfp8Quantize against the reference codec, rowwise and colwise, with partial blocks, a zero
// block and magnitudes far from 1.
void check_quantize(mokDataType_t dtype) {
  std::mt19937_64 rng(seed() + dtype);
  const int B = 2, R = 37, C = 45;
  std::vector<float> v(B * R * C);
  std::uniform_real_distribution<double> d(-1, 1);
  for (int i = 0; i < B * R * C; ++i) v[i] = static_cast<float>(ref::bf16(std::ldexp(d(rng), (i / C) % 7 * 9 - 30)));
  for (int c = 0; c < 32; ++c) v[C + c] = 0.0f;  // row 1, first block: all zeros
  std::vector<uint16_t> bf(v.size());
  for (size_t i = 0; i < v.size(); ++i) bf[i] = ref::bf16_bits(v[i]);
  const void* src = dtype == mokDataBF16 ? static_cast<const void*>(bf.data()) : v.data();
  int rb = (C + 31) / 32, cb = (R + 31) / 32;
  // The scales in the SM100 layout (docs/mxfp8.md), filled with NaN scales that every byte must replace.
  mok::core::MxScaleLayout rl = mok::core::MxScaleLayout::of(R, C), cl = mok::core::MxScaleLayout::of(C, R);
  std::vector<uint8_t> rd(v.size()), rs(rl.batch_bytes(B), 0xff), cd(v.size()), cs(cl.batch_bytes(B), 0xff);
  CHECK(mokMxfp8Quantize(src, dtype, B, R, C, rd.data(), rs.data(), cd.data(), cs.data(), nullptr) == mokSuccess);
  int bad = 0;
  for (int b = 0; b < B; ++b) {
    for (int r = 0; r < R; ++r)
      for (int k = 0; k < rb; ++k) {
        ref::Vec block;
        for (int c = k * 32; c < std::min(C, k * 32 + 32); ++c) block.push_back(v[(b * R + r) * C + c]);
        ref::MxBlock q = ref::mx_quantize(block);
        bad += rs[rl.offset(b, r, k)] != q.exponent + 127;
        for (size_t i = 0; i < block.size(); ++i) bad += rd[(b * R + r) * C + k * 32 + i] != q.codes[i];
      }
    for (int c = 0; c < C; ++c)
      for (int k = 0; k < cb; ++k) {
        ref::Vec block;
        for (int r = k * 32; r < std::min(R, k * 32 + 32); ++r) block.push_back(v[(b * R + r) * C + c]);
        ref::MxBlock q = ref::mx_quantize(block);
        bad += cs[cl.offset(b, c, k)] != q.exponent + 127;
        for (size_t i = 0; i < block.size(); ++i) bad += cd[(b * C + c) * R + k * 32 + i] != q.codes[i];
      }
  }
  CHECK_MSG(bad == 0, "%d bytes differ from the reference codec", bad);
  CHECK(rs[rl.offset(0, 1, 0)] == 0);  // the zero block: e = -127
  // Padding rows (R .. 127) and blocks (rb .. 3) hold the finite 2^0: the matrices fill their bytes exactly.
  int pad = 0;
  for (int b = 0; b < B; ++b) {
    for (int r = 0; r < rl.padded_rows(); ++r)
      for (int k = 0; k < rl.padded_k_blocks(); ++k) pad += (r >= R || k >= rb) && rs[rl.offset(b, r, k)] != 127;
    for (int c = 0; c < cl.padded_rows(); ++c)
      for (int k = 0; k < cl.padded_k_blocks(); ++k) pad += (c >= C || k >= cb) && cs[cl.offset(b, c, k)] != 127;
  }
  CHECK_MSG(pad == 0, "%d padding scales are not 127", pad);
}

TEST(quantize_bf16_bitwise) {
  check_quantize(mokDataBF16);
}
TEST(quantize_fp32_bitwise) {
  check_quantize(mokDataFloat32);
}

// SwiGLU with the executor's sigmoid table gives expf's bits: every bf16 g (NaN, ±Inf, subnormals and both
// zeros included), random bf16 u and dh, clamps that are bf16 values, that are not (a looked-up g never
// meets them) and none; and a g that is not a bf16 value takes expf.
TEST(swiglu_sigmoid_table_is_expf_bitwise) {
  std::vector<float> table(mok::core::kSigmoidTableSize);
  mok::core::fill_sigmoid_table(table.data());
  std::mt19937_64 rng(seed());
  auto bits = [](float f) { return mok::core::float_bits(f); };
  int differ = 0;
  for (int variant = 0; variant < 8; ++variant) {
    float limit = std::array<float, 4>{INFINITY, 2.0f, 1.2345678f, -0.3f}[variant % 4];
    // swiglu, then swiglu_oai: its sigmoid argument alpha * g' is an fp32 product, now and then a bf16 value
    auto activation = variant < 4 ? mok::core::Activation::swiglu : mok::core::Activation::swiglu_oai;
    mok::core::Swiglu plain{limit, nullptr, activation, 1.702f}, looked_up{limit, table.data(), activation, 1.702f};
    for (int b = 0; b < mok::core::kSigmoidTableSize; ++b) {
      float g = mok::core::bf16_to_float(static_cast<mok::core::bf16_t>(b));
      if (rng() % 8 == 0) g = std::nextafter(g, 0.0f);  // not a bf16 value now and then
      float u = mok::core::bf16_to_float(static_cast<mok::core::bf16_t>(rng()));
      float dh = mok::core::bf16_to_float(static_cast<mok::core::bf16_t>(rng()));
      float dg0, du0, dg1, du1;
      plain.backward(g, u, dh, &dg0, &du0);
      looked_up.backward(g, u, dh, &dg1, &du1);
      // swiglu_oai meets two NaNs of different payloads in one product (g and u both NaN): a NaN either way,
      // which NaN is no part of the contract
      auto same_bits = [&](float a, float b) {
        return bits(a) == bits(b) || (variant >= 4 && std::isnan(a) && std::isnan(b));
      };
      bool same = same_bits(plain.forward(g, u), looked_up.forward(g, u)) && same_bits(dg0, dg1) && same_bits(du0, du1);
      if (!same && differ++ < 5)
        CHECK_MSG(false, "L %g: g %a u %a dh %a: h %a / %a, dg %a / %a, du %a / %a", limit, g, u, dh,
                  plain.forward(g, u), looked_up.forward(g, u), dg0, dg1, du0, du1);
    }
  }
  CHECK_MSG(differ == 0, "%d inputs differ", differ);
}

// swiglu_oai against its formula in double, h = g' sigmoid(alpha g') (u' + 1), dg and du its derivatives, over
// g, u across many binades (1e-4 .. 30, both signs) and the clamp L = 7 crossed: fp32 evaluation, so each result
// is within a few fp32 ulps of the double, relative to the size of the terms summed (u' + 1 and
// 1 + alpha g' (1 - s) cancel near u' = -1 and the dsilu zero): 1e-5 of that scale.
// alpha = 1.702 and alpha = 0.6 both, so an alpha that is ignored, or fixed, fails.
TEST(swiglu_oai_matches_its_formula) {
  std::mt19937_64 rng(seed());
  std::uniform_real_distribution<double> exponent(-4, 1.5), coin(0, 1);
  auto draw = [&] { return static_cast<float>((coin(rng) < 0.5 ? -1 : 1) * std::pow(10.0, exponent(rng))); };
  int bad = 0;
  for (double alpha : {1.702, 0.6})
    for (float limit : {7.0f, INFINITY})
      for (int i = 0; i < 20000; ++i) {
        mok::core::Swiglu sw{limit, nullptr, mok::core::Activation::swiglu_oai, static_cast<float>(alpha)};
        float g = draw(), u = draw(), dh = draw();
        double L = limit, a = static_cast<float>(alpha);
        double gc = g > L ? L : g, uc = u > L ? L : (u < -L ? -L : u);
        double s = 1.0 / (1.0 + std::exp(-a * gc));
        double h = gc * s * (uc + 1.0);
        double dg = g > L ? 0.0 : dh * (uc + 1.0) * s * (1.0 + a * gc * (1.0 - s));
        double du = (u > L || u < -L) ? 0.0 : dh * gc * s;
        double h_scale = std::fabs(gc * s) * (std::fabs(uc) + 1.0),
               dg_scale = std::fabs(dh * s) * (std::fabs(uc) + 1.0) * (1.0 + std::fabs(a * gc * (1.0 - s)));
        float got_dg, got_du;
        sw.backward(g, u, dh, &got_dg, &got_du);
        auto near = [](double got, double want, double scale) { return std::fabs(got - want) <= 1e-5 * scale; };
        bool ok = near(sw.forward(g, u), h, h_scale) && near(got_dg, dg, dg_scale) && near(got_du, du, std::fabs(du));
        if (!ok && bad++ < 5)
          CHECK_MSG(false, "alpha %g L %g: g %a u %a dh %a: h %a want %a, dg %a want %a, du %a want %a", alpha, limit,
                    g, u, dh, sw.forward(g, u), h, got_dg, dg, got_du, du);
      }
  CHECK_MSG(bad == 0, "%d inputs off", bad);
}

// NaN in g, u or dh comes out as NaN wherever the formula uses it, with or without a clamp; a
// gradient the clamp stops (g > L, |u| > L) is 0 whatever dh is, as torch.where gives.
TEST(swiglu_propagates_nan) {
  std::mt19937_64 rng(seed());
  std::uniform_real_distribution<float> d(-3, 3);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float limit : {INFINITY, 0.5f, 2.0f})
    for (int i = 0; i < 3000; ++i) {
      mok::core::Swiglu sw{limit};
      float g = d(rng), u = d(rng), dh = d(rng);
      int which = i % 3;  // NaN in g, u or dh
      (which == 0 ? g : which == 1 ? u : dh) = nan;
      float h = sw.forward(g, u), dg, du;
      sw.backward(g, u, dh, &dg, &du);
      bool g_stopped = g > limit, u_stopped = u > limit || u < -limit;
      if (which < 2) CHECK_MSG(std::isnan(h), "L %g: h(%g, %g) = %g", limit, g, u, h);
      if (which == 2) CHECK(!std::isnan(h));
      CHECK_MSG(g_stopped ? dg == 0 : std::isnan(dg), "L %g: dg(%g, %g, %g) = %g", limit, g, u, dh, dg);
      bool du_nan = which != 1 && !u_stopped;  // du = dh * silu(g): no u in it
      CHECK_MSG(u_stopped ? du == 0 : std::isnan(du) == du_nan, "L %g: du(%g, %g, %g) = %g", limit, g, u, dh, du);
    }
}

// A block holding a NaN or an infinity round-trips to NaN in every element and quantises to the NaN
// scale 0xff with NaN codes; the other blocks of the row are untouched.
TEST(mxfp8_block_with_nan_or_inf_is_nan) {
  std::mt19937_64 rng(seed());
  std::uniform_real_distribution<float> d(-2, 2);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}) {
    std::vector<float> row(70);
    for (float& v : row) v = d(rng);
    int at = std::uniform_int_distribution<int>(32, 63)(rng);  // the second block
    row[at] = bad;
    std::vector<float> clean(row);
    clean[at] = 0;
    std::vector<float> want(clean);
    mok::core::mx_round_trip_row(want.data(), 70);
    std::vector<float> got(row);
    mok::core::mx_round_trip_row(got.data(), 70);
    for (int i = 0; i < 70; ++i) {
      bool in_block = i >= 32 && i < 64;
      CHECK_MSG(in_block ? std::isnan(got[i]) : got[i] == want[i], "element %d of a row with %g at %d: %g", i, bad, at,
                got[i]);
    }
    uint8_t q[32];
    CHECK(mok::core::mx_quantize_block(row.data() + 32, 32, 1, q, 1) == 0xff);
    for (uint8_t c : q) CHECK(c == 0x7f);
    CHECK(std::isnan(mok::core::e8m0_decode(0xff)));  // e8m0's NaN, and e4m3fn's two NaN codes
    CHECK(std::isnan(mok::core::e4m3_decode(0x7f)) && std::isnan(mok::core::e4m3_decode(0xff)));
  }
}

TEST(schedule_canonical_order_and_padding) {
  std::mt19937_64 rng(seed());
  mok::core::LayerShape s{};
  s.world = 5;
  s.experts_per_rank = 3;
  s.top_k = 3;
  s.max_tokens = 20;
  s.expert_padding = 4;
  std::uniform_int_distribution<int> id(-1, s.world * s.experts_per_rank - 1), tok(0, s.max_tokens);
  std::vector<std::vector<int32_t>> ids(s.world);
  std::vector<int32_t> tokens(s.world);
  std::vector<const int32_t*> ptrs(s.world);
  for (int r = 0; r < s.world; ++r) {
    tokens[r] = tok(rng);
    for (int i = 0; i < tokens[r] * s.top_k; ++i) ids[r].push_back(id(rng));
    ptrs[r] = ids[r].data();
  }
  for (s.rank = 0; s.rank < s.world; ++s.rank) {
    std::vector<int32_t> experts(2 * s.experts_per_rank);
    std::vector<mok::core::RowRef> rows(mok::core::max_recv_rows(s));
    mok::core::Schedule sch{experts.data(), rows.data(), 0};
    mok::core::build_schedule(s, mok::core::Routing{ptrs.data(), tokens.data()}, sch);
    // the expected rows, by a different route: sort every routed (rank, token, k) per expert
    std::map<int, std::vector<std::tuple<int, int, int>>> want;
    for (int r = 0; r < s.world; ++r)
      for (int i = 0; i < tokens[r] * s.top_k; ++i)
        if (ids[r][i] / s.experts_per_rank == s.rank && ids[r][i] >= 0)
          want[ids[r][i] % s.experts_per_rank].emplace_back(r, i / s.top_k, i % s.top_k);
    int64_t at = 0;
    for (int e = 0; e < s.experts_per_rank; ++e) {
      std::sort(want[e].begin(), want[e].end());
      CHECK(mok::core::expert_first(sch, e) == at);
      CHECK(mok::core::expert_count(sch, e) == static_cast<int>(want[e].size()));
      for (auto [r, t, k] : want[e]) {
        CHECK(rows[at].rank == r && rows[at].token == t && rows[at].k == k);
        ++at;
      }
      while (at % s.expert_padding) CHECK(rows[at++].rank == -1);
    }
    CHECK(sch.total_rows == at);
  }
}

MOK_TEST_MAIN
