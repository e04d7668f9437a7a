// The compute queue's tasks: per tile (expert_padding rows of one expert) the GEMM and SwiGLU
// stages of a forward or backward, the weight gradients in row order; per chunk of local tokens
// the shared expert.
#pragma once

#include <cstdint>

#include "core/gemm.hpp"
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

// ---- GEMM operands (core decides every address and orientation; the executor computes) ----------

MOK_HD inline int blocks_of(int n) {
  return (n + kMxBlock - 1) / kMxBlock;
}

// Ring rows [row0, row0 + rows) of width `width` as a GEMM's a: K-major along the row, quantised along
// it in MXFP8 mode.
MOK_HD inline Operand ring_rows(const PassView& v, bf16_t* ring, int64_t row0, int width) {
  return bf16_operand(ring_row(v, ring, row0, width), width, 1, v.s.mxfp8 != 0);
}

// The same rows read down their columns (rows of the operand = the ring's columns, depth = tokens): a
// weight gradient's operand, quantised along the tokens in MXFP8 mode.
MOK_HD inline Operand ring_columns(const PassView& v, bf16_t* ring, int64_t row0, int width) {
  return bf16_operand(ring_row(v, ring, row0, width), 1, width, v.s.mxfp8 != 0);
}

// Expert e's [rows, cols] weight (rows the GEMM's output columns, cols its depth): bf16 in place, or
// its MXFP8 form whose blocks run along cols.
MOK_HD inline Operand weight_rows(const PassView& v, const bf16_t* bf16, const MxWeight& mx, int e, int rows,
                                  int cols) {
  int64_t at = static_cast<int64_t>(e) * rows * cols;
  if (!v.s.mxfp8) return bf16_operand(bf16 + at, cols, 1, false);
  return e4m3_operand(mx.data + at, cols, mx.scales + static_cast<int64_t>(e) * rows * blocks_of(cols),
                      blocks_of(cols));
}

// Expert e's bf16 [cols, rows] weight read transposed (a dgrad's b over the weight's own rows), or the
// MXFP8 colwise form, which stores that transpose as [rows, cols] with blocks along cols.
MOK_HD inline Operand weight_columns(const PassView& v, const bf16_t* bf16, const MxWeight& colwise, int e, int rows,
                                     int cols) {
  int64_t at = static_cast<int64_t>(e) * rows * cols;
  if (!v.s.mxfp8) return bf16_operand(bf16 + at, 1, rows, false);
  return e4m3_operand(colwise.data + at, cols, colwise.scales + static_cast<int64_t>(e) * rows * blocks_of(cols),
                      blocks_of(cols));
}

MOK_HD inline Gemm gemm_one(int rows, int cols, Operand a, Operand b, int depth, void* c, int64_t c_stride,
                            Epilogue epilogue) {
  Gemm g{};
  g.rows = rows;
  g.cols = cols;
  g.parts[0] = GemmPart{a, b, depth};
  g.num_parts = 1;
  g.c = c;
  g.c_stride = c_stride;
  g.epilogue = epilogue;
  return g;
}

// c = bf16(a1 · b1ᵀ + a2 · b2ᵀ), one accumulator over both (the K of the two parts concatenated).
MOK_HD inline Gemm gemm_two(int rows, int cols, GemmPart first, GemmPart second, bf16_t* c, int64_t c_stride) {
  Gemm g = gemm_one(rows, cols, first.a, first.b, first.depth, c, c_stride, Epilogue::store_bf16);
  g.parts[1] = second;
  g.num_parts = 2;
  return g;
}

// The output ring holds out_ring_rows / minibatch minibatches: a tile's output rows are free once the
// combine of the minibatch that last used them is done. That combine is numbered before this tile's
// dispatch (tasks.hpp), so the wait never points forward.
MOK_HD inline Failure wait_out_rows(const PassView& v, const TileInfo& t) {
  int64_t held = out_ring_rows(v.s) / v.s.minibatch;
  if (t.minibatch < held) return kNoFailure;
  return wait_local(v, &v.c.freed[t.minibatch - held], 1, WaitId::out_rows_free);
}

template <class Ops>
MOK_HD Failure run_gate_up(const PassView& v, const TileInfo& t, Ops& ops) {
  Failure f = wait_local(v, &v.c.ready[t.minibatch], 1, WaitId::minibatch_ready);
  if (!f.ok()) return f;
  int h = v.s.hidden, in = v.s.intermediate;
  Operand x = ring_rows(v, v.ring_x, t.row0, h);
  ops.gemm(gemm_one(t.rows, in, x, weight_rows(v, v.w.gate, v.w.gate_rowwise, t.expert, in, h), h,
                    ring_row(v, v.ring_g, t.row0, in), in, Epilogue::store_bf16));
  ops.gemm(gemm_one(t.rows, in, x, weight_rows(v, v.w.up, v.w.up_rowwise, t.expert, in, h), h,
                    ring_row(v, v.ring_u, t.row0, in), in, Epilogue::store_bf16));
  publish(&v.c.stage[t.tile], 1);
  return kNoFailure;
}

