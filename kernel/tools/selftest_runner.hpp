// The self-test's runner: which stages run, what is printed, the exit code (docs/gpu.md, "On your first GPU").
// python/mok/selftest.py is the same runner in Python, line for line; both print what mokSelftestRun reports.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "mok/mok.h"

namespace mok::selftest {

// Exit codes: the first stage that stops the run decides 1, 2 or 3; else a stage not built decides 4 or 5.
enum Exit : int {
  kPassed = 0,       // every stage run passed
  kFailed = 1,       // a stage failed: wrong results, a CUDA error, a wait that ran out
  kNoGpu = 2,        // no usable GPU or driver
  kUnsupported = 3,  // this GPU cannot run this libmok's device code (its architecture, its driver)
  kNoCuda = 4,       // this libmok was built without CUDA: no stage can run
  kNotBuilt = 5,     // nothing failed, but stages are not built in this libmok (no CUTLASS headers)
  kUsage = 64,       // a bad command line
};

inline const char* exit_words(int code) {
  switch (code) {
    case kPassed: return "every stage passed";
    case kFailed: return "a stage failed";
    case kNoGpu: return "no usable GPU or driver";
    case kUnsupported: return "this GPU cannot run this libmok's device code";
    case kNoCuda: return "this libmok was built without CUDA";
    case kNotBuilt: return "no stage failed, but some are not built in this libmok";
  }
  return "bad command line";
}

// The verdict's word, and whether it lets the next stage run.
inline const char* verdict(mokStatus_t s) {
  switch (s) {
    case mokSuccess: return "PASS";
    case mokNotCompiled: return "NOT BUILT";
    case mokNoDevice: return "NO GPU";
    case mokUnsupported: return "UNSUPPORTED";
    default: return "FAIL";
  }
}

inline int stopping_code(mokStatus_t s) {
  return s == mokNoDevice ? kNoGpu : s == mokUnsupported ? kUnsupported : kFailed;
}

struct StageResult {
  mokStatus_t status;
  std::string message;
  double seconds;
};

using RunStage = std::function<StageResult(int stage)>;

// Runs `stages` in the order given, stopping at the first that neither passes nor is not built. `timed_out` is set
// when a stage's wait ran out: the caller then leaves at once (the GPU may still run that stage's kernel).
inline int run(const std::vector<int>& stages, const RunStage& run_stage, bool has_cuda, FILE* out, bool* timed_out) {
  int code = kPassed;
  bool not_built = false;
  *timed_out = false;
  for (size_t i = 0; i < stages.size(); ++i) {
    int stage = stages[i];
    const char* name = mokSelftestStageName(static_cast<mokSelftestStage_t>(stage));
    if (code != kPassed) {
      std::fprintf(out, "[%d/%d] %s: NOT RUN: an earlier stage did not pass\n", stage + 1, mokNumSelftestStages, name);
      continue;
    }
    StageResult r = run_stage(stage);
    std::fprintf(out, "[%d/%d] %s: %s (%.2f s): %s\n", stage + 1, mokNumSelftestStages, name, verdict(r.status),
                 r.seconds, r.message.c_str());
    std::fflush(out);
    if (r.status == mokNotCompiled) not_built = true;
    if (r.status != mokSuccess && r.status != mokNotCompiled) code = stopping_code(r.status);
    if (r.status == mokTimeout) *timed_out = true;
  }
  if (code == kPassed && not_built) code = has_cuda ? kNotBuilt : kNoCuda;
  std::fprintf(out, "mok self-test: %s (exit code %d)\n", exit_words(code), code);
  std::fflush(out);
  return code;
}

}  // namespace mok::selftest
