// core's task graph by brute force: schedules built with core's own functions for random and adversarial
// shapes and routings (every row to one expert, tiny experts, empty experts interleaved, R = 1,
// minibatch == expert_padding, macrobatch barely above minibatch). For each: the parts, slots, tasks and
// counters stay within shape.hpp's bounds, and a simulation of the two queues finishes. The simulation
// models every wait and every counter bump as compute_tasks.hpp and comm_tasks.hpp do them; workers take
// tasks in queue order and run them atomically in a random interleaving (1 + 1 workers and more), and
// every ring row (x, dy, g, u, h per column block, the output ring) carries the tile and value it holds,
// so a task that reads a row some other tile (or stage) overwrote fails the check.
#include <cstdint>
#include <random>
#include <vector>

#include "check.hpp"
#include "core/pass.hpp"

namespace core = mok::core;
using core::PassKind;
using core::TaskKind;

namespace {

// What a ring row holds: the tile it belongs to and which value of that tile.
enum Value : int { none = 0, x_value, dy_value, g_value, dg_value, h_value, dh_value, y_value, dx_value };
struct Held {
  int64_t tile = -1;
  int value = none;
  bool operator==(const Held& o) const { return tile == o.tile && value == o.value; }
};

// A ring of `slots` tile rows, `blocks` column blocks each.
struct Ring {
  int blocks = 1;
  std::vector<Held> rows;
  void init(int64_t slots, int b) {
    blocks = b;
    rows.assign(static_cast<size_t>(slots * b), Held{});
  }
  Held& at(int64_t slot, int block) { return rows[static_cast<size_t>(slot * blocks + block)]; }
};

struct Setup {
  core::LayerShape s;
  std::vector<int32_t> counts;  // rows per local expert
  int tokens;
};

struct Sim {
  const core::LayerShape& s;
  PassKind kind;
  core::Schedule sched;
  core::TaskGraph g;
  std::vector<uint32_t> words;
  core::Counters c;
  Ring& x;
  Ring& dy;
  Ring& gr;
  Ring& ur;
  Ring& hr;
  Ring& out;
  std::vector<int> written;      // [expert][wgrad task]: write_block calls
  std::vector<Held> slot_state;  // [slot][wgrad task]: (expert, next part number)
  std::vector<int> covered;      // tiles summed into weight gradients
  bool ok = true;
  const char* why = "";

  int64_t tile_slot(int64_t t) const { return (t * s.expert_padding % s.macrobatch) / s.expert_padding; }
  int64_t out_slot(int64_t t) const { return (t * s.expert_padding % core::out_ring_rows(s)) / s.expert_padding; }
  int64_t tile_mb(int64_t t) const { return core::tile_minibatch(s, t); }
  void fail(const char* w) {
    if (ok) why = w;
    ok = false;
  }
  void expect(Ring& r, int64_t slot, int block, int64_t tile, int value, const char* w) {
    if (!(r.at(slot, block) == Held{tile, value})) fail(w);
  }
  void expect_all(Ring& r, int64_t slot, int64_t tile, int value, const char* w) {
    for (int b = 0; b < r.blocks; ++b) expect(r, slot, b, tile, value, w);
  }
  void put_all(Ring& r, int64_t slot, int64_t tile, int value) {
    for (int b = 0; b < r.blocks; ++b) r.at(slot, b) = Held{tile, value};
  }
  uint32_t& word(uint32_t* base, int64_t i, int64_t bound, const char* w) {
    if (i < 0 || i >= bound) {
      fail(w);
      return words.back();
    }
    return base[i];
  }
  uint32_t& ready(int64_t m) { return word(c.ready, m, core::max_minibatches(s), "ready index out of range"); }
  uint32_t& done(int64_t m) { return word(c.done, m, core::max_minibatches(s), "done index out of range"); }
  uint32_t& freed(int64_t m) { return word(c.freed, m, core::max_minibatches(s), "freed index out of range"); }
  uint32_t& wdone(int64_t m) { return word(c.wdone, m, core::max_minibatches(s), "wdone index out of range"); }
  uint32_t& stage(int64_t t) { return word(c.stage, t, core::max_tiles(s), "stage index out of range"); }

