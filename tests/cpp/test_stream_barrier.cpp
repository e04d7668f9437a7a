// core::stream_barrier, the cuda executor's barrier (cuda/layer_steps.cu runs it in one thread of a kernel on each
// rank's stream), run here with ranks as threads over the same bytes: headers in stale memory, each rank's group state
// and error record as the device keeps them. Every rank passes the calls' barriers in order with the group's state
// advanced by the barrier alone; a rank whose record holds a failure does not arrive, and its peers fail fast with its
// reason where it left on purpose; a missing rank runs out the timeout, named; different calls fail every rank.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "core/group_state.hpp"

namespace core = mok::core;
using namespace mok_test;
using core::CallKind;
using core::Outcome;
using core::WaitId;

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kLongNs = 20'000'000'000ull;  // only a rank that was never told could run it out
constexpr double kFastMs = 5000;                 // far below it, with slack for threads on 2 shared cores

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// A barrier a call enters: the schedule build's two, a pass's entry and closing ones.
struct Step {
  WaitId what;
  CallKind call;
};
const Step kSchedule{WaitId::schedule_barrier, CallKind::build_schedule};
const Step kForwardEntry{WaitId::entry_barrier, CallKind::forward};
const Step kForwardClose{WaitId::closing_barrier, CallKind::forward};
const Step kBackwardEntry{WaitId::entry_barrier, CallKind::backward};
const Step kBackwardClose{WaitId::closing_barrier, CallKind::backward};

// The group's memory: every rank's header over bytes left by an earlier group (random), its state and record zero
// as the cuda executor uploads them at creation.
struct Group {
  explicit Group(int world) : states(world), records(world) {
    std::mt19937_64 rng(seed() + static_cast<uint64_t>(world));
    core::LayerShape s{};
    s.world = world, s.experts_per_rank = 2, s.hidden = 16, s.intermediate = 8, s.top_k = 2, s.max_tokens = 4;
    int32_t shape[core::kGroupShapeFields];
    core::group_shape(s, shape);
    for (int r = 0; r < world; ++r) {
      buffers.push_back(std::make_unique<core::PeerHeader>());
      auto* bytes = reinterpret_cast<unsigned char*>(buffers.back().get());
      for (size_t i = 0; i < sizeof(core::PeerHeader); ++i) bytes[i] = static_cast<unsigned char>(rng());
      headers.push_back(buffers.back().get());
      core::reset_header(headers.back(), shape, rng() | 1);
    }
  }
  bool barrier(int rank, Step step, uint64_t timeout_ns = kLongNs) {
    int world = static_cast<int>(headers.size());
    return core::stream_barrier(states[rank], &records[rank], headers.data(), world, rank, timeout_ns, step.what,
                                step.call);
  }
  // Each rank's `body(rank)` on its own thread (a rank of `absent` never runs).
  template <class Body>
  void run(Body body, int absent = -1) {
    std::vector<std::thread> ranks;
    for (int r = 0; r < static_cast<int>(headers.size()); ++r)
      if (r != absent) ranks.emplace_back(body, r);
    for (std::thread& t : ranks) t.join();
  }
  std::vector<std::unique_ptr<core::PeerHeader>> buffers;
  std::vector<core::PeerHeader*> headers;
  std::vector<core::GroupState> states;
  std::vector<core::ErrorRecord> records;
};

bool claimed(const core::ErrorRecord& r) {
  return r.claimed != 0;
}

}  // namespace

// Schedule, forward, backward, three times: every barrier passes on every rank, and the group's state is the
// barrier's own (formed once, one epoch per barrier), as a CUDA graph's replay needs.
TEST(every_rank_passes_the_calls_barriers_in_order) {
  const int world = 3;
  Group g(world);
  const Step calls[] = {kSchedule, kSchedule, kForwardEntry, kForwardClose, kBackwardEntry, kBackwardClose};
  std::vector<int> passed(world, 0);
  g.run([&](int r) {
    for (int round = 0; round < 3; ++round)
      for (const Step& step : calls) passed[r] += g.barrier(r, step);
  });
  for (int r = 0; r < world; ++r) {
    CHECK_MSG(passed[r] == 18, "rank %d passed %d of 18 barriers", r, passed[r]);
    CHECK(g.states[r].formed && g.states[r].epoch == 18 && !claimed(g.records[r]));
  }
}

