// A slow rank is not a dead one: every route goes to rank 0, whose workers start each task late
// (MOK_HOST_FAULT_SLOW) so that its pass lasts many timeouts while rank 1 waits for it in the closing
// barrier and rank 0's own workers wait for each other. The waits restart while the rank they wait for
// makes progress, so the passes succeed with the bits of a run with a long timeout. A slow rank that then
// stops (MOK_HOST_FAULT_STALL) still fails its group, about one timeout after its last progress.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "core/protocol.hpp"
#include "group.hpp"

using namespace mok_test;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// 40 tokens a rank, every route to one of rank 0's experts: rank 0 runs every tile (about 70 tasks in
// the forward and 140 in the backward at world 2), rank 1 none.
ref::Problem all_routes_to_rank0(int world, uint64_t salt) {
  std::mt19937_64 rng(seed() + salt + world);
  Spec s;
  s.world = world;
  s.max_tokens = 40;
  s.ragged = false;
  s.shared_inter = 8;
  ref::Problem p = make_problem(s, rng);
  for (auto& ids : p.ids)
    for (auto& id : ids) id %= s.experts;
  return p;
}

bool same(const Outputs& a, const Outputs& b) {
  return a.out == b.out && a.dx == b.dx && a.dw == b.dw && a.dgate == b.dgate && a.dup == b.dup && a.ddown == b.ddown &&
         a.dsgate == b.dsgate && a.dsup == b.dsup && a.dsdown == b.dsdown && a.slots == b.slots;
}

// Peer buffers the test can look into: rank r's header starts its buffer.
struct Buffers {
  std::vector<std::unique_ptr<AlignedBuffer>> peers, work;
  std::vector<void*> bases, workspaces;
  size_t workspace_bytes;

  Buffers(const ref::Problem& p, const Knobs& k) {
    mokLayerSizes_t sizes = sizes_for(p, k);
    workspace_bytes = sizes.workspace_bytes;
    for (int r = 0; r < p.world; ++r) {
      peers.emplace_back(new AlignedBuffer(sizes.peer_bytes));
      work.emplace_back(new AlignedBuffer(sizes.workspace_bytes));
      bases.push_back(peers.back()->p);
      workspaces.push_back(work.back()->p);
    }
  }
  uint64_t progress(int r) const {
    auto* h = static_cast<mok::core::PeerHeader*>(bases[r]);
    return mok::core::SystemAtomic<uint64_t>(h->progress).load(cuda::std::memory_order_relaxed);
  }
  Outputs run(const ref::Problem& p, const Knobs& k) {
    return run_layer_over(p, k, bases.data(), workspaces.data(), workspace_bytes);
  }
};

// Three ranks' headers, reset as their owners reset them at creation.
struct Headers {
  std::vector<std::unique_ptr<AlignedBuffer>> buffers;
  mok::core::PeerHeader* h[3];

  Headers() {
    int32_t shape[mok::core::kGroupShapeFields] = {};
    for (int r = 0; r < 3; ++r) {
      buffers.emplace_back(new AlignedBuffer(sizeof(mok::core::PeerHeader)));
      h[r] = static_cast<mok::core::PeerHeader*>(buffers.back()->p);
      mok::core::reset_header(h[r], shape, 1000 + r);
    }
  }
};

// Rank 0 works (a task every 10 ms) for `work_ms`, then enters barrier 1 or, with `arrives` false, stops.
std::thread rank0(Headers& g, double work_ms, bool arrives) {
  return std::thread([&g, work_ms, arrives] {
    for (auto start = Clock::now(); ms_since(start) < work_ms;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      mok::core::note_progress(g.h[0]);
    }
    if (arrives)
      mok::core::SystemAtomic<uint64_t>(g.h[0]->arrival)
          .store(mok::core::arrival_word(1, mok::core::CallKind::forward));
  });
}

}  // namespace

