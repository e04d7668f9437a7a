// The comm queue's tasks: dispatch pulls a minibatch's rows from their home ranks into the ring;
// combine pushes finished rows into their home ranks' (token, k) slots.
#pragma once

#include <cstdint>

#include "core/bulk_copy.hpp"
#include "core/pass_view.hpp"
#include "core/tile.hpp"

namespace mok::core {

// Row j's x (unless the backward keeps the forward's) and, in backward, its dy into x_dst and dy_dst, as `moves`' part
// moves them: the ring's rows (bf16 mode) or a block's rows on their way to quantisation (MXFP8). The routing weight
// w_k scales one of them, rounded to bf16: dy = bf16(w_k · dout) (mokRoutingScaleOutput), or x = bf16(w_k · x)
// with dy = dout (mokRoutingScaleInput: the expert's input is the scaled row, in every pass alike).
template <class Moves>
MOK_HD void pull_row(const PassView& v, int64_t j, bf16_t* x_dst, bf16_t* dy_dst, Moves& moves) {
  RowRef ref = v.sched.rows[j];
  int h = v.s.hidden;
  int64_t slot = static_cast<int64_t>(ref.token) * v.s.top_k + ref.k;
  bool input = input_scaled(v.s);
  float weight = input || is_backward(v.kind) ? peer_array<const float>(v, ref.rank, v.peer.topk_weights)[slot] : 0.0f;
  // src into dst, scaled by w_k or copied.
  auto move = [&](const bf16_t* src, bf16_t* dst, bool scaled) {
    if (scaled)
      moves.row(src, h, dst, ScaledValue{weight});
    else
      moves.row(src, h, dst, SameValue{});
  };
  if (v.kind != PassKind::backward_kept)  // else the forward's x is still in the ring
    move(peer_array<const bf16_t>(v, ref.rank, v.peer.x) + static_cast<int64_t>(ref.token) * h, x_dst, input);
  if (is_backward(v.kind))
    move(peer_array<const bf16_t>(v, ref.rank, v.peer.dout) + static_cast<int64_t>(ref.token) * h, dy_dst, !input);
}

// Rows [lo, hi) of the ring, sources served round-robin, each rank starting at its next peer, which
// spreads the load over peers; the rows' places (and so the math) are fixed. Padding rows are skipped.
// Each row goes to its ring rows, or with a `staging` block (MXFP8 mode) to its row there: x at
// staging + (j - lo) · H, dy kMxStagingRows rows further.
template <class Moves>
MOK_HD void pull_rows(const PassView& v, int64_t lo, int64_t hi, bf16_t* staging, Moves& moves) {
  int h = v.s.hidden;
  int64_t cursor[kMaxWorld];
  for (int r = 0; r < v.s.world; ++r) cursor[r] = lo;
  for (bool pulled = true; pulled;) {
    pulled = false;
    for (int i = 0; i < v.s.world; ++i) {
      int r = (v.s.rank + 1 + i) % v.s.world;
      int64_t j = cursor[r];
      while (j < hi && v.sched.rows[j].rank != r) ++j;
      if (j < hi) {
        bf16_t* x = staging ? staging + (j - lo) * h : ring_row(v, v.ring_x, j, h);
        bf16_t* dy = staging ? staging + (kMxStagingRows + j - lo) * h : ring_row(v, v.ring_dy, j, h);
        pull_row(v, j, x, dy, moves);
        pulled = true;
      }
      cursor[r] = j < hi ? j + 1 : hi;
    }
  }
}

// ---- MXFP8 mode: x and dy quantised as they arrive -----------------------------------------------

// The 32 ring rows from b (a whole 32-row block) pulled into the worker's `staging` (2 x [32, H] bf16: x and dy;
// a padding row zeros), on their way to quantize_pulled: the bf16 values never reach the ring.
template <class Moves>
MOK_HD void stage_pulled(const PassView& v, int64_t b, bf16_t* staging, Moves& moves) {
  int h = v.s.hidden;
  for (int r = 0; r < kMxBlock; ++r)
    if (v.sched.rows[b + r].rank < 0)
      each_piece(moves.part, h, kPieceValues, [&](int64_t first, int n) {
        zero_rows(staging + r * h + first, n);
        zero_rows(staging + (kMxStagingRows + r) * h + first, n);
      });
  pull_rows(v, b, b + kMxBlock, staging, moves);
}

// The staged block (stage_pulled, a row job before: a column along the tokens reads every part's rows) quantised
// into mx_x and mx_dy.
MOK_HD inline void quantize_pulled(const PassView& v, int64_t b, const bf16_t* staging, Part part) {
  int h = v.s.hidden;
  if (v.kind != PassKind::backward_kept) quantize_ring_block(v.s, v.mx_x, h, b, staging, true, part);
  if (is_backward(v.kind))
    quantize_ring_block(v.s, v.mx_dy, h, b, staging + static_cast<int64_t>(kMxStagingRows) * h, true, part);
}

// `moves`' part of dispatch's row job: rows [lo, hi) into the ring (bf16), or in MXFP8 mode the 32-row block from lo
// staged.
template <class Moves>
MOK_HD void pull_block(const PassView& v, int64_t lo, int64_t hi, bf16_t* staging, Moves& moves) {
  if (v.s.mxfp8)
    stage_pulled(v, lo, staging, moves);
  else
    pull_rows(v, lo, hi, nullptr, moves);
}

// Rows [lo, hi) into the ring, bf16 or (MXFP8 mode, whole 32-row blocks) quantised through `staging`: dispatch's body
// without its waits, on one thread, which the split executor runs over a window after the launches it follows.
MOK_HD inline void pull_window(const PassView& v, int64_t lo, int64_t hi, bf16_t* staging) {
  RowMoves<> moves{kWhole};
  if (!v.s.mxfp8) return pull_rows(v, lo, hi, nullptr, moves);
  for (int64_t b = lo; b < hi; b += kMxBlock) {
    stage_pulled(v, b, staging, moves);
    quantize_pulled(v, b, staging, kWhole);
  }
}

// The wgrad tasks that read minibatch m's rows: every part holding them, one per expert with tiles in m.
MOK_HD inline uint32_t wgrad_tasks_over(const PassView& v, int64_t m) {
  uint32_t experts = 0;
  int last = -1;
  for (int64_t t = minibatch_first_tile(v.s, m); t < minibatch_end_tile(v.s, m, v.sched.total_rows); ++t) {
    int e = tile_expert(v.s, v.sched, t);
    experts += e != last;
    last = e;
  }
  return experts * static_cast<uint32_t>(wgrad_tasks_per_part(v.s));
}

// Pull minibatch m's rows into the ring: bf16, or in MXFP8 mode the e4m3 bytes of x and dy, through the worker's
// scratch (mx_staging_values bf16), by ops.rows (pass.hpp).
template <class Ops>
MOK_HD Failure run_dispatch(const PassView& v, int64_t m, Ops& ops) {
  int64_t ring = ring_minibatches(v.s);
  if (m >= ring) {
    Failure f = wait_local(v, &v.c.freed[m - ring], 1, WaitId::ring_slot_free);
    if (f.ok() && is_backward(v.kind))
      f = wait_local(v, &v.c.wdone[m - ring], wgrad_tasks_over(v, m - ring), WaitId::ring_slot_free);
    if (!f.ok()) return f;
  }
  int64_t lo = m * v.s.minibatch,
          hi = lo + v.s.minibatch < v.sched.total_rows ? lo + v.s.minibatch : v.sched.total_rows;
  bf16_t* staging = reinterpret_cast<bf16_t*>(ops.scratch);
  if (!v.s.mxfp8) ops.rows(v, rows_job(RowWork::pull, lo, hi, staging));
  for (int64_t b = lo; v.s.mxfp8 && b < hi; b += kMxBlock) {  // two jobs a block: staged whole, then quantised
    ops.rows(v, rows_job(RowWork::pull, b, b + kMxBlock, staging));
    ops.rows(v, rows_job(RowWork::quantize_pulled, b, b + kMxBlock, staging));
  }
  publish(&v.c.ready[m], 1);
  return kNoFailure;
}

// Rows [lo, hi) of the output ring (y, or dx in backward) into their home ranks' (token, k) slots, as `moves`' part
// moves them; padding rows stay.
template <class Moves>
MOK_HD void push_rows(const PassView& v, int64_t lo, int64_t hi, Moves& moves) {
  int h = v.s.hidden;
  size_t slots = is_backward(v.kind) ? v.peer.dx_slots : v.peer.y_slots;
  for (int64_t j = lo; j < hi; ++j) {
    RowRef ref = v.sched.rows[j];
    if (ref.rank < 0) continue;
    int64_t slot = static_cast<int64_t>(ref.token) * v.s.top_k + ref.k;
    const bf16_t* row = out_row(v, j);
    bf16_t* home = peer_array<bf16_t>(v, ref.rank, slots) + slot * h;
    moves.row(row, h, home, SameValue{});
  }
}
// ... all of them: combine's body without its waits (see pull_window).
MOK_HD inline void push_rows(const PassView& v, int64_t lo, int64_t hi) {
  RowMoves<> moves{kWhole};
  push_rows(v, lo, hi, moves);
}

// Push minibatch m's finished rows (y, or dx in backward) into their home ranks' (token, k) slots, by ops.rows.
template <class Ops>
MOK_HD Failure run_combine(const PassView& v, int64_t m, Ops& ops) {
  int64_t first = minibatch_first_tile(v.s, m), end = minibatch_end_tile(v.s, m, v.sched.total_rows);
  uint32_t tasks = static_cast<uint32_t>(end - first) * static_cast<uint32_t>(last_stage(v.s, v.kind).tasks);
  Failure f = wait_local(v, &v.c.done[m], tasks, WaitId::minibatch_done);
  if (!f.ok()) return f;
  ops.rows(v, rows_job(RowWork::push, first * v.s.expert_padding, end * v.s.expert_padding, nullptr));
  publish(&v.c.freed[m], 1);
  return kNoFailure;
}

}  // namespace mok::core