// A rank that refused its call (its record says so, on purpose) does not arrive: every peer fails its first barrier
// (the group's formation) at once with peer_abort, naming that rank and carrying its reason; the rank fails too.
TEST(a_rank_that_refused_its_call_stops_its_peers_at_once_with_its_reason) {
  const int world = 3, refuser = 1;
  Group g(world);
  core::record_failure(&g.records[refuser], core::Failure{Outcome::rejected_arguments, WaitId::rejected_call}, refuser,
                       -1, -1, "rank 1 rejected its call: argument 'x' is host memory");
  std::vector<int> passed(world, -1);
  std::vector<double> ms(world, 0);
  g.run([&](int r) {
    auto start = Clock::now();
    passed[r] = g.barrier(r, kSchedule);
    ms[r] = ms_since(start);
  });
  for (int r = 0; r < world; ++r) {
    CHECK_MSG(passed[r] == 0 && ms[r] < kFastMs, "rank %d: passed %d after %.0f ms", r, passed[r], ms[r]);
    if (r == refuser) continue;
    const core::ErrorRecord& e = g.records[r];
    CHECK_MSG(e.outcome == static_cast<int32_t>(Outcome::peer_abort) && e.peer == refuser &&
                  e.wait == static_cast<int32_t>(WaitId::group_formation),
              "rank %d: outcome %d, peer %d, wait %d", r, e.outcome, e.peer, e.wait);
    CHECK_MSG(std::strstr(e.detail, "rank 1 rejected its call: argument 'x'") != nullptr, "rank %d: '%s'", r, e.detail);
  }
}

// A claim the barrier sees before its claimer has published it (the host records while a kernel enters a barrier):
// the rank leaves once the record is published, so its peers still get its reason.
TEST(a_reason_published_after_the_claim_still_reaches_the_peers) {
  const int world = 2, refuser = 0;
  Group g(world);
  core::ErrorRecord& mine = g.records[refuser];
  mine.claimed = 1;  // claimed, nothing published yet
  std::thread claimer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // The rest of core::record_failure: the fields, then the release that publishes them.
    mine.outcome = static_cast<int32_t>(Outcome::rejected_order);
    mine.rank = refuser, mine.task_kind = -1, mine.task_index = -1, mine.peer = -1;
    mine.wait = static_cast<int32_t>(WaitId::rejected_call);
    std::snprintf(mine.detail, sizeof(mine.detail), "rank 0 rejected its call: call mokLayerBuildSchedule first");
    core::SystemAtomic<int32_t>(mine.published).store(1, ::cuda::std::memory_order_release);
  });
  std::vector<int> passed(world, -1);
  g.run([&](int r) { passed[r] = g.barrier(r, kForwardEntry); });
  claimer.join();
  const core::ErrorRecord& e = g.records[1];
  CHECK_MSG(passed[0] == 0 && passed[1] == 0, "passed %d and %d", passed[0], passed[1]);
  CHECK_MSG(e.outcome == static_cast<int32_t>(Outcome::peer_abort) && e.peer == refuser &&
                std::strstr(e.detail, "rank 0 rejected its call") != nullptr,
            "rank 1: outcome %d, peer %d, '%s'", e.outcome, e.peer, e.detail);
}

// A refuser preempted inside raise_abort, after it acknowledged rank 0 and wrote its abort but before it came to rank
// 2: rank 0 fails, and its own abort reaches rank 2 before the refuser has acknowledged rank 2. Rank 2 then waits
// (bounded) until the refuser has (stamped_peer trusts only a peer that acknowledged this rank) and names it with its
// reason. The refuser's state is set by hand; the rest of its raise_abort comes 100 ms late, as on CI's loaded machine
// once (rank 2 named no peer and carried no reason).
TEST(a_peer_told_of_the_abort_by_another_still_gets_the_refusers_reason) {
  const int world = 3, refuser = 1;
  Group g(world);
  core::PeerHeader* own = g.headers[refuser];
  auto incarnation = [&](int r) { return core::load_word(g.headers[r]->incarnation); };
  std::snprintf(own->reason, sizeof(own->reason), "rank 1 rejected its call: argument 'x' is host memory");
  core::store_word(own->reason_stamp, incarnation(refuser));
  core::store_word(own->abort, incarnation(refuser));
  core::store_word(own->seen[0], incarnation(0));  // raise_abort's first peer: acknowledged, then told
  core::store_word(g.headers[0]->abort, incarnation(0));
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    core::raise_abort(g.headers.data(), world, refuser);  // the rest of it: rank 2 acknowledged, then told
  });
  std::vector<int> passed(world, -1);
  g.run([&](int r) { passed[r] = g.barrier(r, kSchedule); }, refuser);
  late.join();
  for (int r : {0, 2}) {
    const core::ErrorRecord& e = g.records[r];
    CHECK_MSG(passed[r] == 0 && e.outcome == static_cast<int32_t>(Outcome::peer_abort) && e.peer == refuser &&
                  std::strstr(e.detail, "rank 1 rejected its call: argument 'x'") != nullptr,
              "rank %d: passed %d, outcome %d, peer %d, '%s'", r, passed[r], e.outcome, e.peer, e.detail);
  }
}

