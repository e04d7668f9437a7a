// core/mxfp8_layout.hpp against CUTLASS 4.2 itself: CuTe computes on the host where the SM100
// block-scaled MMA reads the scale of every (row, k block) of an operand quantised in 1x32 blocks
// (cutlass::detail::Sm1xxBlockScaledConfig<32>, as the CUTLASS MXFP8 GEMMs build their SFA / SFB
// layouts), and core's MxScaleLayout must give the same byte offset, element by element, and the same
// padded sizes. Built only when the CUTLASS headers are found (tests/cpp/CMakeLists.txt); the scales'
// values and padding are checked by test_mxfp8_layout.
#include <cstdio>
#include <random>

#include "check.hpp"
#include "core/mxfp8_layout.hpp"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"

using mok::core::MxScaleLayout;
using Config = cutlass::detail::Sm1xxBlockScaledConfig<mok::core::kMxBlock>;

namespace {

// rows 200 and depth 96 are not whole tiles (128 rows, 4 k blocks): padding on both sides.
constexpr int kRows[] = {128, 256, 7168, 3072, 200};
constexpr int kDepths[] = {128, 1024, 7168, 96};

// Every (matrix, row, k block) of the padded domain: CuTe's offset of (row, depth element) against core's.
// The element is drawn at random inside its block: all 32 share the scale (CuTe's stride 0 there).
template <class Layout>
void check_offsets(const char* which, const Layout& cute_layout, const MxScaleLayout& core, int batch,
                   std::mt19937_64& rng) {
  CHECK_MSG(cute::size<0>(cute_layout) == core.padded_rows(), "%s rows %lld: CuTe covers %d rows", which,
            static_cast<long long>(core.rows), static_cast<int>(cute::size<0>(cute_layout)));
  CHECK_MSG(cute::size<1>(cute_layout) == core.padded_k_blocks() * mok::core::kMxBlock,
            "%s k blocks %lld: CuTe covers depth %d", which, static_cast<long long>(core.k_blocks),
            static_cast<int>(cute::size<1>(cute_layout)));
  CHECK_MSG(cute::cosize(cute_layout) == core.batch_bytes(batch), "%s rows %lld k blocks %lld batch %d: %d vs %lld",
            which, static_cast<long long>(core.rows), static_cast<long long>(core.k_blocks), batch,
            static_cast<int>(cute::cosize(cute_layout)), static_cast<long long>(core.batch_bytes(batch)));
  std::uniform_int_distribution<int> lane(0, mok::core::kMxBlock - 1);
  long long wrong = 0;
  for (int l = 0; l < batch; ++l)
    for (int64_t r = 0; r < core.padded_rows(); ++r)
      for (int64_t b = 0; b < core.padded_k_blocks(); ++b) {
        int64_t k = b * mok::core::kMxBlock + lane(rng);
        int64_t want = cute_layout(static_cast<int>(r), static_cast<int>(k), l);
        int64_t got = core.offset(l, r, b);
        if (got != want && wrong++ < 3)
          std::printf("  %s rows %lld k blocks %lld: (matrix %d, row %lld, k block %lld) at %lld, CuTe %lld\n", which,
                      static_cast<long long>(core.rows), static_cast<long long>(core.k_blocks), l,
                      static_cast<long long>(r), static_cast<long long>(b), static_cast<long long>(got),
                      static_cast<long long>(want));
      }
  CHECK_MSG(wrong == 0, "%lld offsets differ", wrong);
}

// A [rows, depth] operand as a GEMM's A (M = rows) and as its B (N = rows): the same layout either way.
void check_shape(int rows, int depth, int batch, std::mt19937_64& rng) {
  MxScaleLayout core = MxScaleLayout::of(rows, depth);
  int other = 64;  // the other operand's extent: no part of this one's layout
  check_offsets("SFA", Config::tile_atom_to_shape_SFA(cute::make_shape(rows, other, depth, batch)), core, batch, rng);
  check_offsets("SFB", Config::tile_atom_to_shape_SFB(cute::make_shape(other, rows, depth, batch)), core, batch, rng);
}

TEST(offsets_equal_cute_sfa_and_sfb) {
  std::mt19937_64 rng(mok_test::seed());
  for (int rows : kRows)
    for (int depth : kDepths) check_shape(rows, depth, 1, rng);
}

// Batches: matrix l's scales start at l * matrix_bytes(), as CuTe's L mode strides them.
TEST(batched_offsets_equal_cute) {
  std::mt19937_64 rng(mok_test::seed() + 1);
  check_shape(200, 96, 3, rng);
  check_shape(256, 1024, 2, rng);
  check_shape(128, 7168, 2, rng);
}

// The measured layout of GPU.md, as CuTe prints it for a 7168 x 2048 operand.
TEST(cute_layout_is_the_documented_one) {
  auto l = Config::tile_atom_to_shape_SFA(cute::make_shape(7168, 64, 2048, 1));
  CHECK((cute::stride<0, 0, 0>(l) == 16 && cute::stride<0, 0, 1>(l) == 4 && cute::stride<0, 1>(l) == 8192));
  CHECK((cute::stride<1, 0, 0>(l) == 0 && cute::stride<1, 0, 1>(l) == 1 && cute::stride<1, 1>(l) == 512));
  CHECK(MxScaleLayout::of(7168, 2048).k_tiles() * mok::core::kMxScaleTileBytes == 8192);
}

}  // namespace

MOK_TEST_MAIN
