// The compute queue's tasks: per tile (expert_padding rows of one expert) the GEMM and SwiGLU
// stages of a forward or backward, the weight gradients in row order; per chunk of local tokens
// the shared expert.
#pragma once

#include <cstdint>

#include "core/mxfp8.hpp"
#include "core/pass_view.hpp"
#include "core/tile.hpp"

namespace mok::core {

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

// Rows' weight-gradient terms, rows in order: dW_down += dy^T h, dW_gate += dg^T x, dW_up += du^T x.
// Operands are dense [rows, width] blocks.
MOK_HD inline void wgrad_rows(const PassView& v, int e, int rows, const float* x, const float* dy, const float* hb,
                              const float* dg, const float* du) {
  int h = v.s.hidden, in = v.s.intermediate;
  int64_t wofs = static_cast<int64_t>(e) * in * h;
  outer_acc_rows(dy, hb, rows, h, in, v.acc.down + wofs);
  outer_acc_rows(dg, x, rows, in, h, v.acc.gate + wofs);
  outer_acc_rows(du, x, rows, in, h, v.acc.up + wofs);
}

// Copies `rows` ring rows starting at j into a dense block and quantises it along the rows (the
// token dim): the MXFP8 wgrad operand. A tile starts a 32-row block (expert_padding % 32 == 0).
MOK_HD inline void token_block(const PassView& v, float* ring, int64_t j, int rows, int width, float* block) {
  for (int r = 0; r < rows; ++r) copy(ring_row(v, ring, j + r, width), width, block + static_cast<int64_t>(r) * width);
  for (int c = 0; c < width; ++c) mx_round_trip_block(block + c, rows, width);
}

// A tile's rows are contiguous in the ring: tiles never straddle its end (macrobatch is a multiple
// of minibatch, itself a multiple of the tile height).
MOK_HD inline void wgrad_tile(const PassView& v, const TileInfo& t, float* scratch) {
  int h = v.s.hidden, in = v.s.intermediate;
  if (!v.s.mxfp8) {
    wgrad_rows(v, t.expert, t.rows, ring_row(v, v.ring_x, t.row0, h), ring_row(v, v.ring_dy, t.row0, h),
               ring_row(v, v.ring_h, t.row0, in), ring_row(v, v.ring_g, t.row0, in), ring_row(v, v.ring_u, t.row0, in));
    return;
  }
  float *x = scratch, *dy = x + kMxBlock * h, *hb = dy + kMxBlock * h, *dg = hb + kMxBlock * in,
        *du = dg + kMxBlock * in;
  for (int b = 0; b < t.rows; b += kMxBlock) {
    int n = t.rows - b < kMxBlock ? t.rows - b : kMxBlock;
    token_block(v, v.ring_x, t.row0 + b, n, h, x);
    token_block(v, v.ring_dy, t.row0 + b, n, h, dy);
    token_block(v, v.ring_h, t.row0 + b, n, in, hb);
    token_block(v, v.ring_g, t.row0 + b, n, in, dg);
    token_block(v, v.ring_u, t.row0 + b, n, in, du);
    wgrad_rows(v, t.expert, n, x, dy, hb, dg, du);
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
  // Rows of width h (x, d) and is (g, u, hr, dh), then acc, which holds dh (is) and then dx (h):
  // 2h + 4is + max(h, is) floats, within shape.hpp's scratch_floats.
  float *x = scratch, *d = x + h, *g = d + h, *u = g + is, *hr = u + is, *dh = hr + is, *acc = dh + is;
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

}  // namespace mok::core
