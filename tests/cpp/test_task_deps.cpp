// core/task_deps.hpp against the tasks themselves. For random shapes and ragged routings (token counts that
// differ per rank, 0 included, -1 routes, a hot expert), the schedule is built with core's build_schedule and
// the task graph with core's lay_out_tasks over core's own workspace layout; then the real tasks
// (core::run_task, tile GEMMs and row jobs a no-op) run in a random interleaving of 1 + 1 to 3 + 5 workers taking their
// queues in order, forward or recompute, then a backward (kept when every row fits the ring), then a plain one.
// At every step, for every taken task:
//   - the listed waits (task_waits) read on the real counters, and the resolved task ids
//     (resolve_task_deps) read on the set of finished tasks, agree on whether it may start;
//   - a task they say may start runs through core's run_task without a failure, and afterwards every counter
//     word equals a shadow copy that applied task_bumps' list;
//   - a task they say must wait, run by core with a tiny timeout, times out in the first unmet listed wait.
// And the ids point backwards: a dependency in the same queue comes earlier in it, and one comm plus one
// compute worker taking both queues strictly in order (the fewest workers a pass may have) never gets stuck.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "check.hpp"
#include "core/pass_worker.hpp"
#include "core/task_deps.hpp"

namespace core = mok::core;
using core::PassKind;
using core::TaskKind;

namespace {

// The executor's tile ops and row jobs with no arithmetic and no moves: the waits and bumps are under test, not
// the math.
struct NoTiles {
  float* scratch;
  core::bf16_t* chunk;
  float* sums;
  void gemm(const core::Gemm&) {}
  void rows(const core::PassView&, const core::RowJob&) {}
  bool stop_here(const core::PassView&, int64_t, const core::Task*) const { return false; }
};

core::LayerShape random_shape(std::mt19937_64& rng) {
  auto pick = [&](std::initializer_list<int> v) { return *(v.begin() + rng() % v.size()); };
  core::LayerShape s{};
  s.world = pick({1, 2, 3});
  s.rank = static_cast<int>(rng() % s.world);
  s.experts_per_rank = pick({1, 2, 3, 5});
  s.hidden = pick({32, 256, 300});
  s.intermediate = pick({32, 257, 520});
  s.top_k = pick({1, 2, 3});
  s.max_tokens = pick({1, 5, 16, 33});
  s.shared_intermediate = pick({0, 0, 32});
  s.swiglu_limit = 1e30f;
  s.expert_padding = pick({1, 2, 4});
  s.minibatch = s.expert_padding * pick({1, 2, 3});
  s.macrobatch = s.minibatch * pick({1, 2, 3, 5});
  s.comm_workers = 1;
  s.compute_workers = 1;
  return s;
}

// A rank's memory and one pass's view over it: the workspace, every rank's peer buffer, the weights and
// the call's tensors (zeros: only the bytes' places matter here).
struct Fixture {
  core::LayerShape s;
  core::LocalLayout l;
  std::vector<uint64_t> work;
  std::vector<std::vector<uint64_t>> peer_bytes;
  std::vector<char*> peers;
  std::vector<core::PeerHeader*> headers;
  std::vector<core::bf16_t> weights, grads;
  core::PassArgs args{};
  std::vector<std::vector<int32_t>> ids;
  std::vector<int32_t> tokens;

  explicit Fixture(const core::LayerShape& shape, std::mt19937_64& rng) : s(shape), l(core::local_layout(s)) {
    work.assign(l.bytes / 8 + 1, 0);
    size_t peer = core::peer_layout(s).bytes / 8 + 1;
    for (int r = 0; r < s.world; ++r) peer_bytes.emplace_back(peer, 0);
    for (auto& p : peer_bytes) {
      peers.push_back(reinterpret_cast<char*>(p.data()));
      headers.push_back(reinterpret_cast<core::PeerHeader*>(p.data()));
    }
    size_t ih = static_cast<size_t>(s.experts_per_rank) * s.intermediate * s.hidden;
    weights.assign(ih + static_cast<size_t>(s.shared_intermediate) * s.hidden + 1, 0);
    grads.assign(3 * ih, 0);
    args.ddown = grads.data();
    args.dgate = grads.data() + ih;
    args.dup = grads.data() + 2 * ih;
    // Ragged routing: each rank's token count in [0, max_tokens], ids uniform, one hot expert, or -1.
    int experts = s.world * s.experts_per_rank, hot = static_cast<int>(rng() % experts);
    int pattern = static_cast<int>(rng() % 3);
    for (int r = 0; r < s.world; ++r) {
      tokens.push_back(static_cast<int32_t>(rng() % (s.max_tokens + 1)));
      std::vector<int32_t> v(static_cast<size_t>(s.max_tokens) * s.top_k + 1, 0);
      for (int64_t i = 0; i < static_cast<int64_t>(tokens.back()) * s.top_k; ++i) {
        int roll = static_cast<int>(rng() % 8);
        v[i] = roll == 0 ? -1 : (pattern == 1 && roll < 6 ? hot : static_cast<int>(rng() % experts));
      }
      ids.push_back(v);
    }
  }