// core's barrier, directly: rank 1 waits with a 150 ms timeout for rank 0, which works for 600 ms. It
// completes when rank 0 arrives; when rank 0 stops instead, it runs out naming rank 0, about one
// timeout after rank 0's last task; with rank 2 never coming, it runs out naming rank 2, one timeout
// after rank 0 arrived.
TEST(a_barrier_waits_while_the_peer_it_waits_for_makes_progress) {
  using namespace mok::core;
  constexpr double kTimeoutMs = 150, kWorkMs = 600, kSlackMs = 500;
  const uint64_t timeout_ns = static_cast<uint64_t>(kTimeoutMs * 1e6);
  struct Case {
    int world;
    bool arrives;
    Outcome outcome;
    int peer;
  };
  for (Case c :
       {Case{2, true, Outcome::ok, -1}, Case{2, false, Outcome::timeout, 0}, Case{3, true, Outcome::timeout, 2}}) {
    Headers g;
    auto start = Clock::now();
    std::thread peer = rank0(g, kWorkMs, c.arrives);
    Failure f = barrier(g.h, c.world, 1, 1, CallKind::forward, timeout_ns, WaitId::closing_barrier);
    double ms = ms_since(start);
    peer.join();
    CHECK_MSG(f.outcome == c.outcome && f.peer == c.peer, "world %d, rank 0 %s: outcome %d peer %d after %.0f ms",
              c.world, c.arrives ? "arrives" : "stops", static_cast<int>(f.outcome), f.peer, ms);
    CHECK(f.ok() || f.wait == WaitId::closing_barrier);
    double least = kWorkMs + (f.ok() ? 0 : kTimeoutMs * 15 / 16);
    CHECK_MSG(ms >= least - 5 && ms < least + kTimeoutMs / 8 + kSlackMs, "world %d: returned after %.0f ms, want %.0f",
              c.world, ms, least);
    std::printf("  world %d, rank 0 %s: outcome %d (peer %d) after %.0f ms\n", c.world, c.arrives ? "arrives" : "stops",
                static_cast<int>(f.outcome), f.peer, ms);
  }
}

// A wait on the rank's own workers restarts while they finish tasks, and runs out once they stop.
TEST(a_local_wait_waits_while_its_workers_make_progress) {
  using namespace mok::core;
  constexpr double kTimeoutMs = 150, kWorkMs = 600, kSlackMs = 500;
  Headers g;
  auto start = Clock::now();
  std::thread worker = rank0(g, kWorkMs, false);
  Failure f = wait_for([] { return false; }, g.h[0], static_cast<uint64_t>(kTimeoutMs * 1e6), WaitId::tile_stage);
  double ms = ms_since(start);
  worker.join();
  CHECK(f.outcome == Outcome::timeout && f.wait == WaitId::tile_stage);
  CHECK_MSG(ms >= kWorkMs + kTimeoutMs * 15 / 16 - 5 && ms < kWorkMs + kTimeoutMs * 9 / 8 + kSlackMs,
            "ran out after %.0f ms: %.0f ms of work, timeout %.0f ms", ms, kWorkMs, kTimeoutMs);
}

