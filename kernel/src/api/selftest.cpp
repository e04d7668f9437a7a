// C ABI: the staged self-test (mok.h, "self-test"; docs/gpu.md, "On your first GPU"). The stages that run on a
// GPU live in cuda/selftest*.cpp; a stage this libmok has no code for (no CUDA, no CUTLASS) says so and never passes.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "api/c_enum.hpp"
#include "api/error.hpp"
#include "api/stamp.hpp"

#if MOK_WITH_CUDA
#include "cuda/selftest.hpp"
#endif

using mok::api::fail;

namespace {

constexpr int kMaxTimeoutMs = 600000;

const char* const kStageNames[mokNumSelftestStages] = {"probe",     "gemm_tile",   "one_rank", "virtual_ranks",
                                                       "every_gpu", "determinism", "benchmark"};

struct Setup {
  int device;
  int timeout_ms;
  uint64_t seed;
};

mokStatus_t read_options(const mokSelftestOptions_t* options, Setup* setup) {
  const mokSelftestOptions_t defaults = MOK_SELFTEST_OPTIONS_INIT;
  mokSelftestOptions_t o = defaults;
  if (options) {
    if (mokStatus_t s =
            mok::api::read_stamped(options, mok::api::kSelftestOptions, defaults, "options", "mokSelftestRun", &o);
        s != mokSuccess)
      return s;
  }
  if (o.device < 0)
    return fail(mokInvalidArgument, "mokSelftestRun: argument 'options.device' (%d) must be >= 0", o.device);
  if (o.timeout_ms < 1 || o.timeout_ms > kMaxTimeoutMs)
    return fail(mokInvalidArgument, "mokSelftestRun: argument 'options.timeout_ms' (%d) must be in 1..%d", o.timeout_ms,
                kMaxTimeoutMs);
  // 0: a fresh seed, which the report names so that the run can be repeated.
  *setup = Setup{o.device, o.timeout_ms, o.seed ? o.seed : (static_cast<uint64_t>(std::random_device{}()) << 20 | 1)};
  return mokSuccess;
}

// The stage's verdict and its words, in `message` (`size` bytes).
mokStatus_t run_stage(int stage, const Setup& setup, char* message, size_t size) {
#if MOK_WITH_CUDA
  mok::cuda::SelftestSetup s{setup.device, setup.timeout_ms, setup.seed};
  mok::cuda::Text text;
  using Stage = mokStatus_t (*)(const mok::cuda::SelftestSetup&, mok::cuda::Text*);
  const Stage stages[mokNumSelftestStages] = {mok::cuda::selftest_probe,     mok::cuda::selftest_gemm_tile,
                                              mok::cuda::selftest_one_rank,  mok::cuda::selftest_virtual_ranks,
                                              mok::cuda::selftest_every_gpu, mok::cuda::selftest_determinism,
                                              mok::cuda::selftest_benchmark};
  mokStatus_t status = stages[stage](s, &text);
  std::snprintf(message, size, "%s", text.text);
  return status;
#else
  (void)stage;
  (void)setup;
  std::snprintf(message, size, "not built in this libmok: it was built without CUDA (MOK_ENABLE_CUDA=OFF)");
  return mokNotCompiled;
#endif
}

}  // namespace

extern "C" {

MOK_API const char* mokSelftestStageName(mokSelftestStage_t stage) {
  int32_t bits = mok::api::enum_bits(stage);
  return mok::api::enum_in_range(bits, mokNumSelftestStages) ? kStageNames[bits] : nullptr;
}

MOK_API mokStatus_t mokSelftestRun(mokSelftestStage_t stage, const mokSelftestOptions_t* options,
                                   mokSelftestReport_t* report) {
  mok::api::clear_error();
  size_t layout = 0;
  if (mokStatus_t s = mok::api::check_stamp(report, mok::api::kSelftestReport, "report", __func__, &layout);
      s != mokSuccess)
    return s;
  int32_t bits = mok::api::enum_bits(stage);
  if (!mok::api::enum_in_range(bits, mokNumSelftestStages))
    return fail(mokInvalidArgument, "mokSelftestRun: argument 'stage' (%d) must be in 0..%d (mokSelftestStage_t)", bits,
                mokNumSelftestStages - 1);
  Setup setup{};
  if (mokStatus_t s = read_options(options, &setup); s != mokSuccess) return s;
  mokSelftestReport_t out = MOK_SELFTEST_REPORT_INIT;
  auto start = std::chrono::steady_clock::now();
  mokStatus_t status = run_stage(bits, setup, out.message, sizeof(out.message));
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  mok::api::write_stamped(report, out, layout);
  if (status != mokSuccess) return fail(status, "mokSelftestRun(%s): %s", kStageNames[bits], out.message);
  return mokSuccess;
}

}  // extern "C"
