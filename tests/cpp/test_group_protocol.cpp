// The group protocol over heap peer buffers, ranks as threads: peer memory full of an earlier group's
// data or of garbage, configs that differ, ranks making different calls, a rank that rejects its
// arguments, a rank that never comes. Outputs stay bitwise those of fresh buffers; every failing
// rank fails fast with a message naming the cause.
#include <chrono>

#include "group.hpp"

using namespace mok_test;

namespace {

// Long enough that only a rank that was never told could run it out; "fast" is far below it, with
// slack for many threads on 2 shared cores.
constexpr int kLongTimeoutMs = 20000;
constexpr double kFastMs = 5000;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

bool contains(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

// One rank's context over given heap buffers, with its bf16 weights and inputs from a problem.
struct Rank {
  const ref::Problem& p;
  int r;
  mokLayer_t layer = nullptr;
  mokLayerWeights_t w;
  std::vector<int32_t> ids;
  std::vector<uint16_t> out;
  Bf16Grads grads;                  // 0xbeef (and -7 for dtopk_weights) until a backward writes them
  mokStatus_t status = mokSuccess;  // of the last call
  std::string detail;

  Rank(const ref::Problem& problem, int rank)
      : p(problem),
        r(rank),
        w(bf16_weights(p, r)),
        ids(p.ids[r].begin(), p.ids[r].end()),
        out(static_cast<size_t>(p.tokens[r]) * p.hidden, 0xbeef),
        grads(p, r, 0xbeef, -7.0f) {}
  ~Rank() { mokLayerDestroy(layer); }

  mokStatus_t note(mokStatus_t s) {
    status = s;
    detail = mokGetLastError();
    return s;
  }
  bool create(const mokLayerConfig_t& c, void* const* bases, void* workspace, size_t workspace_bytes) {
    mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
    m.peer_bases = bases;
    m.workspace = workspace;
    m.workspace_bytes = workspace_bytes;
    return note(mokLayerCreate(&c, &m, &layer)) == mokSuccess;
  }
  mokStatus_t schedule() { return note(mokLayerBuildSchedule(layer, ids.data(), mokIndexInt32, p.tokens[r], nullptr)); }
  mokStatus_t forward() {
    return note(mokLayerForward(layer, &w, p.x[r].data(), p.topk_weights[r].data(), out.data(), nullptr));
  }
  mokStatus_t recompute() { return note(mokLayerRecompute(layer, &w, p.x[r].data(), nullptr)); }
  mokStatus_t backward() {
    mokLayerGrads_t g = grads.grads();
    return note(mokLayerBackward(layer, &w, p.topk_weights[r].data(), p.dout[r].data(), &g, nullptr));
  }
  mokLayerError_t error() const {
    mokLayerError_t e = MOK_LAYER_ERROR_INIT;
    CHECK(mokLayerGetError(layer, &e) == mokSuccess);
    return e;
  }
};

// A group of p.world ranks over fresh zeroed heap buffers; run() creates every rank's context on its
// own thread and hands it to `body`.
struct Group {
  const ref::Problem& p;
  Knobs k;
  std::vector<std::unique_ptr<AlignedBuffer>> peer, work;
  std::vector<void*> bases;
  size_t workspace_bytes = 0;
  std::vector<std::unique_ptr<Rank>> ranks;
  std::function<void(int, mokLayerConfig_t&)> edit_config;

  Group(const ref::Problem& problem, int timeout_ms, int buffers = 0) : p(problem) {
    k.timeout_ms = timeout_ms;
    mokLayerSizes_t sizes = sizes_for(p, k);
    workspace_bytes = 2 * sizes.workspace_bytes;  // room for a rank whose config asks for more
    for (int r = 0; r < std::max(buffers, p.world); ++r) {
      peer.emplace_back(new AlignedBuffer(sizes.peer_bytes));
      work.emplace_back(new AlignedBuffer(workspace_bytes));
      bases.push_back(peer.back()->p);
    }
    for (int r = 0; r < p.world; ++r) ranks.emplace_back(new Rank(p, r));
  }

  template <class Body>
  double run(Body body) {
    auto t0 = std::chrono::steady_clock::now();
    each_rank(p.world, [&](int r) {
      mokLayerConfig_t c = config_for(p, k, r);
      if (edit_config) edit_config(r, c);
      Rank& rank = *ranks[r];
      if (!CHECK_OK(rank.create(c, bases.data(), work[r]->p, workspace_bytes), rank)) return;
      body(rank);
    });
    return ms_since(t0);
  }

  static bool CHECK_OK(bool ok, const Rank& rank) {
    CHECK_MSG(ok, "rank %d: %s", rank.r, rank.detail.c_str());
    return ok;
  }
};

ref::Problem problem(int world, uint64_t salt, int max_tokens = 8, bool ragged = true) {
  std::mt19937_64 rng(seed() + salt);
  Spec s;
  s.world = world;
  s.max_tokens = max_tokens;
  s.ragged = ragged;
  s.shared_inter = 8;  // the shared expert reads the own x from the peer buffer too
  return make_problem(s, rng);
}

// Every output of every rank, bit for bit.
void check_same(const Outputs& want, const Outputs& got, const char* what) {
  CHECK_MSG(all_ok(got), "%s: a rank failed", what);
  for (size_t r = 0; r < want.status.size(); ++r) {
    CHECK_MSG(got.out[r] == want.out[r], "%s: rank %zu: out differs", what, r);
    CHECK_MSG(got.slots[r] == want.slots[r], "%s: rank %zu: y slots differ", what, r);
    CHECK_MSG(got.dx[r] == want.dx[r], "%s: rank %zu: dx differs", what, r);
    CHECK_MSG(got.dw[r] == want.dw[r], "%s: rank %zu: dtopk_weights differ", what, r);
    CHECK_MSG(got.dgate[r] == want.dgate[r] && got.dup[r] == want.dup[r] && got.ddown[r] == want.ddown[r],
              "%s: rank %zu: routed weight gradients differ", what, r);
    CHECK_MSG(got.dsgate[r] == want.dsgate[r] && got.dsup[r] == want.dsup[r] && got.dsdown[r] == want.dsdown[r],
              "%s: rank %zu: shared weight gradients differ", what, r);
  }
}

void fill_random(void* p, size_t bytes, std::mt19937_64& rng) {
  auto* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<unsigned char>(rng());
}

}  // namespace

// A group created over peer buffers (and workspaces) holding an earlier group's data, an aborted
// group's, random garbage or all ones gives bitwise the outputs of fresh zeroed buffers.
TEST(stale_peer_memory_gives_the_same_outputs) {
  ref::Problem a = problem(3, 11), b = problem(3, 12);
  Knobs k;
  mokLayerSizes_t sa = sizes_for(a, k), sb = sizes_for(b, k);
  size_t peer_bytes = std::max(sa.peer_bytes, sb.peer_bytes),
         work_bytes = std::max(sa.workspace_bytes, sb.workspace_bytes);
  Outputs fresh = run_layer(b, k);
  CHECK(all_ok(fresh));
  std::vector<std::unique_ptr<AlignedBuffer>> peer, work;
  std::vector<void*> bases, works;
  for (int r = 0; r < 3; ++r) {
    peer.emplace_back(new AlignedBuffer(peer_bytes));
    work.emplace_back(new AlignedBuffer(work_bytes));
    bases.push_back(peer.back()->p);
    works.push_back(work.back()->p);
  }
  CHECK(all_ok(run_layer_over(a, k, bases.data(), works.data(), work_bytes)));
  check_same(fresh, run_layer_over(b, k, bases.data(), works.data(), work_bytes), "after an earlier group");

  Knobs aborting = k;
  aborting.abort_rank = 1;
  aborting.timeout_ms = kLongTimeoutMs;
  Outputs aborted = run_layer_over(a, aborting, bases.data(), works.data(), work_bytes);
  for (int r = 0; r < 3; ++r) CHECK_MSG(aborted.status[r] == mokPeerAbort, "rank %d: %s", r, aborted.detail[r].c_str());
  check_same(fresh, run_layer_over(b, k, bases.data(), works.data(), work_bytes), "after an aborted group");

  std::mt19937_64 rng(seed() + 13);
  for (int r = 0; r < 3; ++r) {
    fill_random(bases[r], peer_bytes, rng);
    fill_random(works[r], work_bytes, rng);
  }
  check_same(fresh, run_layer_over(b, k, bases.data(), works.data(), work_bytes), "over random garbage");

  for (int r = 0; r < 3; ++r) {
    std::memset(bases[r], 0xff, peer_bytes);
    std::memset(works[r], 0xff, work_bytes);
  }
  check_same(fresh, run_layer_over(b, k, bases.data(), works.data(), work_bytes), "over all ones");
}

// `world` differs: the rank that counts 3 ranks does not wait for the third; both fail at once,
// naming the field and both values.
TEST(config_world_differs_fails_fast) {
  ref::Problem p = problem(2, 21);
  Group g(p, kLongTimeoutMs, 3);
  g.edit_config = [](int r, mokLayerConfig_t& c) {
    if (r == 1) c.world = 3;
  };
  double ms = g.run([](Rank& r) { r.schedule(); });
  CHECK_MSG(ms < kFastMs, "took %.0f ms", ms);
  for (auto& r : g.ranks) {
    std::printf("  rank %d: %s\n", r->r, r->detail.c_str());
    CHECK_MSG(r->status == mokInvalidArgument && contains(r->detail, "'config.world'") && contains(r->detail, "(2)") &&
                  contains(r->detail, "(3)"),
              "rank %d: %s: %s", r->r, mokGetStatusString(r->status), r->detail.c_str());
    mokLayerError_t e = r->error();
    CHECK_MSG(e.status == mokInvalidArgument && contains(e.detail, "'config.world'"), "rank %d: record '%s'", r->r,
              e.detail);
  }
}

TEST(config_swiglu_limit_differs_fails_every_rank) {
  ref::Problem p = problem(3, 22);
  Group g(p, kLongTimeoutMs);
  g.edit_config = [](int r, mokLayerConfig_t& c) {
    if (r == 2) c.swiglu_limit = 0.5f;
  };
  double ms = g.run([](Rank& r) { r.schedule(); });
  CHECK_MSG(ms < kFastMs, "took %.0f ms", ms);
  for (auto& r : g.ranks)
    CHECK_MSG(
        r->status == mokInvalidArgument && contains(r->detail, "'config.swiglu_limit'") && contains(r->detail, "(0.5)"),
        "rank %d: %s: %s", r->r, mokGetStatusString(r->status), r->detail.c_str());
}

// The activation and swiglu_oai's alpha are part of the math every rank shares: a rank with another one fails
// every rank, the detail naming the field and both values (alpha as the float it is).
TEST(config_activation_or_alpha_differs_fails_every_rank) {
  for (int which = 0; which < 2; ++which) {
    ref::Problem p = problem(3, 22);
    Group g(p, kLongTimeoutMs);
    g.edit_config = [which](int r, mokLayerConfig_t& c) {
      c.activation = which == 0 && r != 1 ? mokActivationSwiglu : mokActivationSwigluOai;
      c.swiglu_alpha = which == 1 && r == 1 ? 0.75f : 1.702f;
    };
    double ms = g.run([](Rank& r) { r.schedule(); });
    CHECK_MSG(ms < kFastMs, "took %.0f ms", ms);
    const char* field = which == 0 ? "'config.activation'" : "'config.swiglu_alpha'";
    const char* value = which == 0 ? "(1)" : "(0.75)";
    for (auto& r : g.ranks)
      CHECK_MSG(r->status == mokInvalidArgument && contains(r->detail, field) && contains(r->detail, value),
                "rank %d: %s: %s", r->r, mokGetStatusString(r->status), r->detail.c_str());
  }
}

// Rank 0 and rank 1 make different collective calls from a valid state: both fail with
// mokInvalidUsage naming both calls; neither hangs, neither succeeds.
TEST(ranks_making_different_calls_all_fail) {
  struct Case {
    const char* name;
    bool forward_first;  // both ranks run a forward after the schedule first
    mokStatus_t (Rank::*call0)();
    mokStatus_t (Rank::*call1)();
    const char *name0, *name1;
  };
  const Case cases[] = {
      {"forward vs recompute", false, &Rank::forward, &Rank::recompute, "mokLayerForward", "mokLayerRecompute"},
      {"schedule vs forward", false, &Rank::schedule, &Rank::forward, "mokLayerBuildSchedule", "mokLayerForward"},
      {"forward vs backward", true, &Rank::forward, &Rank::backward, "mokLayerForward", "mokLayerBackward"},
  };
  for (const Case& c : cases) {
    ref::Problem p = problem(2, 31);
    Group g(p, kLongTimeoutMs);
    double ms = g.run([&](Rank& r) {
      if (r.schedule() != mokSuccess || (c.forward_first && r.forward() != mokSuccess)) return;
      (r.*(r.r == 0 ? c.call0 : c.call1))();
    });
    CHECK_MSG(ms < kFastMs, "%s: took %.0f ms", c.name, ms);
    for (auto& r : g.ranks) {
      std::printf("  %s: rank %d: %s\n", c.name, r->r, r->detail.c_str());
      CHECK_MSG(r->status == mokInvalidUsage && contains(r->detail, c.name0) && contains(r->detail, c.name1),
                "%s: rank %d: %s: %s", c.name, r->r, mokGetStatusString(r->status), r->detail.c_str());
      mokLayerError_t e = r->error();
      CHECK_MSG(e.status == mokInvalidUsage && contains(e.detail, c.name1), "%s: rank %d: record %d '%s'", c.name, r->r,
                e.status, e.detail);
    }
  }
}

// A rank that rejects its arguments (or refuses its call) tells its peers: they return mokPeerAbort
// at once with its reason; it returns its own status and writes nothing; the group is finished.
TEST(rejected_arguments_reach_every_rank) {
  struct Case {
    const char* name;
    bool scheduled;                         // every rank built a schedule before
    mokStatus_t (Rank::*good)();            // what ranks 0 and 2 call
    std::function<mokStatus_t(Rank&)> bad;  // what rank 1 calls
    mokStatus_t bad_status;
    const char* reason;
  };
  auto bad_id = [](Rank& r) {
    r.ids[3 * r.p.top_k] = 99;  // [3][0]; world * experts_per_rank = 6
    return r.schedule();
  };
  auto no_x = [](Rank& r) {
    return r.note(mokLayerForward(r.layer, &r.w, nullptr, r.p.topk_weights[r.r].data(), r.out.data(), nullptr));
  };
  const Case cases[] = {
      {"first call, bad id", false, &Rank::schedule, bad_id, mokInvalidArgument,
       "rank 1 rejected its arguments: mokLayerBuildSchedule: argument 'topk_ids' [3][0] = 99"},
      {"later call, bad id", true, &Rank::schedule, bad_id, mokInvalidArgument,
       "rank 1 rejected its arguments: mokLayerBuildSchedule: argument 'topk_ids' [3][0] = 99"},
      {"forward without x", true, &Rank::forward, no_x, mokInvalidArgument,
       "rank 1 rejected its arguments: mokLayerForward: argument 'x'"},
      {"backward before a forward", true, &Rank::forward, [](Rank& r) { return r.backward(); }, mokInvalidUsage,
       "rank 1 rejected its call: mokLayerBackward: needs a mokLayerForward"},
  };
  for (const Case& c : cases) {
    ref::Problem p = problem(3, 41, 6, false);
    Group g(p, kLongTimeoutMs);
    mokStatus_t first[3] = {};
    std::string first_detail[3];
    double ms = g.run([&](Rank& r) {
      if (c.scheduled && r.schedule() != mokSuccess) return;
      if (r.r == 1) {
        c.bad(r);
        return;
      }
      first[r.r] = (r.*c.good)();
      first_detail[r.r] = r.detail;
      r.schedule();  // the group is finished: later calls fail too
    });
    CHECK_MSG(ms < kFastMs, "%s: took %.0f ms", c.name, ms);
    Rank& bad = *g.ranks[1];
    CHECK_MSG(bad.status == c.bad_status, "%s: rank 1: %s: %s", c.name, mokGetStatusString(bad.status),
              bad.detail.c_str());
    CHECK_MSG(bad.error().status == c.bad_status, "%s: rank 1's record: %d", c.name, bad.error().status);
    for (uint16_t v : bad.out) CHECK(v == 0xbeef);  // nothing written
    for (uint16_t v : bad.grads.dx) CHECK(v == 0xbeef);
    for (int r : {0, 2}) {
      Rank& peer = *g.ranks[r];
      std::printf("  %s: rank %d: %s\n", c.name, r, first_detail[r].c_str());
      CHECK_MSG(first[r] == mokPeerAbort && contains(first_detail[r], c.reason), "%s: rank %d: %s: %s", c.name, r,
                mokGetStatusString(first[r]), first_detail[r].c_str());
      CHECK_MSG(peer.status == mokPeerAbort && contains(peer.detail, c.reason), "%s: rank %d: %s: %s", c.name, r,
                mokGetStatusString(peer.status), peer.detail.c_str());
      mokLayerError_t e = peer.error();
      CHECK_MSG(e.status == mokPeerAbort && contains(e.detail, c.reason), "%s: rank %d: record %d '%s'", c.name, r,
                e.status, e.detail);
    }
  }
}

// mokLayerAbort before a rank's first collective call still reaches its peers, through that call.
TEST(abort_before_the_first_call_reaches_peers) {
  ref::Problem p = problem(3, 61);
  Group g(p, kLongTimeoutMs);
  double ms = g.run([](Rank& r) {
    if (r.r == 2) CHECK(mokLayerAbort(r.layer, nullptr) == mokSuccess);
    r.schedule();
  });
  CHECK_MSG(ms < kFastMs, "took %.0f ms", ms);
  for (auto& r : g.ranks)
    CHECK_MSG(r->status == mokPeerAbort, "rank %d: %s: %s", r->r, mokGetStatusString(r->status), r->detail.c_str());
}

// A rank that never creates its context: the first collective call runs out, naming the formation
// wait and the missing rank.
TEST(missing_rank_names_the_formation_wait) {
  ref::Problem p = problem(2, 51);
  Group g(p, 300);
  double ms = g.run([](Rank& r) {
    if (r.r == 0) r.schedule();
  });
  Rank& r0 = *g.ranks[0];
  CHECK_MSG(ms < 300 + kFastMs, "took %.0f ms", ms);
  CHECK_MSG(r0.status == mokTimeout && contains(r0.detail, "group formation") && contains(r0.detail, "rank 1"),
            "rank 0: %s: %s", mokGetStatusString(r0.status), r0.detail.c_str());
  CHECK(std::string(r0.error().wait) == "group formation");
}

MOK_TEST_MAIN
