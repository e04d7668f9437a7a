// The layer against the double reference for the three orderings of each width against the hidden
// size: routed I < H, I = H, I > H and shared I_s < H, I_s = H, I_s > H, in bf16 and MXFP8. Worker
// scratch holds rows of both widths side by side, so a region sized by one width and used with the
// other shows only when the other is the larger (real models: Qwen1.5-MoE has H 2048, I_s 5632).
#include "group.hpp"

using namespace mok_test;

namespace {

// As test_layer.cpp: fractions of each tensor's largest reference magnitude. One bf16 rounding
// flip where an fp32 sum lands next to a rounding midpoint moves an output by well under 2^-6 of its
// scale; in MXFP8 mode a flipped operand moves to the neighbouring e4m3 value: 2^-4.
constexpr double kTolBf16 = 1.0 / 64;
constexpr double kTolMx = 1.0 / 16;
constexpr double kMinExact = 0.8;  // of bf16 outputs equal to the reference bit for bit

ref::Vec rounded(ref::Vec v) {
  for (double& x : v) x = ref::bf16(x);
  return v;
}

void check_shape(int hidden, int inter, int shared_inter, bool mxfp8) {
  Spec s;
  s.world = 2;
  s.top_k = 2;
  s.hidden = hidden;
  s.inter = inter;
  s.shared_inter = shared_inter;
  s.mxfp8 = mxfp8;
  s.max_tokens = 12;
  std::mt19937_64 rng(seed() + hidden * 1009 + inter * 31 + shared_inter);
  ref::Problem p = make_problem(s, rng);
  Knobs k = mxfp8 ? mxfp8_knobs() : Knobs{};
  Outputs o = run_layer(p, k);
  if (!all_ok(o)) {
    CHECK(false);
    return;
  }
  ref::Result want = ref::Layer(p).run();
  double tol = mxfp8 ? kTolMx : kTolBf16;
  std::printf("  H %d, I %d, I_s %d, %s\n", hidden, inter, shared_inter, mxfp8 ? "MXFP8" : "bf16");
  for (int r = 0; r < p.world; ++r) {
    close("out", r, from_bf16(o.out[r]), want.out[r], tol, kMinExact, p.hidden);
    close("dx", r, from_bf16(o.dx[r]), want.dx[r], tol, kMinExact, p.hidden);
    close_dw(r, from_float(o.dw[r]), want, tol);
    close("dgate", r, from_bf16(o.dgate[r]), rounded(want.dgate[r]), tol, kMinExact, p.hidden);
    close("dup", r, from_bf16(o.dup[r]), rounded(want.dup[r]), tol, kMinExact, p.hidden);
    close("ddown", r, from_bf16(o.ddown[r]), rounded(want.ddown[r]), tol, kMinExact, p.inter);
    if (shared_inter == 0) continue;
    close("dshared_gate", r, from_bf16(o.dsgate[r]), rounded(want.dsgate[r]), tol, kMinExact, p.hidden);
    close("dshared_up", r, from_bf16(o.dsup[r]), rounded(want.dsup[r]), tol, kMinExact, p.hidden);
    close("dshared_down", r, from_bf16(o.dsdown[r]), rounded(want.dsdown[r]), tol, kMinExact, p.shared_inter);
  }
}

}  // namespace

TEST(shared_narrower_than_hidden) {
  check_shape(64, 32, 24, false);
}

TEST(shared_as_wide_as_hidden) {
  check_shape(64, 32, 64, false);
}

TEST(shared_one_wider_than_hidden) {
  check_shape(64, 32, 65, false);  // the case: I_s = H + 1
}

TEST(shared_much_wider_than_hidden) {
  check_shape(32, 16, 88, false);  // I_s = 2.75 H, the ratio of Qwen1.5-MoE
}

TEST(routed_as_wide_as_hidden) {
  check_shape(48, 48, 0, false);
}

TEST(routed_wider_than_hidden) {
  check_shape(24, 72, 40, false);  // I = 3 H and I_s > H
}

TEST(mxfp8_routed_narrower_than_hidden) {
  check_shape(72, 40, 24, true);  // partial 32-blocks along both H and I
}

TEST(mxfp8_routed_wider_than_hidden_and_shared_wider) {
  check_shape(40, 104, 72, true);
}

TEST(several_column_blocks_with_partial_edges) {
  check_shape(300, 520, 0, false);  // H: 256 + 44, I: 2 x 256 + 8 (kColumnBlock 256): offset and edge blocks
}

TEST(mxfp8_several_column_blocks_with_partial_edges) {
  check_shape(280, 536, 24, true);  // partial 32-blocks at the edge blocks of H and I
}

MOK_TEST_MAIN
