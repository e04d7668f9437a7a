// The block-scaled grouped-GEMM launcher (kernel/src/cuda/grouped_gemm.hpp, grouped_gemm_mxfp8) refuses what it
// cannot run with a status, before any CUDA call: an architecture other than SM100, a kind it does not serve, a
// pointer missing or off TMA's 16 bytes, A's row stride short of K or off 16 codes, a window that does not fit, a group
// that would start inside a 128-row scale tile (expert_padding, the ring's period or the window's first row off the
// tile), misaligned argument arrays. As test_grouped_gemm_launch: every case starts from a random valid launch and
// breaks one thing; without a usable GPU the valid launch reports cuda_error with CUDA's error, with one it is skipped.
// Built in a CUDA build with CUTLASS only.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>

#include "check.hpp"
#include "cuda/grouped_gemm.hpp"
#include "fake_launch.hpp"

namespace core = mok::core;
using core::GroupedGemm;
using mok::cuda::GemmArchitecture;
using mok::cuda::GemmStatus;
using mok::cuda::GroupedGemmMxfp8;
using mok_test::address;
using mok_test::gpu_usable;
using mok_test::pick;

namespace {

// The kinds it serves (core::mx_block_scaled_kind): the forward's and dgrad_h.
constexpr GroupedGemm kScaled[] = {GroupedGemm::gate, GroupedGemm::up, GroupedGemm::down, GroupedGemm::dgrad_h};

// A launch every check passes: H and I whole 32-code blocks, tiles of 128 rows, a window in one turn from a tile.
GroupedGemmMxfp8 valid(std::mt19937_64& rng, GroupedGemm kind) {
  GroupedGemmMxfp8 g{};
  g.shape = mok_test::random_shape(rng, 32, 256);
  g.shape.expert_padding = 128 * pick(rng, 1, 2);
  g.schedule.experts = address<int32_t>(rng);
  g.kind = kind;
  g.periods = core::RowPeriods{g.shape.expert_padding * pick(rng, 1, 8), g.shape.expert_padding * pick(rng, 1, 8)};
  int64_t row0 = 128 * pick(rng, 0, 20);
  g.window = core::RowWindow{row0, core::rows_in_turn(kind, g.periods, row0) - pick(rng, 0, 64)};
  g.a = address<uint8_t>(rng);
  g.a_stride = kind == GroupedGemm::down ? 2 * g.shape.intermediate : g.shape.hidden;
  g.a_scales = address<uint8_t>(rng);
  g.b = address<uint8_t>(rng);
  g.b_scales = address<uint8_t>(rng);
  g.d = address<core::bf16_t>(rng);
  g.arguments = address<void>(rng);
  g.architecture = GemmArchitecture::sm100;  // this test is built with the SM100 units only
  return g;
}

GemmStatus launch(const GroupedGemmMxfp8& g) {
  cudaError_t error = cudaSuccess;
  return mok::cuda::grouped_gemm_mxfp8(g, nullptr, size_t{1} << 30, nullptr, &error);
}

GroupedGemm random_kind(std::mt19937_64& rng) {
  return kScaled[pick(rng, 0, 3)];
}

void expect(GemmStatus got, GemmStatus want, const char* what, int which) {
  CHECK_MSG(got == want, "%s %d: %s, %s wanted", what, which, mok::cuda::gemm_status_name(got),
            mok::cuda::gemm_status_name(want));
}

TEST(valid_launch_reaches_cuda) {
  if (gpu_usable()) {
    std::printf("  skipped: a GPU is usable here, and these pointers are not device memory\n");
    return;
  }
  std::mt19937_64 rng(mok_test::seed());
  for (GroupedGemm kind : kScaled) {
    GroupedGemmMxfp8 g = valid(rng, kind);
    cudaError_t error = cudaSuccess;
    GemmStatus s = mok::cuda::grouped_gemm_mxfp8(g, nullptr, size_t{1} << 30, nullptr, &error);
    CHECK_MSG(s == GemmStatus::cuda_error && error != cudaSuccess, "kind %d: %s", static_cast<int>(kind),
              mok::cuda::gemm_status_name(s));
    size_t bytes = 0;
    error = cudaSuccess;
    s = mok::cuda::grouped_gemm_mxfp8_workspace_bytes(g, &bytes, &error);
    CHECK_MSG(s == GemmStatus::cuda_error && error != cudaSuccess, "kind %d workspace: %s", static_cast<int>(kind),
              mok::cuda::gemm_status_name(s));
  }
}

// The backward's kinds are the BF16 launch's (or another unit's), and kinds out of range are no kind.
TEST(kinds_other_than_the_block_scaled_are_bad_kind) {
  std::mt19937_64 rng(mok_test::seed() + 1);
  for (int bad = static_cast<int>(GroupedGemm::dgrad_x_gate); bad <= static_cast<int>(GroupedGemm::count) + 1; ++bad) {
    GroupedGemmMxfp8 g = valid(rng, random_kind(rng));
    g.kind = static_cast<GroupedGemm>(bad);
    expect(launch(g), GemmStatus::bad_kind, "kind", bad);
    size_t bytes = 0;
    expect(mok::cuda::grouped_gemm_mxfp8_workspace_bytes(g, &bytes, nullptr), GemmStatus::bad_kind, "workspace kind",
           bad);
  }
  GroupedGemmMxfp8 g = valid(rng, random_kind(rng));
  g.kind = static_cast<GroupedGemm>(-1);
  expect(launch(g), GemmStatus::bad_kind, "kind", -1);
}

// The block-scaled MMA is tcgen05's: SM90 (and none, and values no architecture has) runs no MXFP8 GEMM here.
TEST(architectures_other_than_sm100_are_no_architecture) {
  std::mt19937_64 rng(mok_test::seed() + 5);
  for (auto a : {GemmArchitecture::sm90, GemmArchitecture::none, static_cast<GemmArchitecture>(8),
                 static_cast<GemmArchitecture>(11)}) {
    GroupedGemmMxfp8 g = valid(rng, random_kind(rng));
    g.architecture = a;
    expect(launch(g), GemmStatus::no_architecture, "architecture", static_cast<int>(a));
    size_t bytes = 0;
    expect(mok::cuda::grouped_gemm_mxfp8_workspace_bytes(g, &bytes, nullptr), GemmStatus::no_architecture,
           "workspace architecture", static_cast<int>(a));
  }
}

TEST(missing_pointers_are_bad_operands) {
  std::mt19937_64 rng(mok_test::seed() + 2);
  for (GroupedGemm kind : kScaled)
    for (int field = 0; field < 5; ++field) {
      GroupedGemmMxfp8 g = valid(rng, kind);
      switch (field) {
        case 0: g.a = nullptr; break;
        case 1: g.a_scales = nullptr; break;
        case 2: g.b = nullptr; break;
        case 3: g.b_scales = nullptr; break;
        case 4: g.d = nullptr; break;
      }
      expect(launch(g), GemmStatus::bad_operands, "field", field);
    }
}

// One thing broken at a time: a pointer off 16 bytes, A's stride short of K or off 16 codes, H or I off a 32-code
// block, the argument block off 128 bytes.
TEST(unaligned_pointers_strides_and_depths_cannot_implement) {
  std::mt19937_64 rng(mok_test::seed() + 3);
  for (GroupedGemm kind : kScaled)
    for (int field = 0; field < 9; ++field) {
      GroupedGemmMxfp8 g = valid(rng, kind);
      int off = pick(rng, 1, 15);
      switch (field) {
        case 0: g.a += off; break;
        case 1: g.a_scales += off; break;
        case 2: g.b += off; break;
        case 3: g.b_scales += off; break;
        case 4: g.d += pick(rng, 1, 7); break;
        case 5: g.a_stride = core::grouped_layout(g.shape, kind).lda - 16 * pick(rng, 1, 2); break;  // short of K
        case 6: g.a_stride += off; break;
        case 7: (pick(rng, 0, 1) ? g.shape.hidden : g.shape.intermediate) += 16 * pick(rng, 0, 1) + off; break;
        case 8: g.arguments = static_cast<char*>(g.arguments) + 16 * pick(rng, 1, 7); break;
      }
      expect(launch(g), GemmStatus::cannot_implement, "field", field);
    }
}

// A group must start a 128-row scale tile: segments on expert_padding, the ring's period whole tiles, the window
// from a tile. And the window must fit one turn, as in the BF16 launch.
TEST(groups_off_a_scale_tile_and_windows_that_do_not_fit_cannot_implement) {
  std::mt19937_64 rng(mok_test::seed() + 4);
  for (GroupedGemm kind : kScaled)
    for (int bad = 0; bad < 5; ++bad) {
      GroupedGemmMxfp8 g = valid(rng, kind);
      switch (bad) {
        case 0: g.shape.expert_padding = 32 * (4 * pick(rng, 0, 3) + pick(rng, 1, 3)); break;
        case 1:  // a window that fits the new period, from row 0: only the tile check refuses it
          g.periods.ring = g.shape.expert_padding * pick(rng, 1, 4) + 32 * pick(rng, 1, 3);
          g.window = core::RowWindow{0, core::rows_in_turn(kind, g.periods, 0)};
          break;
        case 2: g.window.row0 += 32 * pick(rng, 1, 3), g.window.rows = 1; break;
        case 3: g.window.rows = core::rows_in_turn(kind, g.periods, g.window.row0) + pick(rng, 1, 100); break;
        case 4: g.window = core::RowWindow{g.window.row0, -pick(rng, 1, 100)}; break;
      }
      expect(launch(g), GemmStatus::cannot_implement, "case", bad);
    }
}

TEST(argument_bytes_hold_the_scale_arrays) {
  size_t previous = 0;
  for (int groups : {1, 2, 7, 64, 300}) {
    size_t bytes = mok::cuda::grouped_gemm_mxfp8_argument_bytes(groups);
    // The BF16 launch's nine arrays and four more: two scale pointers and two scale layouts (each a CuTe layout of
    // int32 shapes and strides: at least one word per group).
    CHECK(bytes % 128 == 0 && bytes >= previous && bytes >= 13 * 128 &&
          bytes >= static_cast<size_t>(groups) * (12 + 6 * 8 + 4 * 8 + 2 * 4));
    previous = bytes;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return mok_test::run_all(argc, argv);
}
