// The grouped-GEMM launcher (kernel/src/cuda/grouped_gemm.hpp) refuses what it cannot run with a status,
// before any CUDA call: an architecture whose units the build lacks, a kind out of range, an operand missing or meant
// for another kind, a pointer or a leading dim off TMA's 16 bytes, a window that does not fit, misaligned argument
// arrays. Every case starts from a random valid launch of a random kind and breaks one thing. Where no GPU is usable
// (every CUDA call fails, as on this project's machines) the valid launch itself reports cuda_error with CUDA's error;
// where one is, that case is skipped (its pointers are not device memory). Each launch runs on an architecture the
// build carries (SM100, SM90), drawn at random, so both families' checks are exercised. Built in a CUDA build with
// CUTLASS only: it links the instantiations' objects, which libmok does not export.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "check.hpp"
#include "cuda/grouped_gemm.hpp"
#include "fake_launch.hpp"

namespace core = mok::core;
using core::GroupedGemm;
using mok::cuda::GemmArchitecture;
using mok::cuda::GemmStatus;
using mok::cuda::GroupedGemmBf16;
using mok_test::address;
using mok_test::gpu_usable;
using mok_test::pick;

namespace {

constexpr int kKinds = static_cast<int>(GroupedGemm::count);

bool writes_bf16_d(GroupedGemm k) {
  return k == GroupedGemm::gate || k == GroupedGemm::up || k == GroupedGemm::down || k == GroupedGemm::dgrad_h;
}

// The architectures whose units this build carries (MOK_CUDA_ARCHITECTURES).
std::vector<GemmArchitecture> built() {
  std::vector<GemmArchitecture> out;
  for (int major : {10, 9})
    if (GemmArchitecture a = mok::cuda::gemm_architecture(major); a != GemmArchitecture::none) out.push_back(a);
  return out;
}

// A launch every check passes: the pointers the kind uses (grouped_gemm.hpp's table), the others null.
GroupedGemmBf16 valid(std::mt19937_64& rng, GroupedGemm kind) {
  GroupedGemmBf16 g{};
  g.architecture = built()[pick(rng, 0, static_cast<int>(built().size()) - 1)];
  g.shape = mok_test::random_shape(rng, 8, 512);
  g.schedule.experts = address<int32_t>(rng);
  g.kind = kind;
  g.periods = core::RowPeriods{128 * pick(rng, 1, 8), 128 * pick(rng, 1, 8)};
  int64_t row0 = 128 * pick(rng, 0, 20);
  g.window = core::RowWindow{row0, core::rows_in_turn(kind, g.periods, row0) - pick(rng, 0, 64)};
  g.a = address<core::bf16_t>(rng);
  g.b = address<core::bf16_t>(rng);
  g.arguments = address<void>(rng);
  if (writes_bf16_d(kind) || kind == GroupedGemm::dgrad_x_up) g.d = address<core::bf16_t>(rng);
  if (kind == GroupedGemm::dgrad_x_gate || core::is_wgrad(kind)) g.d_fp32 = address<float>(rng);
  if (kind == GroupedGemm::dgrad_x_up) g.c_fp32 = address<float>(rng);
  return g;
}

GemmStatus launch(const GroupedGemmBf16& g) {
  cudaError_t error = cudaSuccess;
  return mok::cuda::grouped_gemm_bf16(g, nullptr, size_t{1} << 30, nullptr, &error);
}

GroupedGemm random_kind(std::mt19937_64& rng) {
  return static_cast<GroupedGemm>(pick(rng, 0, kKinds - 1));
}

TEST(valid_launch_reaches_cuda) {
  if (gpu_usable()) {
    std::printf("  skipped: a GPU is usable here, and these pointers are not device memory\n");
    return;
  }
  std::mt19937_64 rng(mok_test::seed());
  for (int kind = 0; kind < kKinds; ++kind) {
    GroupedGemmBf16 g = valid(rng, static_cast<GroupedGemm>(kind));
    cudaError_t error = cudaSuccess;
    GemmStatus s = mok::cuda::grouped_gemm_bf16(g, nullptr, size_t{1} << 30, nullptr, &error);
    CHECK_MSG(s == GemmStatus::cuda_error && error != cudaSuccess, "kind %d: %s, error %d", kind,
              mok::cuda::gemm_status_name(s), static_cast<int>(error));
    size_t bytes = 0;
    error = cudaSuccess;
    GroupedGemmBf16 query = g;  // the workspace query reads the kind, not the pointers
    query.a = query.b = nullptr;
    query.d = nullptr;
    query.d_fp32 = nullptr;
    query.c_fp32 = nullptr;
    s = mok::cuda::grouped_gemm_bf16_workspace_bytes(query, &bytes, &error);
    CHECK_MSG(s == GemmStatus::cuda_error && error != cudaSuccess, "kind %d workspace: %s", kind,
              mok::cuda::gemm_status_name(s));
  }
  // The forward's kinds take an fp32 D in place of the bf16 one (a layer with expert biases: the forward_f32 unit).
  for (GroupedGemm kind : {GroupedGemm::gate, GroupedGemm::up, GroupedGemm::down}) {
    GroupedGemmBf16 g = valid(rng, kind);
    g.d = nullptr;
    g.d_fp32 = address<float>(rng);
    cudaError_t error = cudaSuccess;
    GemmStatus s = mok::cuda::grouped_gemm_bf16(g, nullptr, size_t{1} << 30, nullptr, &error);
    CHECK_MSG(s == GemmStatus::cuda_error && error != cudaSuccess, "kind %d with an fp32 D: %s", static_cast<int>(kind),
              mok::cuda::gemm_status_name(s));
  }
}

TEST(an_architecture_the_build_lacks_is_no_architecture) {
  CHECK_MSG(!built().empty(), "a build with the grouped GEMMs carries no architecture's units");
  for (int major : {0, 7, 8, 11, 12, -1}) CHECK(mok::cuda::gemm_architecture(major) == GemmArchitecture::none);
  std::mt19937_64 rng(mok_test::seed() + 5);
  // None, values that are no architecture, and a real one this build lacks (where it lacks one).
  std::vector<GemmArchitecture> lacking{GemmArchitecture::none, static_cast<GemmArchitecture>(8),
                                        static_cast<GemmArchitecture>(11)};
  for (GemmArchitecture a : {GemmArchitecture::sm90, GemmArchitecture::sm100})
    if (mok::cuda::gemm_architecture(static_cast<int>(a)) == GemmArchitecture::none) lacking.push_back(a);
  for (GemmArchitecture a : lacking)
    for (int kind = 0; kind < kKinds; ++kind) {
      GroupedGemmBf16 g = valid(rng, static_cast<GroupedGemm>(kind));
      g.architecture = a;
      CHECK_MSG(launch(g) == GemmStatus::no_architecture, "architecture %d", static_cast<int>(a));
      size_t bytes = 0;
      CHECK(mok::cuda::grouped_gemm_bf16_workspace_bytes(g, &bytes, nullptr) == GemmStatus::no_architecture);
    }
  std::printf("  this build's grouped GEMMs:");
  for (GemmArchitecture a : built()) std::printf(" %s", mok::cuda::gemm_architecture_name(a));
  std::printf("\n");
}

TEST(kind_out_of_range_is_bad_kind) {
  std::mt19937_64 rng(mok_test::seed() + 1);
  for (int bad : {kKinds, kKinds + pick(rng, 1, 1000), -1, -pick(rng, 2, 1000)}) {
    GroupedGemmBf16 g = valid(rng, random_kind(rng));
    g.kind = static_cast<GroupedGemm>(bad);
    CHECK_MSG(launch(g) == GemmStatus::bad_kind, "kind %d", bad);
    size_t bytes = 0;
    CHECK(mok::cuda::grouped_gemm_bf16_workspace_bytes(g, &bytes, nullptr) == GemmStatus::bad_kind);
  }
}

// Each pointer of the struct, dropped where the kind uses it and set where it does not.
TEST(operands_the_kind_does_not_take_are_bad_operands) {
  std::mt19937_64 rng(mok_test::seed() + 2);
  for (int kind = 0; kind < kKinds; ++kind)
    for (int field = 0; field < 5; ++field) {
      GroupedGemmBf16 g = valid(rng, static_cast<GroupedGemm>(kind));
      switch (field) {
        case 0: g.a = g.a ? nullptr : address<core::bf16_t>(rng); break;
        case 1: g.b = g.b ? nullptr : address<core::bf16_t>(rng); break;
        case 2: g.d = g.d ? nullptr : address<core::bf16_t>(rng); break;
        case 3: g.d_fp32 = g.d_fp32 ? nullptr : address<float>(rng); break;
        case 4: g.c_fp32 = g.c_fp32 ? nullptr : address<float>(rng); break;
      }
      GemmStatus s = launch(g);
      CHECK_MSG(s == GemmStatus::bad_operands, "kind %d field %d: %s", kind, field, mok::cuda::gemm_status_name(s));
    }
}

// One thing broken at a time: a pointer off 16 bytes, H or I not a multiple of 8 elements, the argument block off
// 128 bytes.
TEST(unaligned_pointers_and_leading_dims_cannot_implement) {
  std::mt19937_64 rng(mok_test::seed() + 3);
  for (int kind = 0; kind < kKinds; ++kind)
    for (int field = 0; field < 6; ++field) {
      GroupedGemmBf16 g = valid(rng, static_cast<GroupedGemm>(kind));
      int bf16_off = pick(rng, 1, 7), fp32_off = pick(rng, 1, 3);  // elements, off 16 bytes
      switch (field) {
        case 0: g.a += bf16_off; break;
        case 1: g.b += bf16_off; break;
        case 2:
          if (g.d) g.d += bf16_off;
          if (g.d_fp32) g.d_fp32 += fp32_off;
          break;
        case 3:
          if (!g.c_fp32) continue;  // only dgrad_x_up reads a separate C
          g.c_fp32 += fp32_off;
          break;
        case 4: (pick(rng, 0, 1) ? g.shape.hidden : g.shape.intermediate) += pick(rng, 1, 7); break;
        case 5: g.arguments = static_cast<char*>(g.arguments) + 16 * pick(rng, 1, 7); break;
      }
      GemmStatus s = launch(g);
      CHECK_MSG(s == GemmStatus::cannot_implement, "kind %d field %d: %s", kind, field, mok::cuda::gemm_status_name(s));
    }
}

// A window past the end of a turn of a row buffer the kind touches (core::window_fits), or of negative extent.
TEST(window_that_does_not_fit_cannot_implement) {
  std::mt19937_64 rng(mok_test::seed() + 4);
  for (int kind = 0; kind < kKinds; ++kind)
    for (int bad = 0; bad < 3; ++bad) {
      GroupedGemmBf16 g = valid(rng, static_cast<GroupedGemm>(kind));
      int64_t row0 = pick(rng, 0, 5000);
      int64_t turn = core::rows_in_turn(g.kind, g.periods, row0);
      g.window = bad == 0   ? core::RowWindow{row0, turn + pick(rng, 1, 100)}
                 : bad == 1 ? core::RowWindow{-pick(rng, 1, 100), 1}
                            : core::RowWindow{row0, -pick(rng, 1, 100)};
      CHECK(!core::window_fits(g.kind, g.periods, g.window));
      GemmStatus s = launch(g);
      CHECK_MSG(s == GemmStatus::cannot_implement, "kind %d window %d: %s", kind, bad, mok::cuda::gemm_status_name(s));
    }
}

TEST(argument_bytes_hold_every_kind_and_status_names_are_distinct) {
  size_t previous = 0;
  for (int groups : {1, 2, 7, 64, 300}) {
    size_t bytes = mok::cuda::grouped_gemm_bf16_argument_bytes(groups);
    // Nine arrays of `groups` entries, each rounded up to 128 bytes: problems (3 int32), four pointers (A, B, C,
    // D) and four strides (one int64 each: the unit and batch modes are static).
    CHECK(bytes % 128 == 0 && bytes >= previous && bytes >= 9 * 128 &&
          bytes >= static_cast<size_t>(groups) * (12 + 4 * 8 + 4 * 8));
    previous = bytes;
  }
  std::set<std::string> names;
  for (int s = 0; s <= static_cast<int>(GemmStatus::no_architecture); ++s)
    names.insert(mok::cuda::gemm_status_name(static_cast<GemmStatus>(s)));
  CHECK(names.size() == static_cast<size_t>(GemmStatus::no_architecture) + 1 && !names.count("unknown"));
}

}  // namespace

int main(int argc, char** argv) {
  return mok_test::run_all(argc, argv);
}