  core::PassView view(PassKind kind) {
    char* local = reinterpret_cast<char*>(work.data());
    core::PassView v = core::pass_view_at(s, kind, local, peers.data(), headers.data(), nullptr, tokens[s.rank], 0,
                                          5000, nullptr);  // 5 µs: a probe of a task that must wait times out
    std::vector<const int32_t*> rows;
    for (auto& r : ids) rows.push_back(r.data());
    core::Routing routing{rows.data(), tokens.data()};
    core::build_schedule(s, routing, v.sched);
    const core::bf16_t* w = weights.data();
    v.w.gate = v.w.up = v.w.down = w;
    v.w.shared_gate = v.w.shared_up = v.w.shared_down = w;
    v.args = &args;
    core::lay_out_tasks(v);
    std::memset(local + l.counters, 0, core::counter_bytes(s));
    return v;
  }
};

uint32_t* counter_at(const core::PassView& v, core::CounterKind c, int64_t i) {
  switch (c) {
    case core::CounterKind::ready: return v.c.ready + i;
    case core::CounterKind::stage: return v.c.stage + i;
    case core::CounterKind::done: return v.c.done + i;
    case core::CounterKind::freed: return v.c.freed + i;
    case core::CounterKind::wdone: return v.c.wdone + i;
    case core::CounterKind::wchain: return v.c.wchain + i;
    default: return v.c.shared + i;
  }
}

// The first listed wait not met on the counters `words` (counter_word's index space), or -1: the task may start.
int first_unmet(const core::PassView& v, const core::Task& t, const std::vector<uint32_t>& words,
                core::CounterWait* waits) {
  int n = core::task_waits(v.s, v.kind, v.sched, v.graph, t, waits);
  for (int k = 0; k < n; ++k)
    for (int64_t i = waits[k].first; i < waits[k].end; ++i)
      if (words[static_cast<size_t>(core::counter_word(v.s, waits[k].counter) + i)] < waits[k].target) return k;
  return -1;
}

// The real counters in counter_word's index space: counters_at lays them out from v.c.ready in that order.
std::vector<uint32_t> read_words(const core::PassView& v) {
  return std::vector<uint32_t>(v.c.ready, v.c.ready + core::counter_words(v.s));
}

void apply_bumps(const core::PassView& v, const core::Task& t, std::vector<uint32_t>& words) {
  core::CounterBump bumps[core::kMaxTaskBumps];
  for (int b = 0, n = core::task_bumps(v.s, v.kind, v.graph, t, bumps); b < n; ++b)
    for (int64_t i = bumps[b].first; i < bumps[b].end; ++i) {
      uint32_t& w = words[static_cast<size_t>(core::counter_word(v.s, bumps[b].counter) + i)];
      w = bumps[b].set ? bumps[b].value : w + 1;
    }
}

struct Worker {
  int queue;
  int64_t task = -1;  // task id taken, -1: idle
};

// One pass: returns an empty string, or what went wrong.
std::string run_pass(Fixture& f, PassKind kind, int comm, int compute, std::mt19937_64& rng, int64_t* ran) {
  core::PassView v = f.view(kind);
  const core::TaskGraph& g = v.graph;
  for (int c = 0; c < static_cast<int>(core::CounterKind::count); ++c) {
    auto kind = static_cast<core::CounterKind>(c);
    if (counter_at(v, kind, 0) != v.c.ready + core::counter_word(v.s, kind)) return "counter_word is not counters_at";
  }
  std::vector<int64_t> start, deps;
  if (!core::resolve_task_deps(v.s, kind, v.sched, g, start, deps)) return "a wait no producer can meet";
  int64_t n = g.num_comm + g.num_compute;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = start[t]; d < start[t + 1]; ++d)
      if ((deps[d] < g.num_comm) == (t < g.num_comm) && deps[d] >= t) return "a dependency later in its own queue";
  // One worker of each class, both queues strictly in order, on the ids alone.
  {
    std::vector<char> finished(static_cast<size_t>(n), 0);
    int64_t head[2] = {0, g.num_comm}, end[2] = {g.num_comm, n};
    for (bool moved = true; moved;) {
      moved = false;
      for (int q = 0; q < 2; ++q) {
        if (head[q] == end[q]) continue;
        bool ready = true;
        for (int64_t d = start[head[q]]; ready && d < start[head[q] + 1]; ++d) ready = finished[deps[d]];
        if (ready) finished[head[q]++] = 1, moved = true;
      }
    }
    if (head[0] != end[0] || head[1] != end[1]) return "1 + 1 workers in queue order get stuck";
  }
  NoTiles ops{v.scratch, v.chunk, v.sums};
  std::vector<char> finished(static_cast<size_t>(n), 0);
  std::vector<uint32_t> shadow = read_words(v);
  std::vector<Worker> workers;
  for (int i = 0; i < comm; ++i) workers.push_back(Worker{0});
  for (int i = 0; i < compute; ++i) workers.push_back(Worker{1});
  int64_t head[2] = {0, g.num_comm}, end[2] = {g.num_comm, n};
  core::CounterWait waits[core::kMaxTaskWaits];
  for (;;) {
    std::vector<int> can, blocked;
    for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
      Worker& w = workers[i];
      if (w.task < 0) {
        if (head[w.queue] < end[w.queue]) can.push_back(i);
        continue;
      }
      bool by_ids = true;
      for (int64_t d = start[w.task]; by_ids && d < start[w.task + 1]; ++d) by_ids = finished[deps[d]];
      bool by_counters = first_unmet(v, core::task_at(g, w.task), shadow, waits) < 0;
      if (by_ids != by_counters)
        return std::string(core::task_name(static_cast<int>(core::task_at(g, w.task).kind))) +
               ": its task ids and its counter waits disagree";
      (by_ids ? can : blocked).push_back(i);
    }
    // Now and then a task that must wait is run by core: it must time out in its first unmet wait.
    if (!blocked.empty() && rng() % 3 == 0) {
      const core::Task& t = core::task_at(g, workers[blocked[rng() % blocked.size()]].task);
      int k = first_unmet(v, t, shadow, waits);
      core::Failure fail = core::run_task(v, t, ops);
      if (fail.ok())
        return std::string(core::task_name(static_cast<int>(t.kind))) + " ran though a listed wait is unmet";
      if (fail.wait != waits[k].what)
        return std::string(core::task_name(static_cast<int>(t.kind))) + " waited on " + core::wait_name(fail.wait) +
               ", listed first unmet: " + core::wait_name(waits[k].what);
      if (read_words(v) != shadow) return "a task that waited changed a counter";
    }
    if (can.empty()) break;
    Worker& w = workers[can[rng() % can.size()]];
    if (w.task < 0) {
      w.task = head[w.queue]++;
      continue;
    }
    const core::Task& t = core::task_at(g, w.task);
    core::Failure fail = core::run_task(v, t, ops);
    if (!fail.ok())
      return std::string(core::task_name(static_cast<int>(t.kind))) + " failed in " + core::wait_name(fail.wait) +
             " though its listed waits are met";
    apply_bumps(v, t, shadow);
    if (read_words(v) != shadow)
      return std::string(core::task_name(static_cast<int>(t.kind))) + ": its counters differ from its listed bumps";
    finished[w.task] = 1;
    w.task = -1;
    ++*ran;
  }
  for (int64_t t = 0; t < n; ++t)
    if (!finished[t]) return "stuck: a task never ran";
  return "";
}

