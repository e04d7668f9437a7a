// One pass on one rank: which task runs what, and how a worker takes tasks and reports a failure.
// Executors supply memory and workers; see docs/core.md.
#pragma once

#include "core/comm_tasks.hpp"
#include "core/compute_tasks.hpp"
#include "core/home_sums.hpp"
#include "core/pass_view.hpp"

namespace mok::core {

// Ops is the executor's tile interface (docs/core.md, "The executor seam"): ops.gemm(const Gemm&) computes
// one tile GEMM, and ops.chunk is the worker's chunk_values bf16 rows for the shared expert.
template <class Ops>
MOK_HD Failure run_task(const PassView& v, Task task, Ops& ops) {
  if (task.kind == TaskKind::dispatch) return run_dispatch(v, task.index);
  if (task.kind == TaskKind::combine) return run_combine(v, task.index);
  if (task.kind == TaskKind::shared) return run_shared(v, task.index, ops);
  TileInfo t = tile_info(v, task.index);
  switch (task.kind) {
    case TaskKind::gate_up: return run_gate_up(v, t, ops);
    case TaskKind::swiglu: return run_swiglu(v, t);
    case TaskKind::down: return run_down(v, t, ops);
    case TaskKind::dgrad_h: return run_dgrad_h(v, t, ops);
    case TaskKind::swiglu_bwd: return run_swiglu_bwd(v, t);
    case TaskKind::dgrad_x: return run_dgrad_x(v, t, ops);
    case TaskKind::wgrad: return run_wgrad(v, t, ops);
    default: return kNoFailure;
  }
}

// The tile ops of an executor that has no faster GEMM: core's reference order, on the worker's scratch.
struct ReferenceTiles {
  float* scratch;
  bf16_t* chunk;
  MOK_HD void gemm(const Gemm& g) { reference_gemm(g, scratch); }
};

enum class WorkerClass : int { comm = 0, compute = 1 };

// The next task of a queue, or nullptr when the queue is empty or the pass is aborting.
MOK_HD inline const Task* take_task(const PassView& v, WorkerClass cls) {
  if (abort_seen(own_header(v))) return nullptr;
  int q = static_cast<int>(cls);
  int64_t n = DeviceAtomic<uint32_t>(v.c.heads[q]).fetch_add(1, cuda::std::memory_order_relaxed);
  const Task* queue = cls == WorkerClass::comm ? v.graph.comm : v.graph.compute;
  return n < (cls == WorkerClass::comm ? v.graph.num_comm : v.graph.num_compute) ? queue + n : nullptr;
}

// A failed wait: recorded (first failure of this rank only), and every rank told to wind down.
MOK_HD inline void fail_pass(const PassView& v, Failure f, const Task* task) {
  record_failure(v.error, f, v.s.rank, task ? static_cast<int>(task->kind) : -1, task ? task->index : -1);
  raise_abort(v.headers, v.s.world, v.s.rank);
}

}  // namespace mok::core