  core::PassView view() const {
    core::PassView v{};
    v.s = s;
    v.kind = kind;
    v.sched = sched;
    v.graph = g;
    return v;
  }

  // The waits of a task, as the code makes them: true when all of them are met now.
  bool runnable(const core::Task& task) {
    core::PassView v = view();
    int64_t ring = core::ring_minibatches(s);
    switch (task.kind) {
      case TaskKind::dispatch: {
        int64_t m = task.index;
        if (m < ring) return true;
        if (freed(m - ring) < 1) return false;
        return !core::is_backward(kind) || wdone(m - ring) >= core::wgrad_tasks_over(v, m - ring);
      }
      case TaskKind::combine: {
        int64_t m = task.index;
        int64_t tiles = core::minibatch_end_tile(s, m, sched.total_rows) - core::minibatch_first_tile(s, m);
        return done(m) >= static_cast<uint32_t>(tiles) * static_cast<uint32_t>(core::last_stage(s, kind).tasks);
      }
      case TaskKind::shared: return !core::is_backward(kind) || *c.shared >= static_cast<uint32_t>(task.index);
      case TaskKind::wgrad: {
        const core::WgradPart& p = g.parts[task.index];
        for (int64_t t = p.first_tile; t < p.end_tile; ++t)
          if (stage(t) < core::tile_finished(s, kind)) return false;
        if (p.slot >= 0 && !p.first) {
          int64_t i = static_cast<int64_t>(p.slot) * core::wgrad_tasks_per_part(s) + task.block;
          if (word(c.wchain, i, core::max_slots(s) * core::wgrad_tasks_per_part(s), "wchain index out of range") <
              static_cast<uint32_t>(p.number))
            return false;
        }
        return true;
      }
      default: {
        int64_t t = task.index, mb = tile_mb(t);
        uint32_t start = core::stage_start(s, kind, task.kind);
        if (start == 0 ? ready(mb) < 1 : stage(t) < start) return false;
        if (task.kind == TaskKind::down || task.kind == TaskKind::dgrad_x) {
          int64_t held = core::out_ring_rows(s) / s.minibatch;
          if (mb >= held && freed(mb - held) < 1) return false;
        }
        return true;
      }
    }
  }

  void finish_tile_task(const core::Task& task) {
    ++stage(task.index);
    if (core::last_stage(s, kind).kind == task.kind) ++done(tile_mb(task.index));
  }

