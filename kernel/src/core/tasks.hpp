// The task graph of a pass. Tasks are numbered in dependency order (every task waits only on tasks
// numbered before it) and split into two queues, comm and compute, each taken in order. So any
// number of workers of each class serves any schedule without deadlock: the lowest unfinished task
// has been taken and everything it waits on is finished.
#pragma once

#include <cstdint>

#include "core/schedule.hpp"

namespace mok::core {

enum class PassKind : int32_t { forward = 0, recompute = 1, backward = 2 };

enum class TaskKind : int16_t {
  dispatch,    // comm: pull a minibatch's rows from their home ranks into the ring
  gate_up,     // compute, per tile: g, u = x W_gate^T, x W_up^T
  swiglu,      // forward: h from g, u
  down,        // forward: y = h W_down^T
  dgrad_h,     // backward: dh = dy W_down
  swiglu_bwd,  // backward: dg, du (and h for the weight gradient)
  dgrad_x,     // backward: dx_k = dg W_gate + du W_up
  wgrad,       // backward: the tile's rows added to the expert's weight gradients, in row order
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
  int16_t unused;
  int32_t index;  // minibatch (comm), tile (routed compute) or token chunk (shared)
};

struct TaskGraph {
  Task* comm;
  Task* compute;  // stored right after the comm queue
  int64_t num_comm, num_compute;
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

// The compute stages of one tile, in order, for a pass of `kind`.
MOK_HD inline int tile_stages(PassKind kind, TaskKind* out) {
  if (kind == PassKind::backward) {
    TaskKind k[5] = {TaskKind::gate_up, TaskKind::dgrad_h, TaskKind::swiglu_bwd, TaskKind::dgrad_x, TaskKind::wgrad};
    for (int i = 0; i < 5; ++i) out[i] = k[i];
    return 5;
  }
  out[0] = TaskKind::gate_up;
  out[1] = TaskKind::swiglu;
  out[2] = TaskKind::down;
  return 3;
}

// Lays out the queues. The ring holds macrobatch / minibatch minibatches (R): dispatch m reuses the
// rows of minibatch m - R, so it is numbered after combine m - R. Dispatch m + 1 is numbered before
// combine m when R allows it, so rows arrive while the previous minibatch computes.
MOK_HD inline void build_task_graph(const LayerShape& shape, PassKind kind, int64_t total_rows, int tokens,
                                    TaskGraph& g) {
  int64_t nm = num_minibatches(shape, total_rows), ring = shape.macrobatch / shape.minibatch;
  int64_t nc = 0, nk = 0;
  auto comm = [&](TaskKind k, int64_t i) { g.comm[nc++] = Task{k, 0, static_cast<int32_t>(i)}; };
  TaskKind stages[5];
  int num_stages = tile_stages(kind, stages);
  // The shared expert needs nothing from peers: it goes first and fills the wait for the rows.
  // Recompute rebuilds only the routed experts' context (the y slots); the shared expert is not needed.
  if (shape.shared_intermediate > 0 && kind != PassKind::recompute)
    for (int64_t c = 0; c * shape.expert_padding < tokens; ++c)
      g.compute[nk++] = Task{TaskKind::shared, 0, static_cast<int32_t>(c)};
  for (int64_t m = 0; m < nm; ++m) {
    if (m > 0 && ring == 1) comm(TaskKind::combine, m - 1);
    comm(TaskKind::dispatch, m);
    for (int st = 0; st < num_stages; ++st)
      for (int64_t t = minibatch_first_tile(shape, m); t < minibatch_end_tile(shape, m, total_rows); ++t)
        g.compute[nk++] = Task{stages[st], 0, static_cast<int32_t>(t)};
    if (m > 0 && ring > 1) comm(TaskKind::combine, m - 1);
  }
  if (nm > 0) comm(TaskKind::combine, nm - 1);
  g.num_comm = nc;
  g.num_compute = nk;
}

}  // namespace mok::core
