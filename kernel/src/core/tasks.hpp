// The task graph of a pass. Tasks are numbered in dependency order (every task waits only on tasks
// numbered before it) and split into two queues, comm and compute, each taken in order. So any
// number of workers of each class serves any schedule without deadlock: the lowest unfinished task
// has been taken and everything it waits on is finished.
#pragma once

#include <cstdint>

#include "core/schedule.hpp"

namespace mok::core {

// backward_kept: a backward whose ring still holds every row's x, g and u from the forward (or recompute)
// just before it on this schedule; it neither pulls x again nor recomputes g and u.
enum class PassKind : int32_t { forward = 0, recompute = 1, backward = 2, backward_kept = 3 };

MOK_HD inline bool is_backward(PassKind kind) {
  return kind == PassKind::backward || kind == PassKind::backward_kept;
}

enum class TaskKind : int16_t {
  dispatch,    // comm: pull a minibatch's rows from their home ranks into the ring
  gate_up,     // compute, per tile: g, u = x W_gate^T, x W_up^T
  swiglu,      // forward: h from g, u
  down,        // forward: y = h W_down^T
  dgrad_h,     // backward: dh = dy W_down
  swiglu_bwd,  // backward: dg, du (and h for the weight gradient)
  dgrad_x,     // backward: dx_k = dg W_gate + du W_up
  wgrad,       // backward: one block of an expert's weight gradient over a part of its rows, in row order
  combine,     // comm: push a minibatch's finished rows to their home ranks' slots
  shared,      // compute, per chunk of local tokens: the shared expert (forward or backward)
  count
};

MOK_HD inline const char* task_name(int kind) {
  switch (static_cast<TaskKind>(kind)) {
    case TaskKind::dispatch: return "dispatch";
    case TaskKind::gate_up: return "gate_up";
    case TaskKind::swiglu: return "swiglu";
    case TaskKind::down: return "down";
    case TaskKind::dgrad_h: return "dgrad_h";
    case TaskKind::swiglu_bwd: return "swiglu_bwd";
    case TaskKind::dgrad_x: return "dgrad_x";
    case TaskKind::wgrad: return "wgrad";
    case TaskKind::combine: return "combine";
    case TaskKind::shared: return "shared";
    case TaskKind::count: break;
  }
  return "none";
}

struct Task {
  TaskKind kind;
  int16_t block;  // GEMM stages: the block of output columns; wgrad: the task within its part
  int32_t index;  // minibatch (comm), tile (routed compute), part (wgrad) or token chunk (shared)
};

// A stretch of one expert's tiles that one set of wgrad tasks reduces, each task one block of output
// rows of dW_down, dW_gate or dW_up over the stretch's rows in order. An expert's tiles are cut where
// its rows leave a window of R minibatches from its first, so a part never holds ring rows that a
// later dispatch must overwrite before the part is done. An expert with several parts keeps its fp32
// sums in a slot between them; one with a single part sums in the worker's own scratch. An expert with
// no rows has one part with no tiles: its tasks write zero gradients.
struct WgradPart {
  int32_t expert;
  int32_t first_tile, end_tile;  // [first, end)
  int32_t number;                // the part's place among its expert's, from 0
  int32_t slot;                  // -1: the expert has one part (int32: up to E_local experts have slots)
  int8_t first, last;            // the expert's first / last part
};
static_assert(sizeof(WgradPart) == kWgradPartBytes, "shape.hpp sizes the part table with kWgradPartBytes");

struct TaskGraph {
  Task* comm;
  Task* compute;  // stored right after the comm queue
  WgradPart* parts;
  int64_t num_comm, num_compute, num_parts;
};

MOK_HD inline int64_t num_minibatches(const LayerShape& shape, int64_t total_rows) {
  return (total_rows + shape.minibatch - 1) / shape.minibatch;
}

// Tiles [first, end) of minibatch m (a minibatch holds whole tiles: minibatch % padding == 0).
MOK_HD inline int64_t minibatch_first_tile(const LayerShape& shape, int64_t m) {
  return m * (shape.minibatch / shape.expert_padding);
}
MOK_HD inline int64_t minibatch_end_tile(const LayerShape& shape, int64_t m, int64_t total_rows) {
  int64_t end = (m + 1) * shape.minibatch;
  return (end < total_rows ? end : total_rows) / shape.expert_padding;
}
MOK_HD inline int64_t tile_minibatch(const LayerShape& shape, int64_t tile) {
  return tile * shape.expert_padding / shape.minibatch;
}

// One compute stage of a tile: its kind and how many tasks (blocks of output columns) it has.
struct Stage {
  TaskKind kind;
  int tasks;
};

MOK_HD inline int num_stages(PassKind kind) {
  return is_backward(kind) ? 4 : 3;
}

// The backward that keeps g and u starts at dgrad_h.
MOK_HD inline int first_stage(PassKind kind) {
  return kind == PassKind::backward_kept ? 1 : 0;
}

// Stage i of a tile, in order, for a pass of `kind`. No table: a device thread keeps it in registers.
MOK_HD inline Stage tile_stage(const LayerShape& s, PassKind kind, int i) {
  int blocks_i = column_blocks(s.intermediate), blocks_h = column_blocks(s.hidden);
  if (is_backward(kind)) {
    switch (i) {
      case 0: return Stage{TaskKind::gate_up, blocks_i};
      case 1: return Stage{TaskKind::dgrad_h, blocks_i};
      case 2: return Stage{TaskKind::swiglu_bwd, 1};
      default: return Stage{TaskKind::dgrad_x, blocks_h};
    }
  }
  switch (i) {
    case 0: return Stage{TaskKind::gate_up, blocks_i};
    case 1: return Stage{TaskKind::swiglu, 1};
    default: return Stage{TaskKind::down, blocks_h};
  }
}

// Where a tile's counter stands once the stages before `kind` are done (their tasks counted), and
// once all of its stages are.
MOK_HD inline uint32_t stage_start(const LayerShape& s, PassKind pass, TaskKind kind) {
  uint32_t done = 0;
  for (int i = first_stage(pass); i < num_stages(pass) && tile_stage(s, pass, i).kind != kind; ++i)
    done += tile_stage(s, pass, i).tasks;
  return done;
}
MOK_HD inline uint32_t tile_finished(const LayerShape& s, PassKind pass) {
  return stage_start(s, pass, TaskKind::count);
}
MOK_HD inline Stage last_stage(const LayerShape& s, PassKind pass) {
  return tile_stage(s, pass, num_stages(pass) - 1);
}

// The weight-gradient parts of a backward, experts in order (so their last minibatches never
// decrease); returns how many. Slots go to the experts with several parts, in expert order.
MOK_HD inline int64_t plan_parts(const LayerShape& shape, const Schedule& sched, WgradPart* parts) {
  int64_t n = 0, window = ring_minibatches(shape);
  int32_t slots = 0;
  for (int e = 0; e < shape.experts_per_rank; ++e) {
    int64_t first = expert_first(sched, e) / shape.expert_padding;
    int64_t end = first + (expert_count(sched, e) + shape.expert_padding - 1) / shape.expert_padding;
    int64_t m0 = tile_minibatch(shape, first);
    int64_t count = end > first ? (tile_minibatch(shape, end - 1) - m0) / window + 1 : 1;
    int32_t slot = count > 1 ? slots++ : -1;
    for (int64_t k = 0; k < count; ++k) {
      int64_t lo = first, hi = end;  // the tiles whose minibatch lies in window k
      while (lo < end && tile_minibatch(shape, lo) < m0 + k * window) ++lo;
      while (hi > lo && tile_minibatch(shape, hi - 1) >= m0 + (k + 1) * window) --hi;
      parts[n++] =
          WgradPart{e,    static_cast<int32_t>(lo),    static_cast<int32_t>(hi),           static_cast<int32_t>(k),
                    slot, static_cast<int8_t>(k == 0), static_cast<int8_t>(k == count - 1)};
    }
  }
  return n;
}

// The minibatch whose compute tasks a part's wgrad tasks follow: its last tile's (-1: no tiles).
MOK_HD inline int64_t part_minibatch(const LayerShape& shape, const WgradPart& p) {
  return p.end_tile > p.first_tile ? tile_minibatch(shape, p.end_tile - 1) : -1;
}

// Lays out the queues. The ring holds R = macrobatch / minibatch minibatches: dispatch m reuses the
// rows of minibatch m - R, so it is numbered after combine m - R (and, in backward, waits for the
// wgrad tasks of every part holding minibatch m - R, which end before minibatch m - R + R). Dispatch
// m + 1 is numbered before combine m when R allows it, so rows arrive while the previous minibatch
// computes. A part's wgrad tasks follow the compute tasks of its last minibatch.
MOK_HD inline void build_task_graph(const LayerShape& shape, PassKind kind, const Schedule& sched, int tokens,
                                    TaskGraph& g) {
  int64_t total_rows = sched.total_rows;
  int64_t nm = num_minibatches(shape, total_rows), ring = ring_minibatches(shape);
  int64_t nc = 0, nk = 0, np = is_backward(kind) ? plan_parts(shape, sched, g.parts) : 0, next = 0;
  auto comm = [&](TaskKind k, int64_t i) { g.comm[nc++] = Task{k, 0, static_cast<int32_t>(i)}; };
  int wgrad_tasks = wgrad_tasks_per_part(shape);
  auto wgrad = [&](int64_t part) {
    for (int j = 0; j < wgrad_tasks; ++j)
      g.compute[nk++] = Task{TaskKind::wgrad, static_cast<int16_t>(j), static_cast<int32_t>(part)};
  };
  // Parts of experts with no rows wait for nothing: they go first.
  for (int64_t p = 0; p < np; ++p)
    if (part_minibatch(shape, g.parts[p]) < 0) wgrad(p);
  // The shared expert needs nothing from peers: it goes next and fills the wait for the rows.
  // Recompute rebuilds only the routed experts' context (the y slots); the shared expert is not needed.
  if (shape.shared_intermediate > 0 && kind != PassKind::recompute)
    for (int64_t c = 0; c * shape.expert_padding < tokens; ++c)
      g.compute[nk++] = Task{TaskKind::shared, 0, static_cast<int32_t>(c)};
  for (int64_t m = 0; m < nm; ++m) {
    if (m > 0 && ring == 1) comm(TaskKind::combine, m - 1);
    comm(TaskKind::dispatch, m);
    for (int st = first_stage(kind); st < num_stages(kind); ++st) {
      Stage stage = tile_stage(shape, kind, st);
      for (int64_t t = minibatch_first_tile(shape, m); t < minibatch_end_tile(shape, m, total_rows); ++t)
        for (int b = 0; b < stage.tasks; ++b)
          g.compute[nk++] = Task{stage.kind, static_cast<int16_t>(b), static_cast<int32_t>(t)};
    }
    for (; next < np; ++next) {
      int64_t at = part_minibatch(shape, g.parts[next]);
      if (at > m) break;
      if (at == m) wgrad(next);
    }
    if (m > 0 && ring > 1) comm(TaskKind::combine, m - 1);
  }
  if (nm > 0) comm(TaskKind::combine, nm - 1);
  g.num_comm = nc;
  g.num_compute = nk;
  g.num_parts = np;
}

}  // namespace mok::core