// One compute worker and minibatches of 4 tiles: a combine waits for 12 tasks of 25 ms, longer than the
// timeout. Before progress kept waits alive, that wait ran out (world 1: 'minibatch done'), and at
// world 2 rank 1's closing barrier did, after one timeout (200 ms) of rank 0's compute.
TEST(a_slow_rank_keeps_its_group_alive_and_computes_the_same_bits) {
  constexpr int kTimeoutMs = 200;
  for (int world : {1, 2}) {
    ref::Problem p = all_routes_to_rank0(world, 11);
    Knobs patient;  // 60 s: no wait runs out
    patient.compute_workers = 1;
    patient.minibatch = 32;
    patient.macrobatch = 64;
    Outputs want = run_layer(p, patient);
    CHECK(all_ok(want));
    Knobs k = patient;
    k.timeout_ms = kTimeoutMs;
    setenv("MOK_HOST_FAULT_SLOW", "0:25000", 1);  // rank 0's workers start each task 25 ms late
    auto start = Clock::now();
    Outputs got = run_layer(p, k);
    double ms = ms_since(start);
    unsetenv("MOK_HOST_FAULT_SLOW");
    CHECK(all_ok(got));
    CHECK_MSG(same(want, got), "world %d: the slow run's results differ from the patient run's", world);
    // The test means something only if the waits lasted many timeouts: the last rank's forward and backward.
    double waited = got.forward_ms[world - 1] + got.backward_ms[world - 1];
    CHECK_MSG(waited > 4 * kTimeoutMs, "world %d: rank %d's calls took %.0f ms, not 4 timeouts of %d ms", world,
              world - 1, waited, kTimeoutMs);
    std::printf("  world %d: forward %.0f ms, backward %.0f ms (rank %d), %.0f ms in all, timeout %d ms\n", world,
                got.forward_ms[world - 1], got.backward_ms[world - 1], world - 1, ms, kTimeoutMs);
  }
}

// Rank 0 is slow, then its comm worker stops after 12 tasks: its compute workers finish what they were
// given and then wait too. Every rank fails naming its wait, and returns between about one timeout
// (less the progress sampling, timeout / 16) and one timeout plus slack after rank 0's last progress.
TEST(a_slow_rank_that_stops_still_times_out) {
  constexpr int kTimeoutMs = 300;
  constexpr double kSlackMs = 1000;  // a rank may wait for a CPU: 2 cores shared with other jobs
  ref::Problem p = all_routes_to_rank0(2, 12);
  Knobs k;
  k.timeout_ms = kTimeoutMs;
  k.backward = false;
  Buffers buffers(p, k);
  std::atomic<bool> done{false};
  std::atomic<double> last_progress_ms{0};
  auto start = Clock::now();
  std::thread watcher([&] {  // when rank 0's progress word last moved
    uint64_t seen = 0;
    while (!done.load()) {
      uint64_t now = buffers.progress(0);
      if (now != seen) last_progress_ms = ms_since(start), seen = now;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::vector<double> returned_ms(2, 0);
  k.before_destroy = [&](int r) { returned_ms[r] = ms_since(start); };
  setenv("MOK_HOST_FAULT_SLOW", "0:30000", 1);
  setenv("MOK_HOST_FAULT_STALL", "0:12", 1);
  Outputs o = buffers.run(p, k);
  unsetenv("MOK_HOST_FAULT_STALL");
  unsetenv("MOK_HOST_FAULT_SLOW");
  done = true;
  watcher.join();
  double last = last_progress_ms.load();
  CHECK_MSG(last > kTimeoutMs, "rank 0 stopped making progress after %.0f ms: the test needs longer than a timeout",
            last);
  bool any_timeout = false;
  for (int r = 0; r < 2; ++r) {
    CHECK_MSG(o.status[r] == mokTimeout || o.status[r] == mokPeerAbort, "rank %d: %s", r,
              mokGetStatusString(o.status[r]));
    any_timeout |= o.status[r] == mokTimeout;
    CHECK_MSG(o.error[r].wait[0] != '\0', "rank %d: the error record names no wait", r);
    double after = returned_ms[r] - last;
    CHECK_MSG(after > kTimeoutMs * 15 / 16 - 5 && after < kTimeoutMs + kTimeoutMs / 8 + kSlackMs,
              "rank %d returned %.0f ms after rank 0's last progress, timeout %d ms", r, after, kTimeoutMs);
    std::printf("  rank %d: %s in '%s' %.0f ms after rank 0's last progress (at %.0f ms): %s\n", r,
                mokGetStatusString(o.status[r]), o.error[r].wait, after, last, o.detail[r].c_str());
  }
  CHECK(any_timeout);
  CHECK_MSG(std::string(o.error[1].wait) == "closing barrier", "rank 1 names '%s'", o.error[1].wait);
}

MOK_TEST_MAIN