  // The task's reads (checked against what the rings hold), writes and bumps.
  void run(const core::Task& task) {
    int64_t t = task.index;
    bool backward = core::is_backward(kind);
    switch (task.kind) {
      case TaskKind::dispatch:
        for (int64_t u = core::minibatch_first_tile(s, t); u < core::minibatch_end_tile(s, t, sched.total_rows); ++u) {
          if (kind != PassKind::backward_kept) x.at(tile_slot(u), 0) = Held{u, x_value};
          if (backward) dy.at(tile_slot(u), 0) = Held{u, dy_value};
        }
        ready(t) = 1;
        return;
      case TaskKind::combine:
        for (int64_t u = core::minibatch_first_tile(s, t); u < core::minibatch_end_tile(s, t, sched.total_rows); ++u)
          expect_all(out, out_slot(u), u, backward ? dx_value : y_value, "combine reads an overwritten output row");
        freed(t) = 1;
        return;
      case TaskKind::shared:
        if (backward) *c.shared = static_cast<uint32_t>(t + 1);
        return;
      case TaskKind::gate_up:
        expect(x, tile_slot(t), 0, t, x_value, "gate_up reads a row that is not its x");
        gr.at(tile_slot(t), task.block) = Held{t, g_value};
        ur.at(tile_slot(t), task.block) = Held{t, g_value};
        return finish_tile_task(task);
      case TaskKind::swiglu:
        expect_all(gr, tile_slot(t), t, g_value, "swiglu reads a g that is not its tile's");
        expect_all(ur, tile_slot(t), t, g_value, "swiglu reads a u that is not its tile's");
        put_all(hr, tile_slot(t), t, h_value);
        return finish_tile_task(task);
      case TaskKind::down:
        expect_all(hr, tile_slot(t), t, h_value, "down reads an h that is not its tile's");
        out.at(out_slot(t), task.block) = Held{t, y_value};
        return finish_tile_task(task);
      case TaskKind::dgrad_h:
        expect(dy, tile_slot(t), 0, t, dy_value, "dgrad_h reads a dy that is not its tile's");
        hr.at(tile_slot(t), task.block) = Held{t, dh_value};
        return finish_tile_task(task);
      case TaskKind::swiglu_bwd:
        expect_all(gr, tile_slot(t), t, g_value, "swiglu_bwd reads a g that is not its tile's");
        expect_all(ur, tile_slot(t), t, g_value, "swiglu_bwd reads a u that is not its tile's");
        expect_all(hr, tile_slot(t), t, dh_value, "swiglu_bwd reads a dh that is not its tile's");
        put_all(gr, tile_slot(t), t, dg_value);
        put_all(ur, tile_slot(t), t, dg_value);
        put_all(hr, tile_slot(t), t, h_value);
        return finish_tile_task(task);
      case TaskKind::dgrad_x:
        expect_all(gr, tile_slot(t), t, dg_value, "dgrad_x reads a dg that is not its tile's");
        expect_all(ur, tile_slot(t), t, dg_value, "dgrad_x reads a du that is not its tile's");
        out.at(out_slot(t), task.block) = Held{t, dx_value};
        return finish_tile_task(task);
      case TaskKind::wgrad: return run_wgrad(task);
      default: fail("unknown task kind");
    }
  }

