// One pass on one rank, as the tasks of core/tasks.hpp: what each task waits on, computes and
// publishes, and the final k-order sums on the home rank. Executors supply memory and workers.
//
// Pass-local counters (private workspace, zeroed by the rank before its entry barrier):
//   ready[m]   1 once minibatch m's rows are in the ring            producer: comm (dispatch)
//   stage[t]   compute stages finished on tile t                    producer: compute (that tile's tasks)
//   done[m]    tiles of minibatch m through their last stage        producer: compute
//   freed[m]   1 once minibatch m's ring rows may be overwritten    producer: comm (combine)
//   wchain[e]  tiles of expert e added to its weight gradients      producer: compute (wgrad)
//   shared     shared-expert chunks added to its weight gradients   producer: compute (shared)
//   heads[2]   next task of the comm / compute queue                producer: workers taking tasks
#pragma once

#include <cstdint>

#include "core/mxfp8.hpp"
#include "core/protocol.hpp"
#include "core/tasks.hpp"
#include "core/tile.hpp"

namespace mok::core {

struct Counters {
  uint32_t *ready, *done, *freed, *stage, *wchain, *shared, *heads;
};

MOK_HD inline Counters counters_at(const LayerShape& s, uint32_t* base) {
  int64_t nm = max_minibatches(s);
  Counters c;
  c.ready = base;
  c.done = c.ready + nm;
  c.freed = c.done + nm;
  c.stage = c.freed + nm;
  c.wchain = c.stage + max_tiles(s);
  c.shared = c.wchain + s.experts_per_rank;
  c.heads = c.shared + 1;
  return c;
}

// fp32 GEMM operands, staged by the executor. bf16 mode: the bf16 values; MXFP8 mode: forward
// operands quantised along their GEMM's reduction dim (rowwise), dgrad operands along the other
// (colwise), both in the weights' own orientation.
struct StagedWeights {
  const float *gate, *up, *down;     // [E, I, H], [E, I, H], [E, H, I]
  const float *bgate, *bup, *bdown;  // dgrad operands, same shapes
  const float *sgate, *sup, *sdown;  // shared expert [I_s, H], [I_s, H], [H, I_s]
};

struct Accumulators {
  float *gate, *up, *down, *sgate, *sup, *sdown;
};

struct PassView {
  LayerShape s;
  PassKind kind;
  PeerLayout peer;
  char* const* peers;           // every rank's peer buffer
  PeerHeader* const* headers;   // their headers
  Schedule sched;
  TaskGraph graph;
  Counters c;
  float *ring_x, *ring_dy, *ring_g, *ring_u, *ring_h, *ring_y;  // ring_y: y (forward) or dx (backward)
  StagedWeights w;
  Accumulators acc;
  float* shared_out;  // [tokens, H]: shared output (forward) or its input gradient (backward)
  float* scratch;     // per worker, scratch_floats each
  size_t scratch_floats;
  int tokens;         // this rank's tokens
  uint64_t timeout_ns;
  ErrorRecord* error;
};

MOK_HD inline PeerHeader* own_header(const PassView& v) { return v.headers[v.s.rank]; }

template <class T>
MOK_HD T* peer_array(const PassView& v, int rank, size_t offset) {
  return reinterpret_cast<T*>(v.peers[rank] + offset);
}

MOK_HD inline float* ring_row(const PassView& v, float* ring, int64_t row, int width) {
  return ring + (row % v.s.macrobatch) * width;
}

MOK_HD inline Failure wait_local(const PassView& v, uint32_t* counter, uint32_t target, WaitId what) {
  return wait_counter(counter, target, own_header(v), v.timeout_ns, what);
}

// ---- comm tasks ---------------------------------------------------------------------------------

MOK_HD inline void pull_row(const PassView& v, int64_t j) {
  RowRef ref = v.sched.rows[j];
  int h = v.s.hidden;
  int64_t slot = static_cast<int64_t>(ref.token) * v.s.top_k + ref.k;
  bf16_row_to_float(peer_array<const bf16_t>(v, ref.rank, v.peer.x) + static_cast<int64_t>(ref.token) * h, h,
                    ring_row(v, v.ring_x, j, h));
  if (v.kind != PassKind::backward) return;
  float weight = peer_array<const float>(v, ref.rank, v.peer.topk_weights)[slot];
  const bf16_t* dout = peer_array<const bf16_t>(v, ref.rank, v.peer.dout) + static_cast<int64_t>(ref.token) * h;
  float* dy = ring_row(v, v.ring_dy, j, h);
  for (int i = 0; i < h; ++i) dy[i] = round_bf16(mul_rn(weight, bf16_to_float(dout[i])));
}

// Pull minibatch m's rows. Within the minibatch, sources are served round-robin, each rank starting
// at its next peer, which spreads the load over peers; the rows' places (and so the math) are fixed.
MOK_HD inline Failure run_dispatch(const PassView& v, int64_t m) {
  int64_t ring = v.s.macrobatch / v.s.minibatch;
  if (m >= ring) {
    Failure f = wait_local(v, &v.c.freed[m - ring], 1, WaitId::ring_slot_free);
    if (!f.ok()) return f;
  }
  int64_t lo = m * v.s.minibatch, hi = lo + v.s.minibatch < v.sched.total_rows ? lo + v.s.minibatch : v.sched.total_rows;
  int64_t cursor[kMaxWorld];
  for (int r = 0; r < v.s.world; ++r) cursor[r] = lo;
  for (bool pulled = true; pulled;) {
    pulled = false;
    for (int i = 0; i < v.s.world; ++i) {
      int r = (v.s.rank + 1 + i) % v.s.world;
      int64_t j = cursor[r];
      while (j < hi && v.sched.rows[j].rank != r) ++j;
      if (j < hi) {
        pull_row(v, j);
        pulled = true;
      }
      cursor[r] = j < hi ? j + 1 : hi;
    }
  }
  publish(&v.c.ready[m], 1);
  return kNoFailure;
}

// Push minibatch m's finished rows (y, or dx in backward) into their home ranks' (token, k) slots.
MOK_HD inline Failure run_combine(const PassView& v, int64_t m) {
  int64_t first = minibatch_first_tile(v.s, m), end = minibatch_end_tile(v.s, m, v.sched.total_rows);
  Failure f = wait_local(v, &v.c.done[m], static_cast<uint32_t>(end - first), WaitId::minibatch_done);
  if (!f.ok()) return f;
  int h = v.s.hidden;
  size_t slots = v.kind == PassKind::backward ? v.peer.dx_slots : v.peer.y_slots;
  for (int64_t j = first * v.s.expert_padding; j < end * v.s.expert_padding; ++j) {
    RowRef ref = v.sched.rows[j];
    if (ref.rank < 0) continue;
    int64_t slot = static_cast<int64_t>(ref.token) * v.s.top_k + ref.k;
    float_row_to_bf16(ring_row(v, v.ring_y, j, h), h, peer_array<bf16_t>(v, ref.rank, slots) + slot * h);
  }
  publish(&v.c.freed[m], 1);
  return kNoFailure;
}

// ---- compute tasks (one tile: expert_padding rows of one expert) ------------------------------

struct TileInfo {
  int64_t tile, row0, minibatch;
  int expert, rows;
};

MOK_HD inline TileInfo tile_info(const PassView& v, int64_t tile) {
  TileInfo t;
  t.tile = tile;
  t.row0 = tile * v.s.expert_padding;
  t.minibatch = t.row0 / v.s.minibatch;
  t.expert = tile_expert(v.s, v.sched, tile);
  t.rows = tile_rows(v.s, v.sched, tile, t.expert);
  return t;
}

// A GEMM operand row: the stored row itself, or in MXFP8 mode its round trip along the row.
MOK_HD inline const float* operand(const PassView& v, const float* row, int n, float* scratch) {
  if (!v.s.mxfp8) return row;
  copy(row, n, scratch);
  mx_round_trip_row(scratch, n);
  return scratch;
}

MOK_HD inline Failure run_gate_up(const PassView& v, const TileInfo& t, float* scratch) {
  Failure f = wait_local(v, &v.c.ready[t.minibatch], 1, WaitId::minibatch_ready);
  if (!f.ok()) return f;
  int h = v.s.hidden, in = v.s.intermediate;
  int64_t wofs = static_cast<int64_t>(t.expert) * in * h;
  for (int64_t j = t.row0; j < t.row0 + t.rows; ++j) {
    const float* x = operand(v, ring_row(v, v.ring_x, j, h), h, scratch);
    row_times_wt(x, v.w.gate + wofs, h, in, ring_row(v, v.ring_g, j, in));
    row_times_wt(x, v.w.up + wofs, h, in, ring_row(v, v.ring_u, j, in));
  }
  publish(&v.c.stage[t.tile], 1);
  return kNoFailure;
}

MOK_HD inline Failure run_swiglu(const PassView& v, const TileInfo& t) {
  Failure f = wait_local(v, &v.c.stage[t.tile], 1, WaitId::tile_stage);
  if (!f.ok()) return f;
  int in = v.s.intermediate;
  Swiglu sw{v.s.swiglu_limit};
  for (int64_t j = t.row0; j < t.row0 + t.rows; ++j) {
    const float *g = ring_row(v, v.ring_g, j, in), *u = ring_row(v, v.ring_u, j, in);
    float* hrow = ring_row(v, v.ring_h, j, in);
    for (int i = 0; i < in; ++i) hrow[i] = round_bf16(sw.forward(g[i], u[i]));
  }
  publish(&v.c.stage[t.tile], 2);
  return kNoFailure;
}

MOK_HD inline Failure run_down(const PassView& v, const TileInfo& t, float* scratch) {
  Failure f = wait_local(v, &v.c.stage[t.tile], 2, WaitId::tile_stage);
  if (!f.ok()) return f;
  int h = v.s.hidden, in = v.s.intermediate;
  for (int64_t j = t.row0; j < t.row0 + t.rows; ++j) {
    const float* a = operand(v, ring_row(v, v.ring_h, j, in), in, scratch);
    row_times_wt(a, v.w.down + static_cast<int64_t>(t.expert) * h * in, in, h, ring_row(v, v.ring_y, j, h));
  }
  publish(&v.c.stage[t.tile], 3);
  bump(&v.c.done[t.minibatch]);
  return kNoFailure;
}

// dh = dy W_down, kept in ring_h until swiglu_bwd replaces it with h.
MOK_HD inline Failure run_dgrad_h(const PassView& v, const TileInfo& t, float* scratch) {
  Failure f = wait_local(v, &v.c.stage[t.tile], 1, WaitId::tile_stage);
  if (!f.ok()) return f;
  int h = v.s.hidden, in = v.s.intermediate;
  float* acc = scratch + h;
  for (int64_t j = t.row0; j < t.row0 + t.rows; ++j) {
    const float* dy = operand(v, ring_row(v, v.ring_dy, j, h), h, scratch);
    fill(acc, in, 0.0f);
    row_times_w_acc(dy, v.w.bdown + static_cast<int64_t>(t.expert) * h * in, h, in, acc);
    float* dh = ring_row(v, v.ring_h, j, in);
    for (int i = 0; i < in; ++i) dh[i] = round_bf16(acc[i]);
  }
  publish(&v.c.stage[t.tile], 2);
  return kNoFailure;
}

// Element by element, g, u, dh become dg, du, h in place (each is read before it is replaced).
MOK_HD inline Failure run_swiglu_bwd(const PassView& v, const TileInfo& t) {
  Failure f = wait_local(v, &v.c.stage[t.tile], 2, WaitId::tile_stage);
  if (!f.ok()) return f;
  int in = v.s.intermediate;
  Swiglu sw{v.s.swiglu_limit};
  for (int64_t j = t.row0; j < t.row0 + t.rows; ++j) {
    float *g = ring_row(v, v.ring_g, j, in), *u = ring_row(v, v.ring_u, j, in), *hd = ring_row(v, v.ring_h, j, in);
    for (int i = 0; i < in; ++i) {
      float dg, du;
      sw.backward(g[i], u[i], hd[i], &dg, &du);
      hd[i] = round_bf16(sw.forward(g[i], u[i]));
      g[i] = round_bf16(dg);
      u[i] = round_bf16(du);
    }
  }
  publish(&v.c.stage[t.tile], 3);
  return kNoFailure;
}

// dx_k = dg W_gate + du W_up, one fp32 accumulation over both.
MOK_HD inline Failure run_dgrad_x(const PassView& v, const TileInfo& t, float* scratch) {
  Failure f = wait_local(v, &v.c.stage[t.tile], 3, WaitId::tile_stage);
  if (!f.ok()) return f;
  int h = v.s.hidden, in = v.s.intermediate;
  int64_t wofs = static_cast<int64_t>(t.expert) * in * h;
  float *acc = scratch, *ops = scratch + h;
  for (int64_t j = t.row0; j < t.row0 + t.rows; ++j) {
    fill(acc, h, 0.0f);
    row_times_w_acc(operand(v, ring_row(v, v.ring_g, j, in), in, ops), v.w.bgate + wofs, in, h, acc);
    row_times_w_acc(operand(v, ring_row(v, v.ring_u, j, in), in, ops), v.w.bup + wofs, in, h, acc);
    float* dx = ring_row(v, v.ring_y, j, h);
    for (int i = 0; i < h; ++i) dx[i] = round_bf16(acc[i]);
  }
  publish(&v.c.stage[t.tile], 4);
  return kNoFailure;
}

// One row's weight-gradient terms: dW_down += dy^T h, dW_gate += dg^T x, dW_up += du^T x.
MOK_HD inline void wgrad_row(const PassView& v, int e, const float* x, const float* dy, const float* hrow,
                             const float* dg, const float* du) {
  int h = v.s.hidden, in = v.s.intermediate;
  int64_t wofs = static_cast<int64_t>(e) * in * h;
  outer_acc(dy, hrow, h, in, v.acc.down + wofs);
  outer_acc(dg, x, in, h, v.acc.gate + wofs);
  outer_acc(du, x, in, h, v.acc.up + wofs);
}

// Copies `rows` ring rows starting at j into a dense block and quantises it along the rows (the
// token dim): the MXFP8 wgrad operand. A tile starts a 32-row block (expert_padding % 32 == 0).
MOK_HD inline void token_block(const PassView& v, float* ring, int64_t j, int rows, int width, float* block) {
  for (int r = 0; r < rows; ++r) copy(ring_row(v, ring, j + r, width), width, block + static_cast<int64_t>(r) * width);
  for (int c = 0; c < width; ++c) mx_round_trip_block(block + c, rows, width);
}

MOK_HD inline void wgrad_tile(const PassView& v, const TileInfo& t, float* scratch) {
  int h = v.s.hidden, in = v.s.intermediate;
  if (!v.s.mxfp8) {
    for (int64_t j = t.row0; j < t.row0 + t.rows; ++j)
      wgrad_row(v, t.expert, ring_row(v, v.ring_x, j, h), ring_row(v, v.ring_dy, j, h), ring_row(v, v.ring_h, j, in),
                ring_row(v, v.ring_g, j, in), ring_row(v, v.ring_u, j, in));
    return;
  }
  float *x = scratch, *dy = x + kMxBlock * h, *hb = dy + kMxBlock * h, *dg = hb + kMxBlock * in, *du = dg + kMxBlock * in;
  for (int b = 0; b < t.rows; b += kMxBlock) {
    int n = t.rows - b < kMxBlock ? t.rows - b : kMxBlock;
    token_block(v, v.ring_x, t.row0 + b, n, h, x);
    token_block(v, v.ring_dy, t.row0 + b, n, h, dy);
    token_block(v, v.ring_h, t.row0 + b, n, in, hb);
    token_block(v, v.ring_g, t.row0 + b, n, in, dg);
    token_block(v, v.ring_u, t.row0 + b, n, in, du);
    for (int r = 0; r < n; ++r)
      wgrad_row(v, t.expert, x + r * h, dy + r * h, hb + r * in, dg + r * in, du + r * in);
  }
}

// Tiles of one expert add their rows in row order, so the sum never depends on the schedule's
// batching or on which worker ran which tile.
MOK_HD inline Failure run_wgrad(const PassView& v, const TileInfo& t, float* scratch) {
  Failure f = wait_local(v, &v.c.stage[t.tile], 4, WaitId::tile_stage);
  if (!f.ok()) return f;
  uint32_t nth = static_cast<uint32_t>((t.row0 - expert_first(v.sched, t.expert)) / v.s.expert_padding);
  f = wait_local(v, &v.c.wchain[t.expert], nth, WaitId::wgrad_order);
  if (!f.ok()) return f;
  wgrad_tile(v, t, scratch);
  publish(&v.c.wchain[t.expert], nth + 1);
  publish(&v.c.stage[t.tile], 5);
  bump(&v.c.done[t.minibatch]);
  return kNoFailure;
}

// ---- the shared expert (local tokens, no peers) -----------------------------------------------

MOK_HD inline Failure run_shared(const PassView& v, int64_t chunk, float* scratch) {
  int h = v.s.hidden, is = v.s.shared_intermediate;
  bool backward = v.kind == PassKind::backward;
  if (backward) {
    Failure f = wait_local(v, v.c.shared, static_cast<uint32_t>(chunk), WaitId::shared_order);
    if (!f.ok()) return f;
  }
  float *x = scratch, *d = x + h, *acc = d + h, *g = acc + h, *u = g + is, *hr = u + is, *dh = hr + is;
  Swiglu sw{v.s.swiglu_limit};
  int64_t end = (chunk + 1) * v.s.expert_padding < v.tokens ? (chunk + 1) * v.s.expert_padding : v.tokens;
  for (int64_t t = chunk * v.s.expert_padding; t < end; ++t) {
    bf16_row_to_float(peer_array<const bf16_t>(v, v.s.rank, v.peer.x) + t * h, h, x);
    row_times_wt(x, v.w.sgate, h, is, g);
    row_times_wt(x, v.w.sup, h, is, u);
    for (int i = 0; i < is; ++i) hr[i] = round_bf16(sw.forward(g[i], u[i]));
    if (!backward) {
      row_times_wt(hr, v.w.sdown, is, h, v.shared_out + t * h);
      continue;
    }
    bf16_row_to_float(peer_array<const bf16_t>(v, v.s.rank, v.peer.dout) + t * h, h, d);
    fill(acc, is, 0.0f);
    row_times_w_acc(d, v.w.sdown, h, is, acc);
    for (int i = 0; i < is; ++i) dh[i] = round_bf16(acc[i]);
    for (int i = 0; i < is; ++i) {
      float dg, du;
      sw.backward(g[i], u[i], dh[i], &dg, &du);
      g[i] = round_bf16(dg);
      u[i] = round_bf16(du);
    }
    fill(acc, h, 0.0f);
    row_times_w_acc(g, v.w.sgate, is, h, acc);
    row_times_w_acc(u, v.w.sup, is, h, acc);
    for (int i = 0; i < h; ++i) v.shared_out[t * h + i] = round_bf16(acc[i]);
    outer_acc(d, hr, h, is, v.acc.sdown);
    outer_acc(g, x, is, h, v.acc.sgate);
    outer_acc(u, x, is, h, v.acc.sup);
  }
  if (backward) publish(v.c.shared, static_cast<uint32_t>(chunk + 1));
  return kNoFailure;
}

MOK_HD inline Failure run_task(const PassView& v, Task task, float* scratch) {
  if (task.kind == TaskKind::dispatch) return run_dispatch(v, task.index);
  if (task.kind == TaskKind::combine) return run_combine(v, task.index);
  if (task.kind == TaskKind::shared) return run_shared(v, task.index, scratch);
  TileInfo t = tile_info(v, task.index);
  switch (task.kind) {
    case TaskKind::gate_up: return run_gate_up(v, t, scratch);
    case TaskKind::swiglu: return run_swiglu(v, t);
    case TaskKind::down: return run_down(v, t, scratch);
    case TaskKind::dgrad_h: return run_dgrad_h(v, t, scratch);
    case TaskKind::swiglu_bwd: return run_swiglu_bwd(v, t);
    case TaskKind::dgrad_x: return run_dgrad_x(v, t, scratch);
    case TaskKind::wgrad: return run_wgrad(v, t, scratch);
    default: return kNoFailure;
  }
}

// ---- workers -------------------------------------------------------------------------------------

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
  raise_abort(v.headers, v.s.world);
}

