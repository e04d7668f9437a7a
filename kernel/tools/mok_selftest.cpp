// mok_selftest: the staged self-test a user runs first on a GPU (docs/gpu.md, "On your first GPU").
//   mok_selftest [--device N] [--timeout-ms N] [--seed N] [--stage NAME]...
// Every stage by default, in order; exit codes as selftest_runner.hpp (and docs/gpu.md) says.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "mok/mok.h"
#include "selftest_runner.hpp"

namespace {

int usage(const char* why) {
  std::fprintf(stderr,
               "mok_selftest: %s\nusage: mok_selftest [--device N] [--timeout-ms N] [--seed N] [--stage NAME]...\n"
               "stages:",
               why);
  for (int s = 0; s < mokNumSelftestStages; ++s)
    std::fprintf(stderr, " %s", mokSelftestStageName(static_cast<mokSelftestStage_t>(s)));
  std::fprintf(stderr, "\n");
  return mok::selftest::kUsage;
}

bool parse_number(const char* text, long long lo, long long hi, long long* out) {
  char* end = nullptr;
  long long v = std::strtoll(text, &end, 10);
  if (!text[0] || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

int stage_named(const char* name) {
  for (int s = 0; s < mokNumSelftestStages; ++s)
    if (std::strcmp(name, mokSelftestStageName(static_cast<mokSelftestStage_t>(s))) == 0) return s;
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  mokSelftestOptions_t options = MOK_SELFTEST_OPTIONS_INIT;
  std::vector<int> stages;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") return usage("the staged self-test of libmok on a GPU"), 0;
    if (i + 1 >= argc) return usage(("missing value after " + arg).c_str());
    const char* value = argv[++i];
    long long v = 0;
    if (arg == "--device" && parse_number(value, 0, 1 << 20, &v)) {
      options.device = static_cast<int>(v);
    } else if (arg == "--timeout-ms" && parse_number(value, 1, 600000, &v)) {
      options.timeout_ms = static_cast<int>(v);
    } else if (arg == "--seed" && parse_number(value, 1, (1ll << 62), &v)) {
      options.seed = static_cast<uint64_t>(v);
    } else if (arg == "--stage" && stage_named(value) >= 0) {
      stages.push_back(stage_named(value));
    } else {
      return usage((arg + " " + value + ": not an option and value this program takes").c_str());
    }
  }
  if (stages.empty())
    for (int s = 0; s < mokNumSelftestStages; ++s) stages.push_back(s);

  int version = 0;
  mokGetVersion(&version);
  const char* archs = mokCudaArchitectures();
  std::printf("mok self-test: libmok %d.%d.%d (CUDA architectures: %s), device %d, timeout %d ms per wait\n",
              version / 10000, version / 100 % 100, version % 100, archs[0] ? archs : "none", options.device,
              options.timeout_ms);
  auto run_stage = [&](int stage) {
    mokSelftestReport_t report = MOK_SELFTEST_REPORT_INIT;
    mokStatus_t s = mokSelftestRun(static_cast<mokSelftestStage_t>(stage), &options, &report);
    return mok::selftest::StageResult{s, report.message[0] ? report.message : mokGetLastError(), report.seconds};
  };
  bool timed_out = false;
  int code = mok::selftest::run(stages, run_stage, archs[0] != '\0', stdout, &timed_out);
  // After a wait ran out the GPU may still run that kernel: leave without the runtime's teardown, which could wait
  // for it. The process's exit releases the device.
  if (timed_out) std::_Exit(code);
  return code;
}
