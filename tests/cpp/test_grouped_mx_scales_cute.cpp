// core/grouped_mx_problems.hpp against CUTLASS 4.2 itself: the block-scaled GEMMs' fill kernel
// (kernel/src/cuda/grouped_gemm_mxfp8_sm100.cuh) gives each expert's group a scale pointer from core
// (a_scales, b_scales) and a layout from CuTe (Sm1xxBlockScaledConfig<32>::tile_atom_to_shape_SFA / SFB of
// the group's (M, N, K)). Here, on the host, for random ragged schedules and windows, every scale byte a
// group reads through pointer + layout(m, k) must be core's MxScaleLayout offset of what the group means:
//   A: ring row (first ring row + m), k block k / 32, in the ring's [period, K] row scales;
//   B: expert e's matrix, row n, k block k / 32, in the weights' scales (rowwise; dgrad_h: down's colwise form).
// Rows m up to the group's padded rows are checked too: the MMA reads whole 128-row tiles, and those must
// still be the ring's rows that follow (their products are never stored). Built only when the CUTLASS
// headers are found, like test_sf_layout_cute.
#include <cstdio>
#include <random>
#include <vector>

#include "check.hpp"
#include "core/grouped_mx_problems.hpp"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"

namespace core = mok::core;
using core::GroupedGemm;
using core::MxScaleLayout;
using Config = cutlass::detail::Sm1xxBlockScaledConfig<core::kMxBlock>;