// A rank cut short after the group formed (a launch that failed: no purpose, no reason) stops its peers at their next
// barrier, which name no rank; the barriers before it passed.
TEST(a_rank_cut_short_mid_context_stops_its_peers_at_the_next_barrier) {
  const int world = 2;
  Group g(world);
  std::vector<int> passed(world, 0);
  std::vector<int> last(world, -1);
  g.run([&](int r) {
    passed[r] += g.barrier(r, kSchedule) + g.barrier(r, kSchedule) + g.barrier(r, kForwardEntry);
    if (r == 0)
      core::record_failure(&g.records[0], core::Failure{Outcome::launch_failed, WaitId::none}, 0, -1, -1,
                           "launch 3 of the split pass failed");
    last[r] = g.barrier(r, kForwardClose);
  });
  CHECK_MSG(passed[0] == 3 && passed[1] == 3, "passed %d and %d of 3 before the cut", passed[0], passed[1]);
  CHECK(last[0] == 0 && last[1] == 0);
  const core::ErrorRecord& e = g.records[1];
  CHECK_MSG(e.outcome == static_cast<int32_t>(Outcome::peer_abort) && e.peer == -1 && e.detail[0] == '\0' &&
                e.wait == static_cast<int32_t>(WaitId::closing_barrier),
            "rank 1: outcome %d, peer %d, wait %d, '%s'", e.outcome, e.peer, e.wait, e.detail);
  CHECK(g.records[0].outcome == static_cast<int32_t>(Outcome::launch_failed));  // its own failure stands
}

// A rank that never comes: the group's formation runs out the timeout, the first rank to give up naming it; it aborts
// the group, so another may see that abort first.
TEST(a_missing_rank_runs_out_the_timeout_named) {
  const int world = 3, missing = 2;
  Group g(world);
  const uint64_t timeout_ns = 300'000'000ull;
  std::vector<double> ms(world, 0);
  g.run(
      [&](int r) {
        auto start = Clock::now();
        CHECK(!g.barrier(r, kSchedule, timeout_ns));
        ms[r] = ms_since(start);
      },
      missing);
  int named = 0;
  for (int r = 0; r < world; ++r) {
    if (r == missing) continue;
    const core::ErrorRecord& e = g.records[r];
    bool timeout = e.outcome == static_cast<int32_t>(Outcome::timeout) && e.peer == missing;
    named += timeout;
    CHECK_MSG((timeout || e.outcome == static_cast<int32_t>(Outcome::peer_abort)) &&
                  e.wait == static_cast<int32_t>(WaitId::group_formation),
              "rank %d: outcome %d, peer %d, wait %d", r, e.outcome, e.peer, e.wait);
    CHECK_MSG(ms[r] < kFastMs, "rank %d gave up after %.0f ms (timeout 300)", r, ms[r]);
  }
  CHECK_MSG(named >= 1, "no rank named the missing one");
  CHECK(*std::min_element(ms.begin(), ms.begin() + missing) >= 300);  // nobody gave up before the timeout
}

// Ranks entering the same barrier from different calls: each finds the mismatch itself.
TEST(ranks_in_different_calls_all_fail) {
  const int world = 2;
  Group g(world);
  std::vector<int> passed(world, -1);
  g.run([&](int r) { passed[r] = g.barrier(r, r == 0 ? kForwardEntry : kBackwardEntry); });
  for (int r = 0; r < world; ++r) {
    const core::ErrorRecord& e = g.records[r];
    CHECK_MSG(passed[r] == 0 && e.outcome == static_cast<int32_t>(Outcome::call_mismatch) && e.peer == 1 - r,
              "rank %d: passed %d, outcome %d, peer %d", r, passed[r], e.outcome, e.peer);
  }
}

int main(int argc, char** argv) {
  return run_all(argc, argv);
}
