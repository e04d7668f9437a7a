// The compute queue's tasks: per tile (expert_padding rows of one expert) the GEMM stages, a task per
// block of output columns, and the SwiGLU stages of a forward or backward; per part of an expert's
// rows its weight gradients, a task per block of output rows; per chunk of local tokens the shared
// expert.
#pragma once

#include <cstdint>

#include "core/gemm.hpp"
#include "core/home_sums.hpp"
#include "core/pass_view.hpp"
#include "core/tile.hpp"

namespace mok::core {

MOK_HD inline TileInfo tile_info(const PassView& v, const Task& task, int width) {
  TileInfo t;
  t.tile = task.index;
  t.row0 = t.tile * v.s.expert_padding;
  t.minibatch = t.row0 / v.s.minibatch;
  t.expert = tile_expert(v.s, v.sched, t.tile);
  t.rows = tile_rows(v.s, v.sched, t.tile, t.expert);
  t.col0 = task.block * kColumnBlock;
  t.cols = width - t.col0 < kColumnBlock ? width - t.col0 : kColumnBlock;
  return t;
}

// A stage's task starts once the tile's earlier stages are done, and counts itself in when it ends;
// the tasks of a tile's last stage also count in its minibatch (combine waits for them).
MOK_HD inline Failure wait_stage(const PassView& v, const TileInfo& t, TaskKind kind) {
  uint32_t start = stage_start(v.s, v.kind, kind);
  if (start == 0) return wait_local(v, &v.c.ready[t.minibatch], 1, WaitId::minibatch_ready);  // the first stage
  return wait_local(v, &v.c.stage[t.tile], start, WaitId::tile_stage);
}
MOK_HD inline void finish_stage(const PassView& v, const TileInfo& t, TaskKind kind) {
  bump(&v.c.stage[t.tile]);
  if (last_stage(v.s, v.kind).kind == kind) bump(&v.c.done[t.minibatch]);
}

// ---- GEMM operands (core decides every address and orientation; the executor computes) ----------

// The operand from its row `first` on: a block of output columns (b) or of output rows (a). An e4m3
// operand keeps its matrix's scales and counts the rows it skips: the layout places rows in tiles of 128.
MOK_HD inline Operand from_row(Operand o, int64_t first) {
  int size = o.dtype == Dtype::f32 ? 4 : (o.dtype == Dtype::bf16 ? 2 : 1);
  o.data = static_cast<const char*>(o.data) + first * o.row_stride * size;
  o.scale_row0 += first;
  return o;
}

// Ring rows from row0 on (width H for x, dy; I for h, dg, du) as a GEMM's a, K-major along the row:
// the bf16 ring, or in MXFP8 mode the e4m3 codes quantised along the row with the ring's
// [macrobatch, width] scales, from ring row row0 on (dispatch or a SwiGLU stage wrote them).
MOK_HD inline Operand ring_rows(const PassView& v, bf16_t* ring, const MxRing& mx, int64_t row0, int width) {
  if (!v.s.mxfp8) return bf16_operand(ring_row(v, ring, row0, width), width, 1, false);
  Operand o = e4m3_operand(mx.rows, mx.stride, mx.row_scales, ring_row_scales(v.s, width));
  return from_row(o, row0 % v.s.macrobatch);
}

// The rows of the tile that starts at row0 read down their columns (rows of the operand = the ring's
// columns, depth = tokens): a weight gradient's operand over the tile's rows. The bf16 ring, or in MXFP8
// mode the codes quantised along the tokens, MN-major (code (i, k) at tokens + (row0 + k) * stride + i),
// with the tile slot's [width, P] scales.
MOK_HD inline Operand ring_columns(const PassView& v, bf16_t* ring, const MxRing& mx, int64_t row0, int width) {
  if (!v.s.mxfp8) return bf16_operand(ring_row(v, ring, row0, width), 1, width, false);
  int64_t at = row0 % v.s.macrobatch;
  MxScaleLayout layout = ring_token_scales(v.s, width);
  Operand o = e4m3_operand(mx.tokens + at * mx.stride, 1,
                           mx.token_scales + at / v.s.expert_padding * layout.matrix_bytes(), layout);
  o.depth_stride = mx.stride;
  return o;
}

// Expert e's [rows, cols] weight (rows the GEMM's output columns, cols its depth): bf16 in place, or
// its MXFP8 form whose blocks run along cols: the batch's e4m3 codes [E, rows, cols] and, per expert, its
// scales in the SM100 layout of a [rows, cols] matrix, matrix_bytes() apart (mxfp8_layout.hpp).
MOK_HD inline Operand weight_rows(const PassView& v, const bf16_t* bf16, const MxWeight& mx, int e, int rows,
                                  int cols) {
  int64_t at = static_cast<int64_t>(e) * rows * cols;
  if (!v.s.mxfp8) return bf16_operand(bf16 + at, cols, 1, false);
  MxScaleLayout layout = MxScaleLayout::of(rows, cols);
  return e4m3_operand(mx.data + at, cols, mx.scales + e * layout.matrix_bytes(), layout);
}

// Expert e's bf16 [cols, rows] weight read transposed (a dgrad's b over the weight's own rows), or the
// MXFP8 colwise form, which stores that transpose as [rows, cols] with blocks along cols (laid out as above).
MOK_HD inline Operand weight_columns(const PassView& v, const bf16_t* bf16, const MxWeight& colwise, int e, int rows,
                                     int cols) {
  int64_t at = static_cast<int64_t>(e) * rows * cols;
  if (!v.s.mxfp8) return bf16_operand(bf16 + at, 1, rows, false);
  MxScaleLayout layout = MxScaleLayout::of(rows, cols);
  return e4m3_operand(colwise.data + at, cols, colwise.scales + e * layout.matrix_bytes(), layout);
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

// ---- the routed experts' tile stages ---------------------------------------------------------------

// The output ring holds out_ring_rows / minibatch minibatches: a tile's output rows are free once the
// combine of the minibatch that last used them is done. That combine is numbered before this tile's
// dispatch (tasks.hpp), so the wait never points forward.
MOK_HD inline Failure wait_out_rows(const PassView& v, const TileInfo& t) {
  int64_t held = out_ring_rows(v.s) / v.s.minibatch;
  if (t.minibatch < held) return kNoFailure;
  return wait_local(v, &v.c.freed[t.minibatch - held], 1, WaitId::out_rows_free);
}

// An expert's bias [E, width] from column col0 on, or null without one.
MOK_HD inline const bf16_t* expert_bias(const bf16_t* bias, int expert, int width, int col0) {
  return bias ? bias + static_cast<int64_t>(expert) * width + col0 : nullptr;
}

// g, u = x W_gateᵀ + b_gate, x W_upᵀ + b_up over the task's block of I (a bias added in fp32, then rounded).
template <class Ops>
MOK_HD Failure run_gate_up(const PassView& v, const TileInfo& t, Ops& ops) {
  Failure f = wait_stage(v, t, TaskKind::gate_up);
  if (!f.ok()) return f;
  int h = v.s.hidden, in = v.s.intermediate;
  Operand x = ring_rows(v, v.ring_x, v.mx_x, t.row0, h);
  Operand gate = from_row(weight_rows(v, v.w.gate, v.w.gate_rowwise, t.expert, in, h), t.col0);
  Operand up = from_row(weight_rows(v, v.w.up, v.w.up_rowwise, t.expert, in, h), t.col0);
  Gemm g = gemm_one(t.rows, t.cols, x, gate, h, ring_row(v, v.ring_g, t.row0, in) + t.col0, in, Epilogue::store_bf16);
  g.bias = expert_bias(v.w.gate_bias, t.expert, in, t.col0);
  ops.gemm(g);
  Gemm u = gemm_one(t.rows, t.cols, x, up, h, ring_row(v, v.ring_u, t.row0, in) + t.col0, in, Epilogue::store_bf16);
  u.bias = expert_bias(v.w.up_bias, t.expert, in, t.col0);
  ops.gemm(u);
  finish_stage(v, t, TaskKind::gate_up);
  return kNoFailure;
}

// Real rows of the tile's 32-row block from ring row b. In MXFP8 mode the SwiGLU stages write every block
// of the tile's P rows, as dispatch does for x and dy: a block past the real rows all zeros, so a GPU
// that reads whole scale tiles meets no stale (possibly NaN) scale of an earlier tile in the slot.
MOK_HD inline int block_rows(const TileInfo& t, int64_t b) {
  int64_t n = t.row0 + t.rows - b;
  return n < 0 ? 0 : (n < kMxBlock ? static_cast<int>(n) : kMxBlock);
}

// h = SwiGLU(g, u) over the tile's rows. In MXFP8 mode h is only read by down, quantised along I: each
// 32-row block is computed into `staging` (the worker's, mx_swiglu_staging_values bf16) and written as
// its rowwise codes and scales into mx_h (ring_h's bytes); its bf16 values never reach the ring.
// The stage's body, without its waits: the split executor runs it after the launches it reads. Part `part`
// takes its 16-byte pieces of every row, or in MXFP8 mode its (row, scale block) pairs of each block
// (each_scale_block), which it then quantises itself.
MOK_HD inline void swiglu_rows(const PassView& v, const TileInfo& t, bf16_t* staging, Part part = kWhole) {
  int in = v.s.intermediate;
  Swiglu sw = layer_swiglu(v.s, v.sigmoid_table);
  // h of ring row `row` from column `first` into `h` (that row's), or zeros for a padding row: one call site of the
  // row function for both modes.
  auto piece = [&](int64_t row, bool real, bf16_t* h, int64_t first, int count) {
    if (real)
      swiglu_row(sw, ring_row(v, v.ring_g, row, in) + first, ring_row(v, v.ring_u, row, in) + first, count, h + first);
    else
      zero_rows(h + first, count);
  };
  for (int64_t row = t.row0; !v.s.mxfp8 && row < t.row0 + t.rows; ++row)
    each_piece(part, in, kPieceValues,
               [&](int64_t first, int count) { piece(row, true, ring_row(v, v.ring_h, row, in), first, count); });
  for (int64_t b = t.row0; v.s.mxfp8 && b < t.row0 + v.s.expert_padding; b += kMxBlock) {
    int n = block_rows(t, b);
    each_scale_block(part, in, [&](int r, int64_t first, int count) {
      if (count > 0) piece(b + r, r < n, staging + r * in, first, count);
    });
    quantize_ring_block(v.s, v.mx_h, in, b, staging, false, part);
  }
}

template <class Ops>
MOK_HD Failure run_swiglu(const PassView& v, const TileInfo& t, Ops& ops) {
  Failure f = wait_stage(v, t, TaskKind::swiglu);
  if (!f.ok()) return f;
  ops.rows(v, tile_job(RowWork::swiglu, t, reinterpret_cast<bf16_t*>(ops.scratch), 0));
  finish_stage(v, t, TaskKind::swiglu);
  return kNoFailure;
}

// y = h W_downᵀ + b_down over the task's block of H.
template <class Ops>
MOK_HD Failure run_down(const PassView& v, const TileInfo& t, Ops& ops) {
  Failure f = wait_stage(v, t, TaskKind::down);
  if (f.ok()) f = wait_out_rows(v, t);
  if (!f.ok()) return f;
  int h = v.s.hidden, in = v.s.intermediate;
  Operand down = from_row(weight_rows(v, v.w.down, v.w.down_rowwise, t.expert, h, in), t.col0);
  Gemm y = gemm_one(t.rows, t.cols, ring_rows(v, v.ring_h, v.mx_h, t.row0, in), down, in, out_row(v, t.row0) + t.col0,
                    h, Epilogue::store_bf16);
  y.bias = expert_bias(v.w.down_bias, t.expert, h, t.col0);
  ops.gemm(y);
  finish_stage(v, t, TaskKind::down);
  return kNoFailure;
}

// dh = dy W_down over the task's block of I, kept in ring_h until swiglu_bwd replaces it with h.
template <class Ops>
MOK_HD Failure run_dgrad_h(const PassView& v, const TileInfo& t, Ops& ops) {
  Failure f = wait_stage(v, t, TaskKind::dgrad_h);
  if (!f.ok()) return f;
  int h = v.s.hidden, in = v.s.intermediate;
  Operand down = from_row(weight_columns(v, v.w.down, v.w.down_colwise, t.expert, in, h), t.col0);
  ops.gemm(gemm_one(t.rows, t.cols, ring_rows(v, v.ring_dy, v.mx_dy, t.row0, h), down, h,
                    ring_row(v, v.ring_h, t.row0, in) + t.col0, in, Epilogue::store_bf16));
  finish_stage(v, t, TaskKind::dgrad_h);
  return kNoFailure;
}

// g, u, dh become dg, du and h over the tile's rows. In MXFP8 mode they are only read by dgrad_x (dg,
// du along I) and the weight gradients (dg, du, h along the tokens): each 32-row block's g, u, dh are
// copied into `staging` (the worker's, mx_swiglu_staging_values bf16) and become dg, du, h there
// (stage_backward_block), then are written in both orientations into mx_g, mx_u, mx_h, whose codes fill exactly the
// block's bf16 bytes (quantize_backward_block). A part's codes land on other columns' bf16 values, and a column
// along the tokens reads every row of the block, so the whole block is staged before any part quantises: two row
// jobs per block (run_swiglu_bwd). The stage's body, without its waits (see swiglu_rows); a part takes 16-byte
// pieces of each row to stage, and quantize_ring_block's share to quantise.
MOK_HD inline void stage_backward_block(const PassView& v, const TileInfo& t, int64_t b, bf16_t* staging, Part part) {
  int in = v.s.intermediate, n = block_rows(t, b);
  int64_t block = static_cast<int64_t>(kMxBlock) * in;
  Swiglu sw = layer_swiglu(v.s, v.sigmoid_table);
  for (int r = 0; r < kMxBlock; ++r)
    each_piece(part, in, kPieceValues, [&](int64_t first, int count) {
      bf16_t *dg = staging + r * in + first, *du = dg + block, *hd = du + block;  // g, u, dh until the last line
      for (int64_t m = 0; m < 3; ++m) {                                           // the padding rows zeros
        bf16_t* to = dg + m * block;
        if (r < n)
          move_part(kWhole, ring_row(v, m == 0 ? v.ring_g : (m == 1 ? v.ring_u : v.ring_h), b + r, in) + first, count,
                    to, SameValue{});
        else
          zero_rows(to, count);
      }
      if (r < n) swiglu_backward_row(sw, dg, du, hd, count);
    });
}

MOK_HD inline void quantize_backward_block(const PassView& v, int64_t b, const bf16_t* staging, Part part) {
  int in = v.s.intermediate;
  int64_t block = static_cast<int64_t>(kMxBlock) * in;
  quantize_ring_block(v.s, v.mx_g, in, b, staging, true, part);
  quantize_ring_block(v.s, v.mx_u, in, b, staging + block, true, part);
  quantize_ring_block(v.s, v.mx_h, in, b, staging + 2 * block, true, part);
}

// bf16 mode: in place in the ring, row by row.
MOK_HD inline void swiglu_backward_in_place(const PassView& v, const TileInfo& t, Part part) {
  int in = v.s.intermediate;
  Swiglu sw = layer_swiglu(v.s, v.sigmoid_table);
  for (int64_t row = t.row0; row < t.row0 + t.rows; ++row) {
    bf16_t *g = ring_row(v, v.ring_g, row, in), *u = ring_row(v, v.ring_u, row, in),
           *h = ring_row(v, v.ring_h, row, in);
    each_piece(part, in, kPieceValues,
               [&](int64_t first, int count) { swiglu_backward_row(sw, g + first, u + first, h + first, count); });
  }
}

// The whole stage, for an executor that runs it on one thread (the split executor's row steps).
MOK_HD inline void swiglu_backward_rows(const PassView& v, const TileInfo& t, bf16_t* staging) {
  if (!v.s.mxfp8) return swiglu_backward_in_place(v, t, kWhole);
  for (int64_t b = t.row0; b < t.row0 + v.s.expert_padding; b += kMxBlock) {
    stage_backward_block(v, t, b, staging, kWhole);
    quantize_backward_block(v, b, staging, kWhole);
  }
}

// The stage by ops.rows: in bf16 mode one job; in MXFP8 mode two per 32-row block, the block staged whole first.
template <class Ops>
MOK_HD Failure run_swiglu_bwd(const PassView& v, const TileInfo& t, Ops& ops) {
  Failure f = wait_stage(v, t, TaskKind::swiglu_bwd);
  if (!f.ok()) return f;
  bf16_t* staging = reinterpret_cast<bf16_t*>(ops.scratch);
  if (!v.s.mxfp8) ops.rows(v, tile_job(RowWork::swiglu_backward, t, staging, 0));
  for (int64_t b = t.row0; v.s.mxfp8 && b < t.row0 + v.s.expert_padding; b += kMxBlock) {
    ops.rows(v, tile_job(RowWork::stage_backward, t, staging, b));
    ops.rows(v, tile_job(RowWork::quantize_backward, t, staging, b));
  }
  finish_stage(v, t, TaskKind::swiglu_bwd);
  return kNoFailure;
}

// dx_k = dg W_gate + du W_up over the task's block of H, one fp32 accumulation over both.
template <class Ops>
MOK_HD Failure run_dgrad_x(const PassView& v, const TileInfo& t, Ops& ops) {
  Failure f = wait_stage(v, t, TaskKind::dgrad_x);
  if (f.ok()) f = wait_out_rows(v, t);
  if (!f.ok()) return f;
  int h = v.s.hidden, in = v.s.intermediate;
  Operand gate = from_row(weight_columns(v, v.w.gate, v.w.gate_colwise, t.expert, h, in), t.col0);
  Operand up = from_row(weight_columns(v, v.w.up, v.w.up_colwise, t.expert, h, in), t.col0);
  GemmPart dgate{ring_rows(v, v.ring_g, v.mx_g, t.row0, in), gate, in},
      dup{ring_rows(v, v.ring_u, v.mx_u, t.row0, in), up, in};
  ops.gemm(gemm_two(t.rows, t.cols, dgate, dup, out_row(v, t.row0) + t.col0, h));
  finish_stage(v, t, TaskKind::dgrad_x);
  return kNoFailure;
}

// ---- the routed experts' weight gradients ----------------------------------------------------------

// One wgrad task's block: rows [row0, row0 + rows) of dW_down [H, I], dW_gate or dW_up [I, H].
struct WgradBlock {
  int matrix;  // 0: down, 1: gate, 2: up
  int row0, rows, cols;
};

MOK_HD inline WgradBlock wgrad_block(const LayerShape& s, int task) {
  int blocks_h = column_blocks(s.hidden), blocks_i = column_blocks(s.intermediate);
  int matrix = task < blocks_h ? 0 : 1 + (task - blocks_h) / blocks_i;
  int block = matrix == 0 ? task : (task - blocks_h) % blocks_i;
  int height = matrix == 0 ? s.hidden : s.intermediate;
  int row0 = block * kColumnBlock;
  return WgradBlock{matrix, row0, height - row0 < kColumnBlock ? height - row0 : kColumnBlock,
                    matrix == 0 ? s.intermediate : s.hidden};
}

// Part `part` of a bias gradient's sums over a tile (its sums i = part.index, part.index + part.count, ...):
// sums[i] += a(i, k) for k = 0, 1, ..., depth - 1 in order, fp32, the values as the weight gradient's GEMM reads
// them (in MXFP8 mode the codes quantised along the tokens).
MOK_HD inline void add_columns(const Operand& a, int rows, int depth, float* sums, Part part) {
  for (int i = part.index; i < rows; i += part.count) {
    float sum = sums[i];
    for (int k = 0; k < depth; ++k) sum = add_rn(sum, stored_value(a, i, k));
    sums[i] = sum;
  }
}

// The bias gradient a block of dW_down, dW_gate or dW_up carries (db_down, db_gate, db_up), or null.
MOK_HD inline void* bias_gradient(const PassArgs& a, int matrix) {
  return matrix == 0 ? a.ddown_bias : (matrix == 1 ? a.dgate_bias : a.dup_bias);
}

// The block's first operand over the tile whose rows start at ring row row0, read down its columns: dy for dW_down,
// dg or du for dW_gate or dW_up, from the block's first row on.
MOK_HD inline Operand wgrad_rows(const PassView& v, const WgradBlock& b, int64_t row0) {
  int h = v.s.hidden, in = v.s.intermediate;
  Operand a = b.matrix == 0 ? ring_columns(v, v.ring_dy, v.mx_dy, row0, h)
                            : (b.matrix == 1 ? ring_columns(v, v.ring_g, v.mx_g, row0, in)
                                             : ring_columns(v, v.ring_u, v.mx_u, row0, in));
  return from_row(a, b.row0);
}

// Tile t's rows added to the block's sums, in row order (and, with bias_sums, the block's bias gradient:
// the column sums of dy, dg or du over the same rows, by ops.rows): dW_down += dyᵀ h, dW_gate += dgᵀ x,
// dW_up += duᵀ x. A tile's rows are contiguous in the ring (tiles never straddle its end), and in MXFP8
// mode a tile starts a 32-row block of its segment (expert_padding % 32 == 0): dy and x are read as
// dispatch quantised them along the tokens, h, dg and du as swiglu_bwd did, the tile slot's blocks.
template <class Ops>
MOK_HD void add_tile(const PassView& v, const Task& task, int64_t tile, int expert, float* sums, float* bias_sums,
                     Ops& ops) {
  WgradBlock b = wgrad_block(v.s, task.block);
  int64_t row0 = tile * v.s.expert_padding;
  int rows = tile_rows(v.s, v.sched, tile, expert);
  Operand other = b.matrix == 0 ? ring_columns(v, v.ring_h, v.mx_h, row0, v.s.intermediate)
                                : ring_columns(v, v.ring_x, v.mx_x, row0, v.s.hidden);
  ops.gemm(gemm_one(b.rows, b.cols, wgrad_rows(v, b, row0), other, rows, sums, b.cols, Epilogue::accumulate_f32));
  if (bias_sums) ops.rows(v, wgrad_job(RowWork::bias_columns, task.block, expert, tile, sums, bias_sums));
}

// Part `part` of tile `tile`'s columns added into the block's bias sums (add_tile).
MOK_HD inline void add_bias_columns(const PassView& v, const RowJob& job, Part part) {
  WgradBlock b = wgrad_block(v.s, job.block);
  add_columns(wgrad_rows(v, b, job.first * v.s.expert_padding), b.rows, tile_rows(v.s, v.sched, job.first, job.expert),
              job.bias_sums, part);
}

// Part `part` of the block's sums (and bias sums) zeroed: the expert's first part starts them.
MOK_HD inline void start_block(const PassView& v, const RowJob& job, Part part) {
  WgradBlock b = wgrad_block(v.s, job.block);
  auto zero = [&](float* sums, int64_t n) {
    each_piece(part, n, kPieceValues, [&](int64_t first, int count) {
      for (int i = 0; i < count; ++i) sums[first + i] = 0.0f;
    });
  };
  zero(job.sums, static_cast<int64_t>(b.rows) * b.cols);
  if (job.bias_sums) zero(job.bias_sums, b.rows);
}

// Part `part` of the block's sums into the caller's gradient (and of its bias sums into the bias gradient): bf16, or
// added into fp32 main_grad.
MOK_HD inline void write_block(const PassView& v, const RowJob& job, Part part) {
  const PassArgs& a = *v.args;
  WgradBlock b = wgrad_block(v.s, job.block);
  int height = b.matrix == 0 ? v.s.hidden : v.s.intermediate;
  auto write = [&](const float* sums, int64_t n, void* grad, int64_t at) {
    each_piece(part, n, kPieceValues, [&](int64_t first, int count) {
      write_gradient(sums + first, count, a.accumulate != 0, grad, at + first);
    });
  };
  void* grad = b.matrix == 0 ? a.ddown : (b.matrix == 1 ? a.dgate : a.dup);
  write(job.sums, static_cast<int64_t>(b.rows) * b.cols, grad,
        (static_cast<int64_t>(job.expert) * height + b.row0) * b.cols);
  if (job.bias_sums)
    write(job.bias_sums, b.rows, bias_gradient(a, b.matrix), static_cast<int64_t>(job.expert) * height + b.row0);
}

// One block of an expert's weight gradient over one part of its rows, rows in order. The sums start at
// 0 in the expert's first part and carry over in its slot to the next, so they never depend on where
// the parts were cut, on the schedule's batching or on which worker ran which task.
template <class Ops>
MOK_HD Failure run_wgrad(const PassView& v, const Task& task, Ops& ops) {
  const WgradPart& p = v.graph.parts[task.index];
  WgradBlock b = wgrad_block(v.s, task.block);
  uint32_t finished = tile_finished(v.s, v.kind);
  for (int64_t t = p.first_tile; t < p.end_tile; ++t) {
    Failure f = wait_local(v, &v.c.stage[t], finished, WaitId::tile_stage);
    if (!f.ok()) return f;
  }
  uint32_t* chain = p.slot >= 0 ? &v.c.wchain[p.slot * wgrad_tasks_per_part(v.s) + task.block] : nullptr;
  if (chain && !p.first) {
    Failure f = wait_local(v, chain, static_cast<uint32_t>(p.number), WaitId::wgrad_order);
    if (!f.ok()) return f;
  }
  int64_t ih = static_cast<int64_t>(v.s.intermediate) * v.s.hidden, n = static_cast<int64_t>(b.rows) * b.cols;
  float* slot = p.slot >= 0 ? v.slots + p.slot * slot_floats(v.s) : nullptr;
  float* sums = slot ? slot + b.matrix * ih + static_cast<int64_t>(b.row0) * b.cols : ops.sums;
  // The bias sums carry over as the weight sums do: after the slot's three matrices, or the block's sums.
  float* bias_sums = bias_gradient(*v.args, b.matrix) == nullptr
                         ? nullptr
                         : (slot ? slot + 3 * ih + bias_slot_offset(v.s, b.matrix) + b.row0 : ops.sums + n);
  if (p.first) ops.rows(v, wgrad_job(RowWork::wgrad_start, task.block, p.expert, 0, sums, bias_sums));
  for (int64_t t = p.first_tile; t < p.end_tile; ++t) add_tile(v, task, t, p.expert, sums, bias_sums, ops);
  if (p.last) ops.rows(v, wgrad_job(RowWork::wgrad_write, task.block, p.expert, 0, sums, bias_sums));
  if (chain) publish(chain, static_cast<uint32_t>(p.number + 1));
  // The part's ring rows may now be overwritten, as far as this task is concerned.
  if (p.end_tile > p.first_tile)
    for (int64_t m = tile_minibatch(v.s, p.first_tile); m <= tile_minibatch(v.s, p.end_tile - 1); ++m)
      bump(&v.c.wdone[m]);
  return kNoFailure;
}

// ---- the shared expert (local tokens, no peers) -----------------------------------------------

// The gated shared expert's backward of one token: s = the gate, ds = dout . shared (fp32, over H in
// order), scaled = bf16(s * dout); returns dlogit = (ds * s) * (1 - s) in fp32.
MOK_HD_NOINLINE float gate_backward_row(const bf16_t* x, const bf16_t* router, const bf16_t* dout, const bf16_t* shared,
                                        int h, bf16_t* scaled) {
  float s = shared_gate_of(x, router, h), ds = 0.0f;
  for (int i = 0; i < h; ++i) {
    float d = bf16_to_float(dout[i]);
    ds = add_rn(ds, mul_rn(d, bf16_to_float(shared[i])));
    scaled[i] = float_to_bf16(mul_rn(s, d));
  }
  return mul_rn(mul_rn(ds, s), 1.0f - s);
}

// The gate's term of the input gradient, folded into the shared expert's bf16 dx: bf16(dx + dlogit * r).
MOK_HD_NOINLINE void add_gate_dx_row(float dlogit, const bf16_t* router, int h, bf16_t* dx) {
  for (int i = 0; i < h; ++i)
    dx[i] = float_to_bf16(add_rn(bf16_to_float(dx[i]), mul_rn(dlogit, bf16_to_float(router[i]))));
}

// dr += dlogit * x over H, in fp32.
MOK_HD_NOINLINE void add_router_gradient_row(float dlogit, const bf16_t* x, int h, float* dr) {
  for (int i = 0; i < h; ++i) dr[i] = add_rn(dr[i], mul_rn(dlogit, bf16_to_float(x[i])));
}

// Chunk c of the shared expert: the local tokens [c * P, min((c + 1) * P, tokens)), P = expert_padding; its g, u,
// h, dh ([P, I_s] bf16 each), the gated backward's scaled dout ([P, H] bf16) and dlogit ([P] fp32) in the worker's
// chunk rows; the tokens' x, dout and shared output (or dx) rows.
struct SharedChunk {
  int64_t first;
  int rows;
  bf16_t *g, *u, *hr, *dh, *scaled;
  float* dlogit;
  const bf16_t *xs, *dout;
  bf16_t* out;
};

MOK_HD inline SharedChunk shared_chunk(const PassView& v, int64_t chunk, bf16_t* chunk_rows) {
  int h = v.s.hidden;
  int64_t p = v.s.expert_padding, rows = p * v.s.shared_intermediate;
  SharedChunk c;
  c.first = chunk * p;
  c.rows = static_cast<int>((c.first + p < v.tokens ? c.first + p : v.tokens) - c.first);
  c.g = chunk_rows, c.u = c.g + rows, c.hr = c.u + rows, c.dh = c.hr + rows, c.scaled = c.dh + rows;
  c.dlogit = reinterpret_cast<float*>(c.scaled + (p * h + 1) / 2 * 2);
  c.xs = peer_array<const bf16_t>(v, v.s.rank, v.peer.x) + c.first * h;
  c.dout = is_backward(v.kind) ? peer_array<const bf16_t>(v, v.s.rank, v.peer.dout) + c.first * h : nullptr;
  c.out = v.shared_out + c.first * h;
  return c;
}

// Part `part` of a row stage of the shared expert's chunk `job.first` (rows in `job.staging`): its pieces of each
// token's row, or (the gate's backward, a dot over the row) its tokens; the router's gradient adds the tokens in order
// into each of its pieces.
MOK_HD inline void shared_row_stage(const PassView& v, const RowJob& job, Part part) {
  SharedChunk c = shared_chunk(v, job.first, job.staging);
  int h = v.s.hidden, is = v.s.shared_intermediate;
  Swiglu sw = layer_swiglu(v.s, v.sigmoid_table);
  const bf16_t* router = v.w.shared_router;
  if (job.work == RowWork::shared_gate) {
    for (int r = part.index; r < c.rows; r += part.count)
      c.dlogit[r] = gate_backward_row(c.xs + r * h, router, c.dout + r * h, c.out + r * h, h, c.scaled + r * h);
    return;
  }
  if (job.work == RowWork::shared_router)
    return each_piece(part, h, kPieceValues, [&](int64_t i, int n) {
      for (int r = 0; r < c.rows; ++r) add_router_gradient_row(c.dlogit[r], c.xs + r * h + i, n, v.acc.srouter + i);
    });
  for (int r = 0; r < c.rows; ++r) {
    int64_t at = static_cast<int64_t>(r) * is;
    if (job.work == RowWork::shared_gate_dx)
      each_piece(part, h, kPieceValues,
                 [&](int64_t i, int n) { add_gate_dx_row(c.dlogit[r], router + i, n, c.out + r * h + i); });
    else if (job.work == RowWork::shared_swiglu)
      each_piece(part, is, kPieceValues,
                 [&](int64_t i, int n) { swiglu_row(sw, c.g + at + i, c.u + at + i, n, c.hr + at + i); });
    else
      each_piece(part, is, kPieceValues,
                 [&](int64_t i, int n) { swiglu_gradient_row(sw, c.g + at + i, c.u + at + i, c.dh + at + i, n); });
  }
}

// Chunk c: g, u, h (and in backward dh, then dg, du in place of g, u) in the worker's chunk rows; the output (or dx)
// in shared_out; in backward then the weight gradients, chunks in order.
template <class Ops>
MOK_HD Failure run_shared(const PassView& v, int64_t chunk, Ops& ops) {
  int h = v.s.hidden, is = v.s.shared_intermediate;
  bool backward = is_backward(v.kind);
  SharedChunk c = shared_chunk(v, chunk, ops.chunk);
  auto rows = [&](RowWork work) { ops.rows(v, rows_job(work, chunk, 0, ops.chunk)); };
  Operand x = bf16_operand(c.xs, h, 1, false);
  Operand wgate = bf16_operand(v.w.shared_gate, h, 1, false), wup = bf16_operand(v.w.shared_up, h, 1, false);
  ops.gemm(gemm_one(c.rows, is, x, wgate, h, c.g, is, Epilogue::store_bf16));
  ops.gemm(gemm_one(c.rows, is, x, wup, h, c.u, is, Epilogue::store_bf16));
  rows(RowWork::shared_swiglu);
  // The shared output: the forward's result, and in the gated backward what ds_t reads (in out, which the
  // input gradient overwrites below).
  bool gated = v.w.shared_router != nullptr;
  if (!backward || gated)
    ops.gemm(gemm_one(c.rows, h, bf16_operand(c.hr, is, 1, false), bf16_operand(v.w.shared_down, is, 1, false), is,
                      c.out, h, Epilogue::store_bf16));
  if (!backward) return kNoFailure;
  // Gated: the shared expert's dout is bf16(s_t * dout_t), in the chunk's scaled rows, and dlogit_t.
  if (gated) rows(RowWork::shared_gate);
  const bf16_t* sdout = gated ? c.scaled : c.dout;
  ops.gemm(gemm_one(c.rows, is, bf16_operand(sdout, h, 1, false), bf16_operand(v.w.shared_down, 1, is, false), h, c.dh,
                    is, Epilogue::store_bf16));
  rows(RowWork::shared_gradient);
  GemmPart dgate{bf16_operand(c.g, is, 1, false), bf16_operand(v.w.shared_gate, 1, h, false), is};
  GemmPart dup{bf16_operand(c.u, is, 1, false), bf16_operand(v.w.shared_up, 1, h, false), is};
  ops.gemm(gemm_two(c.rows, h, dgate, dup, c.out, h));
  if (gated) rows(RowWork::shared_gate_dx);
  // Only the weight gradients need the chunks in order: everything above runs on any worker at once.
  Failure f = wait_local(v, v.c.shared, static_cast<uint32_t>(chunk), WaitId::shared_order);
  if (!f.ok()) return f;
  Operand xt = bf16_operand(c.xs, 1, h, false);
  ops.gemm(gemm_one(h, is, bf16_operand(sdout, 1, h, false), bf16_operand(c.hr, 1, is, false), c.rows, v.acc.sdown, is,
                    Epilogue::accumulate_f32));
  // dr += dlogit_t x_t, tokens in order (chunks in order, rows in order): fp32, deterministic.
  if (gated) rows(RowWork::shared_router);
  ops.gemm(gemm_one(is, h, bf16_operand(c.g, 1, is, false), xt, c.rows, v.acc.sgate, h, Epilogue::accumulate_f32));
  ops.gemm(gemm_one(is, h, bf16_operand(c.u, 1, is, false), xt, c.rows, v.acc.sup, h, Epilogue::accumulate_f32));
  publish(v.c.shared, static_cast<uint32_t>(chunk + 1));
  return kNoFailure;
}

}  // namespace mok::core