MOK_HD inline Failure run_swiglu(const PassView& v, const TileInfo& t) {
  Failure f = wait_local(v, &v.c.stage[t.tile], 1, WaitId::tile_stage);
  if (!f.ok()) return f;
  int in = v.s.intermediate;
  Swiglu sw{v.s.swiglu_limit};
  for (int64_t j = t.row0; j < t.row0 + t.rows; ++j) {
    swiglu_row(sw, ring_row(v, v.ring_g, j, in), ring_row(v, v.ring_u, j, in), in, ring_row(v, v.ring_h, j, in));
  }
  publish(&v.c.stage[t.tile], 2);
  return kNoFailure;
}

template <class Ops>
MOK_HD Failure run_down(const PassView& v, const TileInfo& t, Ops& ops) {
  Failure f = wait_local(v, &v.c.stage[t.tile], 2, WaitId::tile_stage);
  if (!f.ok()) return f;
  int h = v.s.hidden, in = v.s.intermediate;
  f = wait_out_rows(v, t);
  if (!f.ok()) return f;
  ops.gemm(gemm_one(t.rows, h, ring_rows(v, v.ring_h, t.row0, in),
                    weight_rows(v, v.w.down, v.w.down_rowwise, t.expert, h, in), in, out_row(v, t.row0), h,
                    Epilogue::store_bf16));
  publish(&v.c.stage[t.tile], 3);
  bump(&v.c.done[t.minibatch]);
  return kNoFailure;
}

// dh = dy W_down, kept in ring_h until swiglu_bwd replaces it with h.
template <class Ops>
MOK_HD Failure run_dgrad_h(const PassView& v, const TileInfo& t, Ops& ops) {
  Failure f = wait_local(v, &v.c.stage[t.tile], 1, WaitId::tile_stage);
  if (!f.ok()) return f;
  int h = v.s.hidden, in = v.s.intermediate;
  ops.gemm(gemm_one(t.rows, in, ring_rows(v, v.ring_dy, t.row0, h),
                    weight_columns(v, v.w.down, v.w.down_colwise, t.expert, in, h), h,
                    ring_row(v, v.ring_h, t.row0, in), in, Epilogue::store_bf16));
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
    swiglu_backward_row(sw, ring_row(v, v.ring_g, j, in), ring_row(v, v.ring_u, j, in), ring_row(v, v.ring_h, j, in),
                        in);
  }
  publish(&v.c.stage[t.tile], 3);
  return kNoFailure;
}

// dx_k = dg W_gate + du W_up, one fp32 accumulation over both.
template <class Ops>
MOK_HD Failure run_dgrad_x(const PassView& v, const TileInfo& t, Ops& ops) {
  Failure f = wait_local(v, &v.c.stage[t.tile], 3, WaitId::tile_stage);
  if (!f.ok()) return f;
  int h = v.s.hidden, in = v.s.intermediate;
  GemmPart gate{ring_rows(v, v.ring_g, t.row0, in), weight_columns(v, v.w.gate, v.w.gate_colwise, t.expert, h, in),
                in};
  GemmPart up{ring_rows(v, v.ring_u, t.row0, in), weight_columns(v, v.w.up, v.w.up_colwise, t.expert, h, in), in};
  f = wait_out_rows(v, t);
  if (!f.ok()) return f;
  ops.gemm(gemm_two(t.rows, h, gate, up, out_row(v, t.row0), h));
  publish(&v.c.stage[t.tile], 4);
  return kNoFailure;
}

// The tile's rows added to expert e's weight gradients, rows in order (the depth of each GEMM):
// dW_down += dyᵀ h, dW_gate += dgᵀ x, dW_up += duᵀ x. A tile's rows are contiguous in the ring: tiles
// never straddle its end (macrobatch is a multiple of minibatch, itself a multiple of the tile height),
// and in MXFP8 mode a tile starts a 32-row block of its segment (expert_padding % 32 == 0).
template <class Ops>
MOK_HD void wgrad_tile(const PassView& v, const TileInfo& t, Ops& ops) {
  int h = v.s.hidden, in = v.s.intermediate;
  int64_t at = static_cast<int64_t>(t.expert) * in * h;
  Operand x = ring_columns(v, v.ring_x, t.row0, h), dy = ring_columns(v, v.ring_dy, t.row0, h);
  ops.gemm(gemm_one(h, in, dy, ring_columns(v, v.ring_h, t.row0, in), t.rows, v.acc.down + at, in,
                    Epilogue::accumulate_f32));
  ops.gemm(gemm_one(in, h, ring_columns(v, v.ring_g, t.row0, in), x, t.rows, v.acc.gate + at, h,
                    Epilogue::accumulate_f32));
  ops.gemm(gemm_one(in, h, ring_columns(v, v.ring_u, t.row0, in), x, t.rows, v.acc.up + at, h,
                    Epilogue::accumulate_f32));
}