TEST(listed_dependencies_match_the_tasks_waits_and_bumps) {
  std::mt19937_64 rng(mok_test::seed());
  const int worker_sets[][2] = {{1, 1}, {1, 3}, {2, 2}, {3, 5}};
  int passes = 0, failed = 0;
  int64_t ran = 0;
  for (int iter = 0; iter < 300 && failed < 3; ++iter) {
    core::LayerShape s = random_shape(rng);
    Fixture f(s, rng);
    const int* wk = worker_sets[iter % 4];
    bool fits = f.view(PassKind::forward).sched.total_rows <= s.macrobatch;
    PassKind seq[3] = {iter % 3 == 0 ? PassKind::recompute : PassKind::forward,
                       fits ? PassKind::backward_kept : PassKind::backward, PassKind::backward};
    for (PassKind kind : seq) {
      std::string why = run_pass(f, kind, wk[0], wk[1], rng, &ran);
      ++passes;
      if (why.empty()) continue;
      ++failed;
      CHECK_MSG(false,
                "%s: pass %d, world %d, E_local %d, P %d, minibatch %d, macrobatch %d, H %d, I %d, workers %d + %d",
                why.c_str(), static_cast<int>(kind), s.world, s.experts_per_rank, s.expert_padding, s.minibatch,
                s.macrobatch, s.hidden, s.intermediate, wk[0], wk[1]);
      break;
    }
  }
  std::printf("  %d passes, %lld tasks run by core against their listed dependencies\n", passes,
              static_cast<long long>(ran));
}

}  // namespace

MOK_TEST_MAIN
