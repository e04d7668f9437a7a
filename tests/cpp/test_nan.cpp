// NaN inputs propagate (docs/semantics.md, "NaN"): a NaN in x or dOut gives NaN at exactly the
// positions the double reference gives, in out, dx, dtopk_weights and every weight gradient, in bf16
// and MXFP8, with and without the SwiGLU clamp and the shared expert; everything else is unchanged.
#include "group.hpp"

using namespace mok_test;

namespace {

constexpr uint16_t kBf16Nan = 0x7fc0;
// As test_layer.cpp: fractions of each tensor's largest finite reference magnitude (one bf16 flip
// in an intermediate moves an output well under 2^-6; an e4m3 neighbour in MXFP8 mode 2^-4).
constexpr double kTolBf16 = 1.0 / 64;
constexpr double kTolMx = 1.0 / 16;

ref::Vec rounded(ref::Vec v) {
  for (double& x : v) x = ref::bf16(x);
  return v;
}

// NaN at the same positions, then the finite values close (NaNs set to 0 on both sides).
// Returns how many NaNs the reference has.
size_t same_nans(const char* what, int rank, std::vector<double> got, ref::Vec want, double tol) {
  size_t nans = 0, wrong = 0, first = 0;
  double got_first = 0, want_first = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    bool a = std::isnan(got[i]), b = std::isnan(want[i]);
    nans += b;
    if (a != b && wrong++ == 0) {
      first = i;
      got_first = got[i];
      want_first = want[i];
    }
    if (a || b) got[i] = want[i] = 0;
  }
  CHECK_MSG(wrong == 0, "%s rank %d: %zu positions NaN in one only, first %zu (got %g, want %g)", what, rank, wrong,
            first, got_first, want_first);
  close(what, rank, got, want, tol);
  return nans;
}

struct Plant {
  bool in_x = true;  // else in dOut
};

void check_nan(bool mxfp8, double limit, int shared_inter, Plant plant) {
  Spec s;
  s.world = 2;
  s.experts = 3;
  s.top_k = 2;
  s.hidden = 40;  // MXFP8: a full and a partial block along H
  s.inter = 24;
  s.shared_inter = shared_inter;
  s.mxfp8 = mxfp8;
  s.limit = limit;
  s.max_tokens = 10;
  std::mt19937_64 rng(seed() + mxfp8 * 7 + shared_inter + static_cast<int>(limit * 100) + plant.in_x * 3);
  ref::Problem p = make_problem(s, rng);
  // One NaN element in one token of each rank (tokens >= 1 on every rank).
  for (int r = 0; r < p.world; ++r) {
    int t = std::uniform_int_distribution<int>(0, p.tokens[r] - 1)(rng);
    int c = std::uniform_int_distribution<int>(0, p.hidden - 1)(rng);
    (plant.in_x ? p.x : p.dout)[r][static_cast<size_t>(t) * p.hidden + c] = kBf16Nan;
  }
  Knobs k = mxfp8 ? mxfp8_knobs() : Knobs{};
  Outputs o = run_layer(p, k);
  if (!all_ok(o)) {
    CHECK(false);
    return;
  }
  ref::Result want = ref::Layer(p).run();
  double tol = mxfp8 ? kTolMx : kTolBf16;
  std::printf("  %s, clamp %g, I_s %d, NaN in %s\n", mxfp8 ? "MXFP8" : "bf16", limit, shared_inter,
              plant.in_x ? "x" : "dOut");
  for (int r = 0; r < p.world; ++r) {
    size_t out_nans = same_nans("out", r, from_bf16(o.out[r]), want.out[r], tol);
    // Every token is routed (uniform routing, no -1): the planted NaN reaches its row.
    CHECK_MSG((out_nans > 0) == plant.in_x, "rank %d: %zu NaN outputs", r, out_nans);
    size_t dx_nans = same_nans("dx", r, from_bf16(o.dx[r]), want.dx[r], tol);
    CHECK_MSG(dx_nans > 0, "rank %d: the planted NaN reached no input gradient", r);
    same_nans("dtopk_weights", r, from_float(o.dw[r]), want.dw[r], tol);
    same_nans("dgate", r, from_bf16(o.dgate[r]), rounded(want.dgate[r]), tol);
    same_nans("dup", r, from_bf16(o.dup[r]), rounded(want.dup[r]), tol);
    same_nans("ddown", r, from_bf16(o.ddown[r]), rounded(want.ddown[r]), tol);
    if (shared_inter == 0) continue;
    same_nans("dshared_gate", r, from_bf16(o.dsgate[r]), rounded(want.dsgate[r]), tol);
    same_nans("dshared_up", r, from_bf16(o.dsup[r]), rounded(want.dsup[r]), tol);
    same_nans("dshared_down", r, from_bf16(o.dsdown[r]), rounded(want.dsdown[r]), tol);
  }
}

}  // namespace

TEST(nan_in_x_bf16) {
  check_nan(false, 0, 0, Plant{});
  check_nan(false, 0, 24, Plant{});
}

TEST(nan_in_x_bf16_clamp) {
  check_nan(false, 0.5, 0, Plant{});  // 0.5: about a third of g and u are clamped at these magnitudes
  check_nan(false, 0.5, 24, Plant{});
}

TEST(nan_in_x_mxfp8) {
  check_nan(true, 0, 0, Plant{});
  check_nan(true, 0, 24, Plant{});
}

TEST(nan_in_x_mxfp8_clamp) {
  check_nan(true, 0.5, 0, Plant{});
  check_nan(true, 0.5, 24, Plant{});
}

TEST(nan_in_dout) {
  check_nan(false, 0.5, 24, Plant{false});
  check_nan(true, 0, 24, Plant{false});
}

MOK_TEST_MAIN