// Tiles of one expert add their rows in row order, so the sum never depends on the schedule's
// batching or on which worker ran which tile.
template <class Ops>
MOK_HD Failure run_wgrad(const PassView& v, const TileInfo& t, Ops& ops) {
  Failure f = wait_local(v, &v.c.stage[t.tile], 4, WaitId::tile_stage);
  if (!f.ok()) return f;
  uint32_t nth = static_cast<uint32_t>((t.row0 - expert_first(v.sched, t.expert)) / v.s.expert_padding);
  f = wait_local(v, &v.c.wchain[t.expert], nth, WaitId::wgrad_order);
  if (!f.ok()) return f;
  wgrad_tile(v, t, ops);
  publish(&v.c.wchain[t.expert], nth + 1);
  publish(&v.c.stage[t.tile], 5);
  bump(&v.c.done[t.minibatch]);
  return kNoFailure;
}

// ---- the shared expert (local tokens, no peers) -----------------------------------------------

// Chunk c: the local tokens [c * P, min((c + 1) * P, tokens)), P = expert_padding. Per chunk: g, u,
// h (and in backward dh, then dg, du in place of g, u) in the worker's chunk rows; the output (or dx)
// in shared_out; in backward the weight gradients, chunks in order.
template <class Ops>
MOK_HD Failure run_shared(const PassView& v, int64_t chunk, Ops& ops) {
  int h = v.s.hidden, is = v.s.shared_intermediate;
  bool backward = v.kind == PassKind::backward;
  if (backward) {
    Failure f = wait_local(v, v.c.shared, static_cast<uint32_t>(chunk), WaitId::shared_order);
    if (!f.ok()) return f;
  }
  int64_t first = chunk * v.s.expert_padding;
  int rows = static_cast<int>((first + v.s.expert_padding < v.tokens ? first + v.s.expert_padding : v.tokens) - first);
  bf16_t *g = ops.chunk, *u = g + static_cast<int64_t>(v.s.expert_padding) * is,
         *hr = u + static_cast<int64_t>(v.s.expert_padding) * is, *dh = hr + static_cast<int64_t>(v.s.expert_padding) * is;
  const bf16_t* xs = peer_array<const bf16_t>(v, v.s.rank, v.peer.x) + first * h;
  bf16_t* out = v.shared_out + first * h;
  Operand x = bf16_operand(xs, h, 1, false);
  Operand wgate = bf16_operand(v.w.shared_gate, h, 1, false), wup = bf16_operand(v.w.shared_up, h, 1, false);
  ops.gemm(gemm_one(rows, is, x, wgate, h, g, is, Epilogue::store_bf16));
  ops.gemm(gemm_one(rows, is, x, wup, h, u, is, Epilogue::store_bf16));
  Swiglu sw{v.s.swiglu_limit};
  for (int r = 0; r < rows; ++r) swiglu_row(sw, g + r * is, u + r * is, is, hr + r * is);
  if (!backward) {
    ops.gemm(gemm_one(rows, h, bf16_operand(hr, is, 1, false), bf16_operand(v.w.shared_down, is, 1, false), is, out,
                      h, Epilogue::store_bf16));
    return kNoFailure;
  }
  const bf16_t* dout = peer_array<const bf16_t>(v, v.s.rank, v.peer.dout) + first * h;
  ops.gemm(gemm_one(rows, is, bf16_operand(dout, h, 1, false), bf16_operand(v.w.shared_down, 1, is, false), h, dh,
                    is, Epilogue::store_bf16));
  for (int r = 0; r < rows; ++r) swiglu_gradient_row(sw, g + r * is, u + r * is, dh + r * is, is);
  GemmPart dgate{bf16_operand(g, is, 1, false), bf16_operand(v.w.shared_gate, 1, h, false), is};
  GemmPart dup{bf16_operand(u, is, 1, false), bf16_operand(v.w.shared_up, 1, h, false), is};
  ops.gemm(gemm_two(rows, h, dgate, dup, out, h));
  Operand xt = bf16_operand(xs, 1, h, false);
  ops.gemm(gemm_one(h, is, bf16_operand(dout, 1, h, false), bf16_operand(hr, 1, is, false), rows, v.acc.sdown, is,
                    Epilogue::accumulate_f32));
  ops.gemm(gemm_one(is, h, bf16_operand(g, 1, is, false), xt, rows, v.acc.sgate, h, Epilogue::accumulate_f32));
  ops.gemm(gemm_one(is, h, bf16_operand(u, 1, is, false), xt, rows, v.acc.sup, h, Epilogue::accumulate_f32));
  publish(v.c.shared, static_cast<uint32_t>(chunk + 1));
  return kNoFailure;
}

}  // namespace mok::core
