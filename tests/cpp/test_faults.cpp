// Faults: a rank that stops mid-pass, a rank that never comes, an explicit abort. Every other rank
// returns mokTimeout or mokPeerAbort within the configured timeout, names the wait, and nothing hangs.
#include <chrono>
#include <cstdlib>
#include <thread>

#include "group.hpp"

using namespace mok_test;

namespace {

constexpr int kTimeoutMs = 1000;

ref::Problem problem(int world) {
  std::mt19937_64 rng(seed() + 5);
  Spec s;
  s.world = world;
  s.max_tokens = 12;
  return make_problem(s, rng);
}

// Each rank returns within: its own bounded wait (one timeout) plus the peers' (another), plus
// scheduling slack on 2 shared cores.
double run_and_time(const ref::Problem& p, const Knobs& k, Outputs* o) {
  auto start = std::chrono::steady_clock::now();
  *o = run_layer(p, k);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

void check_failed_group(const Outputs& o, double elapsed_ms, bool expect_timeout) {
  CHECK_MSG(elapsed_ms < 3 * kTimeoutMs + 2000, "took %.0f ms with a %d ms timeout", elapsed_ms, kTimeoutMs);
  bool any_timeout = false;
  for (size_t r = 0; r < o.status.size(); ++r) {
    CHECK_MSG(o.status[r] == mokTimeout || o.status[r] == mokPeerAbort || o.status[r] == mokSuccess, "rank %zu: %s", r,
              mokGetStatusString(o.status[r]));
    any_timeout |= o.status[r] == mokTimeout;
    if (o.status[r] == mokTimeout || o.status[r] == mokPeerAbort) {
      CHECK_MSG(o.error[r].status == o.status[r], "rank %zu: error record status %d", r, o.error[r].status);
      CHECK_MSG(o.error[r].wait[0] != '\0', "rank %zu: the error record names no wait", r);
      std::printf("  rank %zu: %s; record: task '%s' %d, wait '%s'\n", r, mokGetStatusString(o.status[r]),
                  o.error[r].task, o.error[r].task_index, o.error[r].wait);
    }
  }
  if (expect_timeout) CHECK(any_timeout);
}

}  // namespace

TEST(rank_stops_mid_pass) {
  ref::Problem p = problem(4);
  Knobs k;
  k.timeout_ms = kTimeoutMs;
  setenv("MOK_HOST_FAULT_STALL", "2:1", 1);  // rank 2's first comm worker stops after one task
  Outputs o;
  double ms = run_and_time(p, k, &o);
  unsetenv("MOK_HOST_FAULT_STALL");
  check_failed_group(o, ms, true);
  for (int r = 0; r < 4; ++r) CHECK_MSG(o.status[r] != mokSuccess, "rank %d succeeded", r);
}

TEST(rank_never_enters_the_pass) {
  ref::Problem p = problem(3);
  Knobs k;
  k.timeout_ms = kTimeoutMs;
  k.absent_rank = 1;
  Outputs o;
  double ms = run_and_time(p, k, &o);
  check_failed_group(o, ms, true);
  for (int r : {0, 2}) {
    CHECK(o.status[r] == mokTimeout || o.status[r] == mokPeerAbort);
    CHECK_MSG(std::string(o.error[r].wait) == "entry barrier", "rank %d waited in '%s'", r, o.error[r].wait);
    // The rank whose wait ran out names the one it waited for.
    if (o.status[r] == mokTimeout)
      CHECK_MSG(o.detail[r].find("rank 1 did not arrive") != std::string::npos &&
                    std::string(o.error[r].detail).find("rank 1 did not arrive") != std::string::npos,
                "rank %d: '%s'", r, o.detail[r].c_str());
  }
}

TEST(explicit_abort_reaches_every_rank) {
  ref::Problem p = problem(3);
  Knobs k;
  k.timeout_ms = 30000;  // the abort, not a timeout, must end the pass
  k.abort_rank = 0;
  Outputs o;
  double ms = run_and_time(p, k, &o);
  CHECK_MSG(ms < 5000, "took %.0f ms", ms);
  for (int r = 0; r < 3; ++r) CHECK_MSG(o.status[r] == mokPeerAbort, "rank %d: %s", r, mokGetStatusString(o.status[r]));
}

TEST(abort_from_another_thread_mid_pass) {
  ref::Problem p = problem(3);
  Knobs k;
  k.timeout_ms = 30000;  // long: only the abort can end this pass early
  std::atomic<mokLayer_t> rank0{nullptr};
  k.created = [&](int r, mokLayer_t layer) {
    if (r == 0) rank0 = layer;
  };
  std::atomic<bool> aborted{false};
  k.before_destroy = [&](int) {  // mokLayerAbort must not race with mokLayerDestroy of its layer
    while (!aborted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  setenv("MOK_HOST_FAULT_STALL", "1:2", 1);  // rank 1 hangs mid-pass
  std::thread watcher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (int i = 0; i < 1000 && !rank0.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(rank0.load() && mokLayerAbort(rank0.load(), nullptr) == mokSuccess);
    aborted = true;
  });
  Outputs o;
  double ms = run_and_time(p, k, &o);
  watcher.join();
  unsetenv("MOK_HOST_FAULT_STALL");
  CHECK_MSG(ms < 10000, "took %.0f ms", ms);
  for (int r = 0; r < 3; ++r) CHECK_MSG(o.status[r] == mokPeerAbort, "rank %d: %s", r, mokGetStatusString(o.status[r]));
}

MOK_TEST_MAIN