// ---- the home rank's sums, after the closing barrier -------------------------------------------

// out_t = bf16(s_t + sum_k w_k y_k), in fp32, shared term first, then k in order.
MOK_HD inline void combine_forward_token(const PassView& v, int64_t t, const float* topk_weights, bf16_t* out) {
  int h = v.s.hidden, k = v.s.top_k;
  const int32_t* ids = peer_array<const int32_t>(v, v.s.rank, v.peer.topk_ids) + t * k;
  const bf16_t* y = peer_array<const bf16_t>(v, v.s.rank, v.peer.y_slots) + t * k * h;
  for (int i = 0; i < h; ++i) {
    float acc = v.s.shared_intermediate > 0 ? v.shared_out[t * h + i] : 0.0f;
    for (int s = 0; s < k; ++s)
      if (ids[s] >= 0) acc = add_rn(acc, mul_rn(topk_weights[t * k + s], bf16_to_float(y[s * h + i])));
    out[t * h + i] = float_to_bf16(acc);
  }
}

// dx_t = bf16(dxs_t + sum_k dx_k) in k order; dw_k = <dOut_t, y_k> over H in fp32 (0 for a -1 route).
MOK_HD inline void combine_backward_token(const PassView& v, int64_t t, const bf16_t* dout, bf16_t* dx, float* dw) {
  int h = v.s.hidden, k = v.s.top_k;
  const int32_t* ids = peer_array<const int32_t>(v, v.s.rank, v.peer.topk_ids) + t * k;
  const bf16_t* y = peer_array<const bf16_t>(v, v.s.rank, v.peer.y_slots) + t * k * h;
  const bf16_t* dxs = peer_array<const bf16_t>(v, v.s.rank, v.peer.dx_slots) + t * k * h;
  for (int i = 0; i < h; ++i) {
    float acc = v.s.shared_intermediate > 0 ? v.shared_out[t * h + i] : 0.0f;
    for (int s = 0; s < k; ++s)
      if (ids[s] >= 0) acc = add_rn(acc, bf16_to_float(dxs[s * h + i]));
    dx[t * h + i] = float_to_bf16(acc);
  }
  for (int s = 0; s < k; ++s) {
    float acc = 0.0f;
    if (ids[s] >= 0)
      for (int i = 0; i < h; ++i) acc = add_rn(acc, mul_rn(bf16_to_float(dout[t * h + i]), bf16_to_float(y[s * h + i])));
    dw[t * k + s] = acc;
  }
}

}  // namespace mok::core