  void run_wgrad(const core::Task& task) {
    const core::WgradPart& p = g.parts[task.index];
    core::WgradBlock b = core::wgrad_block(s, task.block);
    int w = core::wgrad_tasks_per_part(s);
    for (int64_t t = p.first_tile; t < p.end_tile; ++t) {
      int64_t slot = tile_slot(t);
      if (core::tile_expert(s, sched, t) != p.expert) fail("a part holds another expert's tile");
      if (task.block == 0) ++covered[static_cast<size_t>(t)];
      if (b.matrix == 0) {
        expect(dy, slot, 0, t, dy_value, "wgrad reads a dy that is not its tile's");
        expect_all(hr, slot, t, h_value, "wgrad reads an h that is not its tile's");
      } else {
        expect(b.matrix == 1 ? gr : ur, slot, b.row0 / core::kColumnBlock, t, dg_value,
               "wgrad reads a dg / du that is not its tile's");
        expect(x, slot, 0, t, x_value, "wgrad reads an x that is not its tile's");
      }
    }
    if (p.slot >= 0) {
      if (p.slot >= core::max_slots(s)) return fail("slot beyond max_slots");
      Held& st = slot_state[static_cast<size_t>(p.slot * w + task.block)];
      if (p.first) st = Held{p.expert, 0};
      if (!(st == Held{p.expert, p.number})) fail("a part's sums continue another part's");
      st.value = p.number + 1;
      c.wchain[p.slot * w + task.block] = static_cast<uint32_t>(p.number + 1);
    } else if (!(p.first && p.last)) {
      fail("an expert with several parts has no slot");
    }
    if (p.last) ++written[static_cast<size_t>(p.expert * w + task.block)];
    if (p.end_tile > p.first_tile)
      for (int64_t m = tile_mb(p.first_tile); m <= tile_mb(p.end_tile - 1); ++m) ++wdone(m);
  }
};

// One worker: the task it took (none: idle) and its queue.
struct Worker {
  int queue;
  const core::Task* task = nullptr;
};

// Runs a pass of `kind` on `rings` (which carry over from the pass before) with the given workers.
// Returns false (and says why) on a stuck graph or a bad read.
bool simulate(const Setup& setup, PassKind kind, core::Schedule sched, Ring* rings, int comm_workers,
              int compute_workers, std::mt19937_64& rng, const char** why) {
  const core::LayerShape& s = setup.s;
  std::vector<core::Task> tasks(static_cast<size_t>(4 * core::max_tasks(s) + 64));
  std::vector<core::WgradPart> parts(static_cast<size_t>(4 * core::max_parts(s) + 64));
  core::TaskGraph g{};
  g.comm = tasks.data();
  g.compute = g.comm + core::max_minibatches(s) * 2;  // as host/layer.cpp lays them out
  g.parts = parts.data();
  core::build_task_graph(s, kind, sched, setup.tokens, g);
  Sim sim{s, kind, sched, g, {}, {}, rings[0], rings[1], rings[2], rings[3], rings[4], rings[5], {}, {}, {}};
  if (g.num_comm > core::max_minibatches(s) * 2) return *why = "comm queue runs into the compute queue", false;
  if (g.num_comm + g.num_compute > core::max_tasks(s)) return *why = "more tasks than max_tasks", false;
  if (g.num_parts > core::max_parts(s)) return *why = "more parts than max_parts", false;
  sim.words.assign(static_cast<size_t>(core::num_counters(s) + 1), 0);
  sim.c = core::counters_at(s, sim.words.data());
  if (sim.c.sync + core::kSyncWords > sim.words.data() + core::num_counters(s))
    return *why = "counters beyond num_counters", false;
  int w = core::wgrad_tasks_per_part(s);
  sim.written.assign(static_cast<size_t>(s.experts_per_rank * w), 0);
  sim.slot_state.assign(static_cast<size_t>((core::max_slots(s) + 1) * w), Held{});
  int64_t tiles = sched.total_rows / s.expert_padding;
  sim.covered.assign(static_cast<size_t>(tiles), 0);
  std::vector<Worker> workers;
  for (int i = 0; i < comm_workers; ++i) workers.push_back(Worker{0});
  for (int i = 0; i < compute_workers; ++i) workers.push_back(Worker{1});
  int64_t heads[2] = {0, 0}, lengths[2] = {g.num_comm, g.num_compute};
  const core::Task* queues[2] = {g.comm, g.compute};
  std::vector<int> actions;
  for (;;) {
    actions.clear();
    for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
      Worker& wk = workers[static_cast<size_t>(i)];
      if (wk.task ? sim.runnable(*wk.task) : heads[wk.queue] < lengths[wk.queue]) actions.push_back(i);
      if (!sim.ok) return *why = sim.why, false;
    }
    if (actions.empty()) break;
    Worker& wk = workers[static_cast<size_t>(actions[rng() % actions.size()])];
    if (!wk.task) {
      wk.task = queues[wk.queue] + heads[wk.queue]++;
      continue;
    }
    sim.run(*wk.task);
    wk.task = nullptr;
    if (!sim.ok) return *why = sim.why, false;
  }
  for (const Worker& wk : workers)
    if (wk.task) return *why = "stuck: a taken task waits forever", false;
  for (int64_t m = 0; m < core::num_minibatches(s, sched.total_rows); ++m)
    if (sim.words[static_cast<size_t>(sim.c.freed - sim.words.data() + m)] != 1)
      return *why = "a minibatch never combined", false;
  if (core::is_backward(kind)) {
    for (int v : sim.written)
      if (v != 1) return *why = "a weight-gradient block not written exactly once", false;
    for (int64_t t = 0; t < tiles; ++t) {
      int e = core::tile_expert(s, sched, t);
      bool has_rows = core::tile_rows(s, sched, t, e) > 0;
      if (sim.covered[static_cast<size_t>(t)] != (has_rows ? 1 : 0))
        return *why = "a tile's rows not summed exactly once", false;
    }
    int64_t slots = 0;
    for (int64_t p = 0; p < g.num_parts; ++p) slots = g.parts[p].slot + 1 > slots ? g.parts[p].slot + 1 : slots;
    if (slots > core::max_slots(s)) return *why = "more slots than max_slots", false;
  }
  return true;
}

