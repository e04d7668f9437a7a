// The self-test (mok.h mokSelftestRun; kernel/tools/selftest_runner.hpp): the runner's stopping rule, lines and exit
// codes over made-up stage outcomes; and libmok's real stages on this machine, where without a GPU none may pass.
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "check.hpp"
#include "mok/mok.h"
#include "selftest_runner.hpp"

namespace st = mok::selftest;

namespace {

struct Run {
  int code;
  bool timed_out;
  std::string out;
  std::vector<int> ran;
};

// The runner over `outcomes` (stage -> status; stages not listed pass).
Run run_with(const std::map<int, mokStatus_t>& outcomes, bool has_cuda, std::vector<int> stages = {}) {
  if (stages.empty())
    for (int s = 0; s < mokNumSelftestStages; ++s) stages.push_back(s);
  Run r{};
  char* buf = nullptr;
  size_t len = 0;
  FILE* out = open_memstream(&buf, &len);
  r.code = st::run(
      stages,
      [&](int stage) {
        r.ran.push_back(stage);
        auto it = outcomes.find(stage);
        return st::StageResult{it == outcomes.end() ? mokSuccess : it->second, "why " + std::to_string(stage), 0.25};
      },
      has_cuda, out, &r.timed_out);
  std::fclose(out);
  r.out = buf;
  std::free(buf);
  return r;
}

bool has(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

bool gpu_here() {
  mokDeviceInfo_t info = MOK_DEVICE_INFO_INIT;
  return mokGetDeviceInfo(0, &info) == mokSuccess;
}

}  // namespace

TEST(every_stage_passing_exits_0) {
  Run r = run_with({}, true);
  CHECK(r.code == st::kPassed);
  CHECK(r.ran.size() == static_cast<size_t>(mokNumSelftestStages));
  CHECK_MSG(has(r.out, "[1/7] probe: PASS (0.25 s): why 0\n"), "%s", r.out.c_str());
  CHECK_MSG(has(r.out, "mok self-test: every stage passed (exit code 0)\n"), "%s", r.out.c_str());
}

TEST(a_failure_stops_the_run_with_its_code) {
  const std::pair<mokStatus_t, int> cases[] = {{mokInternalError, st::kFailed},
                                               {mokCudaError, st::kFailed},
                                               {mokTimeout, st::kFailed},
                                               {mokNoDevice, st::kNoGpu},
                                               {mokUnsupported, st::kUnsupported}};
  for (auto [status, code] : cases) {
    Run r = run_with({{1, status}, {3, mokNotCompiled}}, true);
    CHECK_MSG(r.code == code, "status %d gave exit %d", status, r.code);
    CHECK(r.ran == (std::vector<int>{0, 1}));  // nothing after the stage that stopped the run
    CHECK_MSG(has(r.out, "[3/7] one_rank: NOT RUN: an earlier stage did not pass\n"), "%s", r.out.c_str());
    CHECK(r.timed_out == (status == mokTimeout));
  }
  Run r = run_with({{1, mokNoDevice}}, true);
  CHECK_MSG(has(r.out, "[2/7] gemm_tile: NO GPU (0.25 s): why 1\n"), "%s", r.out.c_str());
  CHECK_MSG(has(r.out, "mok self-test: no usable GPU or driver (exit code 2)\n"), "%s", r.out.c_str());
}

TEST(stages_not_built_run_on_and_exit_5_or_4) {
  Run r = run_with({{2, mokNotCompiled}, {4, mokNotCompiled}}, true);
  CHECK(r.code == st::kNotBuilt);
  CHECK(r.ran.size() == static_cast<size_t>(mokNumSelftestStages));  // a stage not built stops nothing
  CHECK_MSG(has(r.out, "[3/7] one_rank: NOT BUILT (0.25 s): why 2\n"), "%s", r.out.c_str());
  std::map<int, mokStatus_t> none;
  for (int s = 0; s < mokNumSelftestStages; ++s) none[s] = mokNotCompiled;
  CHECK(run_with(none, false).code == st::kNoCuda);
  // A failure after a stage not built still decides.
  CHECK(run_with({{2, mokNotCompiled}, {5, mokInternalError}}, true).code == st::kFailed);
}

TEST(chosen_stages_only) {
  Run r = run_with({}, true, {1});
  CHECK(r.ran == (std::vector<int>{1}) && r.code == st::kPassed);
  CHECK_MSG(!has(r.out, "probe"), "%s", r.out.c_str());
}

TEST(stage_names_and_bad_arguments) {
  const char* names[] = {"probe", "gemm_tile", "one_rank", "virtual_ranks", "every_gpu", "determinism", "benchmark"};
  for (int s = 0; s < mokNumSelftestStages; ++s)
    CHECK(std::strcmp(mokSelftestStageName(static_cast<mokSelftestStage_t>(s)), names[s]) == 0);
  CHECK(mokSelftestStageName(static_cast<mokSelftestStage_t>(mokNumSelftestStages)) == nullptr);
  CHECK(mokSelftestStageName(static_cast<mokSelftestStage_t>(-1)) == nullptr);

  mokSelftestReport_t report = MOK_SELFTEST_REPORT_INIT;
  CHECK(mokSelftestRun(mokSelftestProbe, nullptr, nullptr) == mokInvalidArgument);
  CHECK(has(mokGetLastError(), "'report'"));
  CHECK(mokSelftestRun(static_cast<mokSelftestStage_t>(7), nullptr, &report) == mokInvalidArgument);
  CHECK(has(mokGetLastError(), "'stage' (7)"));
  mokSelftestOptions_t options = MOK_SELFTEST_OPTIONS_INIT;
  options.timeout_ms = 0;
  CHECK(mokSelftestRun(mokSelftestProbe, &options, &report) == mokInvalidArgument);
  CHECK_MSG(has(mokGetLastError(), "'options.timeout_ms' (0) must be in 1..600000"), "%s", mokGetLastError());
  options = MOK_SELFTEST_OPTIONS_INIT;
  options.device = -1;
  CHECK(mokSelftestRun(mokSelftestProbe, &options, &report) == mokInvalidArgument);
  CHECK(has(mokGetLastError(), "'options.device' (-1)"));
  options = MOK_SELFTEST_OPTIONS_INIT;
  options.magic = 0;
  CHECK(mokSelftestRun(mokSelftestProbe, &options, &report) == mokInvalidArgument);
  CHECK(has(mokGetLastError(), "MOK_SELFTEST_OPTIONS_INIT"));
  report.size = sizeof(report) + 8;  // from a newer mok.h
  CHECK(mokSelftestRun(mokSelftestProbe, nullptr, &report) == mokInvalidArgument);
  CHECK(has(mokGetLastError(), "mokSelftestReport_t"));
}

// Without a GPU no stage passes: each says why (the CUDA error's name), and the runner's exit code is 2 (CUDA build) or
// 4 (no CUDA).
TEST(no_stage_passes_without_a_gpu) {
  if (gpu_here()) {
    std::printf("  skipped: a GPU is here (tests/gpu checks the stages on it)\n");
    return;
  }
  bool cuda = mokCudaArchitectures()[0] != '\0';
  for (int s = 0; s < mokNumSelftestStages; ++s) {
    mokSelftestReport_t report = MOK_SELFTEST_REPORT_INIT;
    mokStatus_t status = mokSelftestRun(static_cast<mokSelftestStage_t>(s), nullptr, &report);
    CHECK_MSG(status != mokSuccess, "stage %d passed without a GPU: %s", s, report.message);
    CHECK_MSG(report.message[0] != '\0', "stage %d left no message", s);
    CHECK(report.seconds >= 0 && report.seconds < 60);
    if (!cuda) {
      CHECK_MSG(status == mokNotCompiled && has(report.message, "without CUDA"), "stage %d: %d %s", s, status,
                report.message);
    } else {
      // mokNotCompiled for the GEMM, the one-rank pass and the cuda executor's layer stages only in a CUDA build
      // without CUTLASS's headers.
      bool ok = (status == mokNoDevice && has(report.message, "cudaError")) ||
                (s != mokSelftestProbe && status == mokNotCompiled && has(report.message, "CUTLASS"));
      CHECK_MSG(ok, "stage %d: %d %s", s, status, report.message);
    }
    if (status != mokSuccess) CHECK(has(mokGetLastError(), report.message));
  }
  std::vector<int> all;
  for (int s = 0; s < mokNumSelftestStages; ++s) all.push_back(s);
  char* buf = nullptr;
  size_t len = 0;
  FILE* out = open_memstream(&buf, &len);
  bool timed_out = false;
  int code = st::run(
      all,
      [](int stage) {
        mokSelftestReport_t report = MOK_SELFTEST_REPORT_INIT;
        mokStatus_t s = mokSelftestRun(static_cast<mokSelftestStage_t>(stage), nullptr, &report);
        return st::StageResult{s, report.message, report.seconds};
      },
      cuda, out, &timed_out);
  std::fclose(out);
  CHECK_MSG(code == (cuda ? st::kNoGpu : st::kNoCuda), "exit %d:\n%s", code, buf);
  std::free(buf);
}

MOK_TEST_MAIN
