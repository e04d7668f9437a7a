// One pass on one rank: which task runs what, and how a worker takes tasks and reports a failure.
// Executors supply memory and workers; see docs/core.md.
#pragma once

#include "core/comm_tasks.hpp"
#include "core/compute_tasks.hpp"
#include "core/home_sums.hpp"
#include "core/pass_view.hpp"

namespace mok::core {

// Ops is the executor's tile interface (docs/core.md, "The pass and the executor seam"): ops.gemm(const
// Gemm&) computes one tile GEMM; ops.rows(v, const RowJob&) runs a row stage or a worker's share (run_rows
// below, over parts that together are the whole job); ops.scratch (scratch_floats fp32) is the worker's
// scratch, which a comm worker's dispatch and a SwiGLU stage use in MXFP8 mode to stage a block of rows
// (mx_staging_values, mx_swiglu_staging_values bf16) and the host executor's tile GEMMs too; ops.chunk (chunk_values
// bf16) and ops.sums (sums_floats fp32) are a compute worker's rows for the shared expert and its weight-gradient
// sums (pass_worker.hpp's worker_chunk, worker_sums; null for a comm worker).
template <class Ops>
MOK_HD Failure run_task(const PassView& v, Task task, Ops& ops) {
  int h = v.s.hidden, in = v.s.intermediate;
  switch (task.kind) {
    case TaskKind::dispatch: return run_dispatch(v, task.index, ops);
    case TaskKind::combine: return run_combine(v, task.index, ops);
    case TaskKind::shared: return run_shared(v, task.index, ops);
    case TaskKind::wgrad: return run_wgrad(v, task, ops);
    case TaskKind::gate_up: return run_gate_up(v, tile_info(v, task, in), ops);
    case TaskKind::swiglu: return run_swiglu(v, tile_info(v, task, in), ops);
    case TaskKind::down: return run_down(v, tile_info(v, task, h), ops);
    case TaskKind::dgrad_h: return run_dgrad_h(v, tile_info(v, task, in), ops);
    case TaskKind::swiglu_bwd: return run_swiglu_bwd(v, tile_info(v, task, in), ops);
    case TaskKind::dgrad_x: return run_dgrad_x(v, tile_info(v, task, h), ops);
    default: return kNoFailure;
  }
}

// Part `part` of a row job (tile.hpp): a host worker runs it whole, a CTA's threads each their part at once. `bulk`:
// the executor's bulk copies as this part sees them (bulk_copy.hpp), which move the rows a job copies unchanged.
template <class Bulk = NoBulk>
MOK_HD void run_rows(const PassView& v, const RowJob& job, Part part, Bulk bulk = {}) {
  RowMoves<Bulk> moves{part, bulk};
  switch (job.work) {
    case RowWork::pull: return pull_block(v, job.first, job.end, job.staging, moves);
    case RowWork::quantize_pulled: return quantize_pulled(v, job.first, job.staging, part);
    case RowWork::push: return push_rows(v, job.first, job.end, moves);
    case RowWork::swiglu: return swiglu_rows(v, job.tile, job.staging, part);
    case RowWork::swiglu_backward: return swiglu_backward_in_place(v, job.tile, part);
    case RowWork::stage_backward: return stage_backward_block(v, job.tile, job.first, job.staging, part);
    case RowWork::quantize_backward: return quantize_backward_block(v, job.first, job.staging, part);
    case RowWork::wgrad_start: return start_block(v, job, part);
    case RowWork::bias_columns: return add_bias_columns(v, job, part);
    case RowWork::wgrad_write: return write_block(v, job, part);
    case RowWork::shared_swiglu:
    case RowWork::shared_gate:
    case RowWork::shared_gradient:
    case RowWork::shared_gate_dx:
    case RowWork::shared_router: return shared_row_stage(v, job, part);
    case RowWork::zero: return zero_accumulators(v, job.worker, part);
    case RowWork::finish: return finish_share(v, job.worker, part);
  }
}

enum class WorkerClass : int { comm = 0, compute = 1 };

// The next task of a queue, or nullptr when the queue is empty or the pass is aborting.
MOK_HD inline const Task* take_task(const PassView& v, WorkerClass cls) {
  if (abort_seen(own_header(v))) return nullptr;
  int q = static_cast<int>(cls);
  int64_t n = DeviceAtomic<uint32_t>(v.c.heads[q]).fetch_add(1, ::cuda::std::memory_order_relaxed);
  const Task* queue = cls == WorkerClass::comm ? v.graph.comm : v.graph.compute;
  return n < (cls == WorkerClass::comm ? v.graph.num_comm : v.graph.num_compute) ? queue + n : nullptr;
}

// A failed wait: recorded (first failure of this rank only), and every rank told to wind down.
MOK_HD inline void fail_pass(const PassView& v, Failure f, const Task* task) {
  record_failure(v.error, f, v.s.rank, task ? static_cast<int>(task->kind) : -1, task ? task->index : -1);
  raise_abort(v.headers, v.s.world, v.s.rank);
}

}  // namespace mok::core