core::LayerShape random_shape(std::mt19937_64& rng) {
  auto pick = [&](std::initializer_list<int> v) { return *(v.begin() + rng() % v.size()); };
  core::LayerShape s{};
  s.world = pick({1, 2, 3});
  s.rank = static_cast<int>(rng() % s.world);
  s.experts_per_rank = pick({1, 2, 3, 5, 8});
  s.hidden = pick({64, 256, 300, 600});
  s.intermediate = pick({32, 256, 257, 520});
  s.top_k = pick({1, 2, 4});
  s.max_tokens = pick({1, 3, 8, 17, 40});
  s.shared_intermediate = pick({0, 0, 64});
  s.mxfp8 = 0;
  s.swiglu_limit = 1e30f;
  s.expert_padding = pick({1, 2, 4, 8});
  s.minibatch = s.expert_padding * pick({1, 1, 2, 3});
  s.macrobatch = s.minibatch * pick({1, 1, 2, 3, 5});
  s.comm_workers = 1;
  s.compute_workers = 1;
  return s;
}

// Rows per expert in one of the adversarial patterns, within the rows the shape allows.
std::vector<int32_t> routing(const core::LayerShape& s, int pattern, std::mt19937_64& rng) {
  int64_t cap = static_cast<int64_t>(s.world) * s.max_tokens * s.top_k;
  int64_t total = pattern == 0 ? cap : static_cast<int64_t>(rng() % (cap + 1));
  std::vector<int32_t> n(static_cast<size_t>(s.experts_per_rank), 0);
  int e0 = static_cast<int>(rng() % s.experts_per_rank);
  for (int64_t r = 0; r < total; ++r) {
    int e = 0;
    switch (pattern) {
      case 0:
      case 1: e = e0; break;                                                            // every row to one expert
      case 2: e = static_cast<int>(rng() % s.experts_per_rank); break;                  // random
      case 3: e = 2 * static_cast<int>(rng() % ((s.experts_per_rank + 1) / 2)); break;  // empty interleaved
      default: e = static_cast<int>(r % s.experts_per_rank); break;                     // tiny, spread
    }
    ++n[static_cast<size_t>(e)];
  }
  if (pattern == 4)  // every expert tiny: at most two rows each
    for (auto& v : n) v = v < 2 ? v : static_cast<int32_t>(rng() % 3);
  return n;
}

struct Built {
  std::vector<int32_t> experts;
  std::vector<core::RowRef> rows;
  core::Schedule sched;
};

void build(const core::LayerShape& s, const std::vector<int32_t>& counts, Built& b) {
  b.experts.assign(static_cast<size_t>(2 * s.experts_per_rank), 0);
  for (int e = 0; e < s.experts_per_rank; ++e) b.experts[static_cast<size_t>(2 * e)] = counts[static_cast<size_t>(e)];
  b.rows.assign(static_cast<size_t>(core::max_recv_rows(s)), core::RowRef{0, 0, 0});
  b.sched = core::Schedule{b.experts.data(), b.rows.data(), 0};
  core::lay_out_segments(s, b.sched);
}

