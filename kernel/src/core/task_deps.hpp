// What each task of a pass waits on and what it publishes, as data: the waits and bumps of
// comm_tasks.hpp and compute_tasks.hpp (run_dispatch, run_combine, wait_stage, wait_out_rows, run_wgrad,
// run_shared, finish_stage) listed from the same helpers they compute their targets with (stage_start,
// tile_finished, last_stage, wgrad_tasks_over, out_ring_rows, ring_minibatches). The workers keep their
// own inline waits; tests/cpp/test_task_deps.cpp runs the real tasks against these lists on random
// ragged schedules and fails when the two disagree. Used by models of a pass (mok.perf) and by tests;
// no worker calls it.
#pragma once

#include <cstdint>

#include "core/comm_tasks.hpp"

namespace mok::core {

// The pass-local counters a task waits on or bumps (pass_view.hpp's header).
enum class CounterKind : int8_t { ready, stage, done, freed, wdone, wchain, shared, count };

MOK_HD inline const char* counter_name(CounterKind c) {
  switch (c) {
    case CounterKind::ready: return "ready";
    case CounterKind::stage: return "stage";
    case CounterKind::done: return "done";
    case CounterKind::freed: return "freed";
    case CounterKind::wdone: return "wdone";
    case CounterKind::wchain: return "wchain";
    case CounterKind::shared: return "shared";
    case CounterKind::count: break;
  }
  return "none";
}

// A wait: counter[i] >= target for every i in [first, end), the wait named `what` when it runs out.
struct CounterWait {
  CounterKind counter;
  int64_t first, end;
  uint32_t target;
  WaitId what;
};

// A bump: counter[i] += 1 (set == false), or counter[i] = value published (set == true), for i in [first, end).
struct CounterBump {
  CounterKind counter;
  int64_t first, end;
  uint32_t value;
  bool set;
};

constexpr int kMaxTaskWaits = 2, kMaxTaskBumps = 2;

// The waits of `task` in the order the task makes them; returns how many (at most kMaxTaskWaits).
MOK_HD inline int task_waits(const LayerShape& s, PassKind kind, const Schedule& sched, const TaskGraph& g,
                             const Task& task, CounterWait* out) {
  int n = 0;
  int64_t i = task.index;
  switch (task.kind) {
    case TaskKind::dispatch: {  // run_dispatch
      int64_t ring = ring_minibatches(s);
      if (i < ring) return 0;
      out[n++] = CounterWait{CounterKind::freed, i - ring, i - ring + 1, 1, WaitId::ring_slot_free};
      if (is_backward(kind)) {
        PassView v{};
        v.s = s;
        v.sched = sched;
        out[n++] = CounterWait{CounterKind::wdone, i - ring, i - ring + 1, wgrad_tasks_over(v, i - ring),
                               WaitId::ring_slot_free};
      }
      return n;
    }
    case TaskKind::combine: {  // run_combine
      int64_t tiles = minibatch_end_tile(s, i, sched.total_rows) - minibatch_first_tile(s, i);
      uint32_t target = static_cast<uint32_t>(tiles) * static_cast<uint32_t>(last_stage(s, kind).tasks);
      out[n++] = CounterWait{CounterKind::done, i, i + 1, target, WaitId::minibatch_done};
      return n;
    }
    case TaskKind::shared:  // run_shared: only the backward's weight gradients go in chunk order
      if (is_backward(kind))
        out[n++] = CounterWait{CounterKind::shared, 0, 1, static_cast<uint32_t>(i), WaitId::shared_order};
      return n;
    case TaskKind::wgrad: {  // run_wgrad
      const WgradPart& p = g.parts[i];
      if (p.end_tile > p.first_tile)
        out[n++] =
            CounterWait{CounterKind::stage, p.first_tile, p.end_tile, tile_finished(s, kind), WaitId::tile_stage};
      if (p.slot >= 0 && !p.first) {
        int64_t word = static_cast<int64_t>(p.slot) * wgrad_tasks_per_part(s) + task.block;
        out[n++] =
            CounterWait{CounterKind::wchain, word, word + 1, static_cast<uint32_t>(p.number), WaitId::wgrad_order};
      }
      return n;
    }
    default: {  // a tile's stage: wait_stage, then (down, dgrad_x) wait_out_rows
      int64_t m = tile_minibatch(s, i);
      uint32_t start = stage_start(s, kind, task.kind);
      if (start == 0)
        out[n++] = CounterWait{CounterKind::ready, m, m + 1, 1, WaitId::minibatch_ready};
      else
        out[n++] = CounterWait{CounterKind::stage, i, i + 1, start, WaitId::tile_stage};
      int64_t held = out_ring_rows(s) / s.minibatch;
      if ((task.kind == TaskKind::down || task.kind == TaskKind::dgrad_x) && m >= held)
        out[n++] = CounterWait{CounterKind::freed, m - held, m - held + 1, 1, WaitId::out_rows_free};
      return n;
    }
  }
}

// What `task` publishes when it finishes; returns how many (at most kMaxTaskBumps).
MOK_HD inline int task_bumps(const LayerShape& s, PassKind kind, const TaskGraph& g, const Task& task,
                             CounterBump* out) {
  int n = 0;
  int64_t i = task.index;
  switch (task.kind) {
    case TaskKind::dispatch: out[n++] = CounterBump{CounterKind::ready, i, i + 1, 1, true}; return n;
    case TaskKind::combine: out[n++] = CounterBump{CounterKind::freed, i, i + 1, 1, true}; return n;
    case TaskKind::shared:
      if (is_backward(kind)) out[n++] = CounterBump{CounterKind::shared, 0, 1, static_cast<uint32_t>(i + 1), true};
      return n;
    case TaskKind::wgrad: {
      const WgradPart& p = g.parts[i];
      if (p.slot >= 0) {
        int64_t word = static_cast<int64_t>(p.slot) * wgrad_tasks_per_part(s) + task.block;
        out[n++] = CounterBump{CounterKind::wchain, word, word + 1, static_cast<uint32_t>(p.number + 1), true};
      }
      if (p.end_tile > p.first_tile)
        out[n++] = CounterBump{CounterKind::wdone, tile_minibatch(s, p.first_tile),
                               tile_minibatch(s, p.end_tile - 1) + 1, 0, false};
      return n;
    }
    default:  // finish_stage
      out[n++] = CounterBump{CounterKind::stage, i, i + 1, 0, false};
      if (last_stage(s, kind).kind == task.kind) {
        int64_t m = tile_minibatch(s, i);
        out[n++] = CounterBump{CounterKind::done, m, m + 1, 0, false};
      }
      return n;
  }
}

// Counter words in one index space: counter c's word i is counter_word(s, c) + i (the order of counters_at).
MOK_HD inline int64_t counter_word(const LayerShape& s, CounterKind c) {
  int64_t nm = max_minibatches(s);
  switch (c) {
    case CounterKind::ready: return 0;
    case CounterKind::done: return nm;
    case CounterKind::freed: return 2 * nm;
    case CounterKind::wdone: return 3 * nm;
    case CounterKind::stage: return 4 * nm;
    case CounterKind::wchain: return 4 * nm + max_tiles(s);
    default: return 4 * nm + max_tiles(s) + max_slots(s) * wgrad_tasks_per_part(s);  // shared
  }
}
MOK_HD inline int64_t counter_words(const LayerShape& s) {
  return counter_word(s, CounterKind::shared) + 1;
}

// Task ids: comm task q is q, compute task q is num_comm + q.
MOK_HD inline const Task& task_at(const TaskGraph& g, int64_t id) {
  return id < g.num_comm ? g.comm[id] : g.compute[id - g.num_comm];
}

// The waits as task ids (host; `Vec` is a vector of int64_t the caller owns, so core allocates nothing):
// task t depends on deps[start[t] .. start[t + 1]). A counter has one producer class, so its producers
// come from one queue, in queue order. A wait for counter[i] >= target on an adding counter depends on its
// first `target` producers: for stage[t] they are the tile's earlier stages (a stage's tasks only run once
// those are all counted, so they cannot count first), for done, wdone all of them. A wait on a published
// counter depends on the first producer that publishes target or more. Returns false when a wait can never
// be met (too few producers): a broken graph.
template <class Vec>
bool resolve_task_deps(const LayerShape& s, PassKind kind, const Schedule& sched, const TaskGraph& g, Vec& start,
                       Vec& deps) {
  int64_t words = counter_words(s), tasks = g.num_comm + g.num_compute;
  // Producers per word, as a CSR over the words: (task id, value) in id order.
  Vec first(static_cast<size_t>(words + 1), 0), producer, value;
  CounterBump bumps[kMaxTaskBumps];
  for (int pass = 0; pass < 2; ++pass) {
    Vec fill;
    if (pass == 1) {
      for (int64_t w = 0; w < words; ++w) first[w + 1] += first[w];
      producer.assign(static_cast<size_t>(first[words]), 0);
      value.assign(static_cast<size_t>(first[words]), 0);
      fill.assign(first.begin(), first.end() - 1);
    }
    for (int64_t t = 0; t < tasks; ++t)
      for (int b = 0, nb = task_bumps(s, kind, g, task_at(g, t), bumps); b < nb; ++b)
        for (int64_t i = bumps[b].first; i < bumps[b].end; ++i) {
          int64_t w = counter_word(s, bumps[b].counter) + i;
          if (pass == 0) {
            ++first[w + 1];
            continue;
          }
          producer[fill[w]] = t;
          value[fill[w]++] = bumps[b].set ? static_cast<int64_t>(bumps[b].value) : -1;
        }
  }
  start.assign(1, 0);
  deps.clear();
  CounterWait waits[kMaxTaskWaits];
  for (int64_t t = 0; t < tasks; ++t) {
    for (int k = 0, nk = task_waits(s, kind, sched, g, task_at(g, t), waits); k < nk; ++k)
      for (int64_t i = waits[k].first; i < waits[k].end; ++i) {
        int64_t w = counter_word(s, waits[k].counter) + i, lo = first[w], hi = first[w + 1];
        uint32_t need = waits[k].target;
        if (need == 0) continue;
        bool met = false;
        if (lo < hi && value[lo] < 0) {  // adding: the first `need` producers
          met = hi - lo >= need;
          for (int64_t p = lo; met && p < lo + need; ++p) deps.push_back(producer[p]);
        } else {  // published: the first producer that publishes `need` or more
          for (int64_t p = lo; !met && p < hi; ++p)
            if (value[p] >= need) deps.push_back(producer[p]), met = true;
        }
        if (!met) return false;
      }
    start.push_back(static_cast<int64_t>(deps.size()));
  }
  return true;
}

}  // namespace mok::core