namespace {

int pick(std::mt19937_64& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

// A ragged schedule as the split executor sees it: per local expert its routed rows (some none, some many
// tiles, some a part of one) and its segment's first row, segments padded to expert_padding (a multiple of
// the 128-row scale tile).
struct Case {
  core::LayerShape s{};
  std::vector<int32_t> experts;
  core::Schedule sched{};
  core::RowPeriods periods{};
  int64_t total = 0;
};

Case make_case(std::mt19937_64& rng) {
  Case c;
  c.s.world = 1;
  c.s.experts_per_rank = pick(rng, 1, 8);
  c.s.hidden = core::kMxBlock * pick(rng, 1, 40);  // k blocks not a whole scale tile, sometimes
  c.s.intermediate = core::kMxBlock * pick(rng, 1, 40);
  c.s.expert_padding = core::kMxScaleRowTile * pick(rng, 1, 2);
  c.experts.assign(static_cast<size_t>(2 * c.s.experts_per_rank), 0);
  for (int e = 0; e < c.s.experts_per_rank; ++e) {
    int rows = pick(rng, 0, 3) == 0 ? 0 : pick(rng, 1, 700);
    c.experts[static_cast<size_t>(2 * e)] = rows;
    c.experts[static_cast<size_t>(2 * e + 1)] = static_cast<int32_t>(c.total);
    c.total += (rows + c.s.expert_padding - 1) / c.s.expert_padding * c.s.expert_padding;
  }
  c.sched = core::Schedule{c.experts.data(), nullptr, c.total};
  int64_t ring = c.s.expert_padding * static_cast<int64_t>(pick(rng, 1, 8));
  c.periods = core::RowPeriods{ring, c.s.expert_padding * static_cast<int64_t>(pick(rng, 1, 8))};
  return c;
}

// The K-major row stride of A in codes: H for x and dy; 2 I for h, which keeps its codes in its bf16 ring's bytes.
int64_t a_stride(const Case& c, GroupedGemm kind) {
  return kind == GroupedGemm::down ? 2 * static_cast<int64_t>(c.s.intermediate) : c.s.hidden;
}

long long g_wrong = 0;

void expect(int64_t got, int64_t want, const char* what, GroupedGemm kind, int e, int64_t row, int64_t k) {
  if (got != want && g_wrong++ < 4)
    std::printf("  kind %d expert %d %s (row %lld, k %lld): byte %lld, core says %lld\n", static_cast<int>(kind), e,
                what, static_cast<long long>(row), static_cast<long long>(k), static_cast<long long>(got),
                static_cast<long long>(want));
}

// Every (row, k block) of expert e's group, the element drawn at random inside its block (all 32 share the
// scale). Rows up to the group's padded M, the ring's padded rows permitting.
void check_group(std::mt19937_64& rng, const Case& c, GroupedGemm kind, const core::RowWindow& w, int e) {
  core::GroupedMxProblem q = core::grouped_mx_problem(c.s, c.sched, kind, c.periods, w, a_stride(c, kind), e);
  if (q.p.m == 0) return;
  auto mnkl = cute::make_shape(q.p.m, q.p.n, q.p.k, 1);
  auto sfa = Config::tile_atom_to_shape_SFA(mnkl);
  auto sfb = Config::tile_atom_to_shape_SFB(mnkl);
  // The layouts the quantisers write (mxfp8_layout.hpp): the ring's [period, K] and each weight's [N, K].
  MxScaleLayout ring = MxScaleLayout::of(c.periods.ring, q.p.k), weight = MxScaleLayout::of(q.p.n, q.p.k);
  int64_t first = core::window_rows(c.sched, e, w).first % c.periods.ring;
  CHECK_MSG(q.p.a == first * q.lda, "kind %d expert %d: A at code %lld, ring row %lld", static_cast<int>(kind), e,
            static_cast<long long>(q.p.a), static_cast<long long>(first));
  std::uniform_int_distribution<int> lane(0, core::kMxBlock - 1);
  int64_t blocks = ring.padded_k_blocks();
  int64_t rows = MxScaleLayout::of(q.p.m, q.p.k).padded_rows();
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t b = 0; b < blocks; ++b) {
      int64_t k = b * core::kMxBlock + lane(rng);
      int64_t got = q.a_scales + sfa(static_cast<int>(m), static_cast<int>(k), 0);
      expect(got, ring.offset(first + m, b), "SFA", kind, e, m, k);
    }
  for (int64_t n = 0; n < weight.padded_rows(); ++n)
    for (int64_t b = 0; b < blocks; ++b) {
      int64_t k = b * core::kMxBlock + lane(rng);
      int64_t got = q.b_scales + sfb(static_cast<int>(n), static_cast<int>(k), 0);
      expect(got, weight.offset(e, n, b), "SFB", kind, e, n, k);
    }
}

// Every turn-long window the executor runs, and a random tile-aligned one inside a turn.
void check_case(std::mt19937_64& rng, const Case& c) {
  for (GroupedGemm kind : {GroupedGemm::gate, GroupedGemm::up, GroupedGemm::down, GroupedGemm::dgrad_h}) {
    std::vector<core::RowWindow> windows;
    for (int64_t row0 = 0; row0 < c.total; row0 += core::rows_in_turn(kind, c.periods, row0))
      windows.push_back(core::RowWindow{row0, core::rows_in_turn(kind, c.periods, row0)});
    int64_t tiles = c.total / core::kMxScaleRowTile;
    if (tiles > 0) {
      int64_t row0 = core::kMxScaleRowTile * static_cast<int64_t>(pick(rng, 0, static_cast<int>(tiles - 1)));
      windows.push_back(
          core::RowWindow{row0, pick(rng, 0, static_cast<int>(core::rows_in_turn(kind, c.periods, row0)))});
    }
    for (const core::RowWindow& w : windows) {
      CHECK(core::window_fits(kind, c.periods, w) && core::mx_tiles_whole(c.s, c.periods, w));
      for (int e = 0; e < c.s.experts_per_rank; ++e) check_group(rng, c, kind, w, e);
    }
  }
}

TEST(groups_read_core_scale_bytes) {
  std::mt19937_64 rng(mok_test::seed());
  g_wrong = 0;
  for (int i = 0; i < 40; ++i) check_case(rng, make_case(rng));
  CHECK_MSG(g_wrong == 0, "%lld scale bytes differ", g_wrong);
}

// One expert taking every row, over a ring of one tile and of many: a group that runs to the end of a turn.
TEST(one_expert_over_whole_turns) {
  std::mt19937_64 rng(mok_test::seed() + 1);
  g_wrong = 0;
  for (int i = 0; i < 10; ++i) {
    Case c = make_case(rng);
    for (int e = 0; e < c.s.experts_per_rank; ++e) c.experts[static_cast<size_t>(2 * e)] = 0;
    c.experts[0] = static_cast<int32_t>(c.periods.ring * pick(rng, 1, 3));
    c.total = (c.experts[0] + c.s.expert_padding - 1) / c.s.expert_padding * c.s.expert_padding;
    for (int e = 1; e < c.s.experts_per_rank; ++e)
      c.experts[static_cast<size_t>(2 * e + 1)] = static_cast<int32_t>(c.total);
    check_case(rng, c);
  }
  CHECK_MSG(g_wrong == 0, "%lld scale bytes differ", g_wrong);
}

// What the launch refuses: a group starting inside a scale tile (padding, period or window off the tile).
TEST(tiles_whole_needs_every_start_on_a_tile) {
  core::LayerShape s{};
  s.expert_padding = 128;
  core::RowPeriods p{256, 256};
  CHECK(core::mx_tiles_whole(s, p, core::RowWindow{128, 100}));
  CHECK(!core::mx_tiles_whole(s, p, core::RowWindow{64, 100}));
  CHECK(!core::mx_tiles_whole(s, core::RowPeriods{192, 256}, core::RowWindow{0, 100}));
  s.expert_padding = 96;
  CHECK(!core::mx_tiles_whole(s, p, core::RowWindow{0, 100}));
  CHECK(core::mx_forward_kind(GroupedGemm::down) && !core::mx_forward_kind(GroupedGemm::dgrad_h));
}

// The block-scaled kinds and their layouts: dgrad_h reads down's colwise form, [I, H] K-major (weight_columns), where
// the BF16 kind reads down [H, I] N-major; every other kind's layout is the BF16 kind's.
TEST(block_scaled_kinds_read_both_operands_along_k) {
  core::LayerShape s{};
  s.hidden = 96, s.intermediate = 64;
  for (int k = 0; k < static_cast<int>(GroupedGemm::count); ++k) {
    auto kind = static_cast<GroupedGemm>(k);
    bool block_scaled = core::mx_forward_kind(kind) || kind == GroupedGemm::dgrad_h;
    CHECK_MSG(core::mx_block_scaled_kind(kind) == block_scaled, "kind %d", k);
    if (!block_scaled) continue;
    core::GroupedLayout mx = core::grouped_mx_layout(s, kind), bf16 = core::grouped_layout(s, kind);
    CHECK_MSG(mx.a_k_major && mx.b_k_major && mx.lda == mx.ldb && mx.ldc == bf16.ldc, "kind %d", k);
    CHECK_MSG(kind == GroupedGemm::dgrad_h || (mx.ldb == bf16.ldb && bf16.b_k_major), "kind %d", k);
  }
  core::GroupedLayout dgrad_h = core::grouped_mx_layout(s, GroupedGemm::dgrad_h);
  CHECK(dgrad_h.lda == 96 && dgrad_h.ldb == 96 && dgrad_h.ldc == 64);
}

}  // namespace

MOK_TEST_MAIN