void init_rings(const core::LayerShape& s, Ring* rings) {
  int64_t in_slots = s.macrobatch / s.expert_padding, out_slots = core::out_ring_rows(s) / s.expert_padding;
  int bi = core::column_blocks(s.intermediate), bh = core::column_blocks(s.hidden);
  rings[0].init(in_slots, 1);
  rings[1].init(in_slots, 1);
  rings[2].init(in_slots, bi);
  rings[3].init(in_slots, bi);
  rings[4].init(in_slots, bi);
  rings[5].init(out_slots, bh);
}

// Forward or recompute, then backward (kept when every row fits in the ring, as host/layer.cpp decides),
// then a plain backward, on several worker counts.
TEST(task_graphs_finish_within_their_bounds_and_never_read_an_overwritten_row) {
  std::mt19937_64 rng(mok_test::seed());
  int checked = 0, failed = 0;
  const int worker_sets[][2] = {{1, 1}, {1, 3}, {2, 5}, {3, 8}};
  for (int iter = 0; iter < 3000 && failed < 5; ++iter) {
    core::LayerShape s = random_shape(rng);
    int pattern = static_cast<int>(rng() % 5);
    Setup setup{s, routing(s, pattern, rng), static_cast<int>(rng() % (s.max_tokens + 1))};
    Built b;
    build(s, setup.counts, b);
    if (b.sched.total_rows > core::max_recv_rows(s)) {
      CHECK_MSG(false, "total rows %lld beyond max_recv_rows %lld", static_cast<long long>(b.sched.total_rows),
                static_cast<long long>(core::max_recv_rows(s)));
      continue;
    }
    const int* wk = worker_sets[iter % 4];
    Ring rings[6];
    init_rings(s, rings);
    bool fits = b.sched.total_rows <= s.macrobatch;
    PassKind seq[3] = {(iter / 4) % 2 ? PassKind::recompute : PassKind::forward,
                       fits ? PassKind::backward_kept : PassKind::backward, PassKind::backward};
    for (PassKind kind : seq) {
      const char* why = "";
      bool ok = simulate(setup, kind, b.sched, rings, wk[0], wk[1], rng, &why);
      ++checked;
      if (!ok) {
        ++failed;
        CHECK_MSG(ok,
                  "%s: pass %d, E_local %d, P %d, minibatch %d, macrobatch %d, H %d, I %d, rows %lld, pattern %d, "
                  "workers %d + %d",
                  why, static_cast<int>(kind), s.experts_per_rank, s.expert_padding, s.minibatch, s.macrobatch,
                  s.hidden, s.intermediate, static_cast<long long>(b.sched.total_rows), pattern, wk[0], wk[1]);
        break;
      }
    }
  }
  std::printf("  %d passes simulated\n", checked);
}

// The bounds are tight where they must be: every row to one expert and every expert tiny, R = 1 and
// minibatch == expert_padding, at the largest routing the shape allows.
TEST(worst_case_schedules_fit_the_bounds) {
  std::mt19937_64 rng(mok_test::seed() + 1);
  for (int e_local : {1, 2, 7}) {
    for (int r : {1, 2, 3}) {
      core::LayerShape s{};
      s.world = 2;
      s.experts_per_rank = e_local;
      s.hidden = 300;
      s.intermediate = 520;
      s.top_k = 2;
      s.max_tokens = 23;
      s.swiglu_limit = 1e30f;
      s.expert_padding = 1;
      s.minibatch = 1;
      s.macrobatch = r;
      s.comm_workers = s.compute_workers = 1;
      int64_t cap = static_cast<int64_t>(s.world) * s.max_tokens * s.top_k;
      // All rows to the last expert; then one row for each of the others and the rest to the last.
      std::vector<std::vector<int32_t>> routings(2, std::vector<int32_t>(static_cast<size_t>(e_local), 0));
      routings[0].back() = static_cast<int32_t>(cap);
      for (int e = 0; e + 1 < e_local; ++e) routings[1][static_cast<size_t>(e)] = 1;
      routings[1].back() = static_cast<int32_t>(cap - (e_local - 1));
      for (const auto& counts : routings) {
        Setup setup{s, counts, s.max_tokens};
        Built b;
        build(s, counts, b);
        Ring rings[6];
        init_rings(s, rings);
        for (PassKind kind : {PassKind::forward, PassKind::backward}) {
          const char* why = "";
          bool ok = simulate(setup, kind, b.sched, rings, 1, 1, rng, &why);
          CHECK_MSG(ok, "%s: E_local %d, R %d", why, e_local, r);
        }
      }
    }
  }
}

// The ring checks can fail: a kept backward right after a backward (which left dg, du in place of g, u)
// reads rows that are not its forward's, which is why host/layer.cpp keeps the ring for one backward only.
TEST(a_kept_backward_after_a_backward_is_caught) {
  std::mt19937_64 rng(mok_test::seed() + 2);
  core::LayerShape s = random_shape(rng);
  s.expert_padding = 4;
  s.minibatch = 8;
  s.macrobatch = 1 << 12;  // every row fits: the forward's rows are all still in the ring
  s.world = 2;
  s.max_tokens = 40;  // room for 5 rows per expert
  Setup setup{s, std::vector<int32_t>(static_cast<size_t>(s.experts_per_rank), 5), s.max_tokens};
  Built b;
  build(s, setup.counts, b);
  Ring rings[6];
  init_rings(s, rings);
  const char* why = "";
  CHECK(simulate(setup, PassKind::forward, b.sched, rings, 1, 2, rng, &why));
  CHECK(simulate(setup, PassKind::backward_kept, b.sched, rings, 1, 2, rng, &why));
  why = "";
  CHECK(!simulate(setup, PassKind::backward_kept, b.sched, rings, 1, 2, rng, &why));
  std::printf("  second kept backward: %s\n", why);
}

// Every expert with several parts has a slot of its own in [0, max_slots), however many such experts
// the shape allows (experts_per_rank is validated up to 2^20): here 40000 experts of two rows each, R = 1,
// so every expert spans two minibatches and has two parts.
TEST(every_expert_with_several_parts_has_its_own_slot) {
  core::LayerShape s{};
  s.world = 1;
  s.experts_per_rank = 40000;
  s.hidden = 32;
  s.intermediate = 32;
  s.top_k = 1;
  s.max_tokens = 2 * s.experts_per_rank;
  s.swiglu_limit = 1e30f;
  s.expert_padding = 1;
  s.minibatch = 1;
  s.macrobatch = 1;
  s.comm_workers = s.compute_workers = 1;
  Built b;
  build(s, std::vector<int32_t>(static_cast<size_t>(s.experts_per_rank), 2), b);
  std::vector<core::WgradPart> parts(static_cast<size_t>(core::max_parts(s)));
  int64_t n = core::plan_parts(s, b.sched, parts.data());
  CHECK(n == 2 * s.experts_per_rank);
  CHECK(n <= core::max_parts(s));
  std::vector<int> owner(static_cast<size_t>(core::max_slots(s)), -1);
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const core::WgradPart& p = parts[static_cast<size_t>(i)];
    bool in_range = p.slot >= 0 && p.slot < core::max_slots(s);
    if (!in_range || (owner[static_cast<size_t>(p.slot)] >= 0 && owner[static_cast<size_t>(p.slot)] != p.expert)) {
      if (bad++ == 0)
        CHECK_MSG(false, "expert %d (part %d of 2) has slot %d (max_slots %lld)", p.expert, p.number,
                  static_cast<int>(p.slot), static_cast<long long>(core::max_slots(s)));
      continue;
    }
    owner[static_cast<size_t>(p.slot)] = p.expert;
  }
  CHECK_MSG(bad == 0, "%d parts without a slot of their own", bad);
}

}  // namespace

MOK_TEST_MAIN
