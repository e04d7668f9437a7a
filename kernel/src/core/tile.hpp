// The elementwise stages of a tile, one row at a time, on the rows' bf16 bytes: SwiGLU forward and
// backward (computed in fp32 from the stored values, stored bf16, DESIGN 1) and the row moves of the
// comm tasks; and the row stages as jobs that a worker's threads share. The GEMMs are gemm.hpp's.
#pragma once

#include <cstdint>

#include "core/numeric.hpp"

namespace mok::core {

// A tile of a task: expert_padding ring rows of one expert from row0 (rows of them real), in its minibatch.
struct TileInfo {
  int64_t tile, row0, minibatch;
  int expert, rows;
  int col0, cols;  // a GEMM stage's block of output columns
};

// 16 bytes of bf16: the values a thread moves at a time.
constexpr int kPieceValues = 8;
struct alignas(16) Piece {
  bf16_t values[kPieceValues];
};
constexpr int kPieceBytes = static_cast<int>(sizeof(Piece));  // 16 e4m3 codes
MOK_HD inline bool on_piece(const void* at) {
  return reinterpret_cast<uintptr_t>(at) % sizeof(Piece) == 0;
}

// ---- row stages shared over parts ------------------------------------------------------------------

// Part `index` of `count`: one of the threads a worker shares a row stage over (the fused executor's CTA), or
// the whole stage (kWhole). Each part takes its own elements, so the parts run in any order or at once, and
// any split gives the same bytes.
struct Part {
  int index, count;
};
constexpr Part kWhole{0, 1};

// The pieces [first, first + n) of `size` elements that `part` takes: `piece` elements each, piece i to part
// i mod count (neighbouring parts on neighbouring pieces).
template <class Body>
MOK_HD void each_piece(Part part, int64_t size, int piece, Body body) {
  for (int64_t first = static_cast<int64_t>(part.index) * piece; first < size;
       first += static_cast<int64_t>(part.count) * piece)
    body(first, size - first < piece ? static_cast<int>(size - first) : piece);
}

// A row stage of a task, or a worker's share of the pass's elementwise work, for ops.rows (pass.hpp) to run
// as core::run_rows (pass.hpp) over parts that together are the whole job.
enum class RowWork : uint8_t {
  pull,               // dispatch: ring rows [first, end) from their home ranks (MXFP8 mode: 32 of them staged)
  quantize_pulled,    // MXFP8 mode: ... and quantised into the ring
  push,               // combine: output ring rows [first, end) into their home ranks' slots
  swiglu,             // `tile`'s h = SwiGLU(g, u)
  swiglu_backward,    // bf16 mode: `tile`'s dg, du and h in place
  stage_backward,     // MXFP8 mode: `tile`'s g, u and dh of the 32-row block from ring row `first` staged, and
                      // dg, du and h there
  quantize_backward,  // MXFP8 mode: ... as dg, du and h, quantised into the ring
  wgrad_start,        // a weight-gradient block's sums (and bias sums) zeroed: `block` of `expert`
  bias_columns,       // ... tile `first`'s columns added into its bias sums
  wgrad_write,        // ... its sums into the caller's gradients
  shared_swiglu,      // the shared expert's chunk `first` (rows in `staging`): h = SwiGLU(g, u)
  shared_gate,        // ... the gated backward's scaled dout and dlogit, a token each
  shared_gradient,    // ... dg, du in place of g, u
  shared_gate_dx,     // ... the gate's term added into dx
  shared_router,      // ... the router's gradient, tokens in order
  zero,               // `worker`'s share of the shared expert's weight-gradient accumulators zeroed
  finish,             // `worker`'s share of the home sums and the gradient write-out
};
struct RowJob {
  RowWork work;
  int64_t first, end;
  TileInfo tile;
  int worker;         // zero, finish
  int block, expert;  // the wgrad jobs: a wgrad task's block of an expert's gradients
  bf16_t* staging;    // the worker's block of rows on their way to MXFP8 quantisation (pull, quantize_pulled, the
                      // SwiGLU stages), or
                      // its chunk rows (the shared expert's)
  float* sums;        // the wgrad jobs: the block's weight sums, and its bias sums (null without a bias)
  float* bias_sums;
};

MOK_HD inline RowJob rows_job(RowWork work, int64_t first, int64_t end, bf16_t* staging) {
  return RowJob{work, first, end, TileInfo{}, 0, 0, 0, staging, nullptr, nullptr};
}
MOK_HD inline RowJob tile_job(RowWork work, const TileInfo& tile, bf16_t* staging, int64_t block) {
  return RowJob{work, block, 0, tile, 0, 0, 0, staging, nullptr, nullptr};
}
MOK_HD inline RowJob share_job(RowWork work, int worker) {
  return RowJob{work, 0, 0, TileInfo{}, worker, 0, 0, nullptr, nullptr, nullptr};
}
MOK_HD inline RowJob wgrad_job(RowWork work, int block, int expert, int64_t tile, float* sums, float* bias_sums) {
  return RowJob{work, tile, 0, TileInfo{}, 0, block, expert, nullptr, sums, bias_sums};
}

// ---- rows -------------------------------------------------------------------------------------------

// h = SwiGLU(g, u).
MOK_HD inline void swiglu_row(const Swiglu& sw, const bf16_t* g, const bf16_t* u, int n, bf16_t* h) {
  for (int i = 0; i < n; ++i) h[i] = float_to_bf16(sw.forward(bf16_to_float(g[i]), bf16_to_float(u[i])));
}

// g, u, dh become dg, du in place of g, u.
MOK_HD inline void swiglu_gradient_row(const Swiglu& sw, bf16_t* g, bf16_t* u, const bf16_t* dh, int n) {
  for (int i = 0; i < n; ++i) {
    float dg, du;
    sw.backward(bf16_to_float(g[i]), bf16_to_float(u[i]), bf16_to_float(dh[i]), &dg, &du);
    g[i] = float_to_bf16(dg);
    u[i] = float_to_bf16(du);
  }
}

// g, u, dh become dg, du and h, element by element in place (each is read before it is replaced): the
// backward keeps h for dW_down where the forward's dh was.
MOK_HD inline void swiglu_backward_row(const Swiglu& sw, bf16_t* g, bf16_t* u, bf16_t* hd, int n) {
  for (int i = 0; i < n; ++i) {
    float gv = bf16_to_float(g[i]), uv = bf16_to_float(u[i]), dg, du;
    sw.backward(gv, uv, bf16_to_float(hd[i]), &dg, &du);
    hd[i] = float_to_bf16(sw.forward(gv, uv));
    g[i] = float_to_bf16(dg);
    u[i] = float_to_bf16(du);
  }
}

// Weight-gradient sums into the caller's gradient from its element `at` on: bf16, or added into fp32
// main_grad (each element once, so the sum is main_grad + the whole fp32 sum).
MOK_HD inline void write_gradient(const float* sums, int64_t n, bool accumulate, void* grad, int64_t at) {
  if (accumulate) {
    float* main = static_cast<float*>(grad) + at;
    for (int64_t i = 0; i < n; ++i) main[i] = add_rn(main[i], sums[i]);
  } else {
    bf16_t* out = static_cast<bf16_t*>(grad) + at;
    for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(sums[i]);
  }
}

// n bf16 zeros: the padding rows of a block on its way to quantisation.
MOK_HD inline void zero_rows(bf16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = 0;
}

// A value moved as it is, or scaled: bf16(w · value), a row of dy = w_k · dOut_t (or of x, w_k · x_t).
struct SameValue {
  MOK_HD bf16_t operator()(bf16_t value) const { return value; }
};
struct ScaledValue {
  float weight;
  MOK_HD bf16_t operator()(bf16_t value) const { return float_to_bf16(mul_rn(weight, bf16_to_float(value))); }
};

// The pieces a part reads before it writes any, where src and dst lie on 16 bytes: a thread's reads (a peer's row
// over NVLink) then overlap, where a read and its write would wait for the read piece after piece (the compiler
// keeps a write before the next read, which it may alias).
constexpr int kPiecesInFlight = 4;

// Part `part` of n values from src into dst (which do not overlap), in each_piece's 16-byte pieces, each value
// through `value`: where both lie on 16 bytes, the part's next kPiecesInFlight whole pieces are read before any of
// them is written; the rest a piece at a time.
template <class Value>
MOK_HD void move_part(Part part, const bf16_t* src, int64_t n, bf16_t* dst, Value value) {
  int64_t step = static_cast<int64_t>(part.count) * kPieceValues;
  int64_t first = static_cast<int64_t>(part.index) * kPieceValues;
  bool whole = on_piece(src) && on_piece(dst);
  auto apply = [&](Piece& piece) {
    for (bf16_t& v : piece.values) v = value(v);
  };
  for (; whole && first + (kPiecesInFlight - 1) * step + kPieceValues <= n; first += kPiecesInFlight * step) {
    Piece held[kPiecesInFlight];
    for (int j = 0; j < kPiecesInFlight; ++j) held[j] = *reinterpret_cast<const Piece*>(src + first + j * step);
    for (int j = 0; j < kPiecesInFlight; ++j) {
      apply(held[j]);
      *reinterpret_cast<Piece*>(dst + first + j * step) = held[j];
    }
  }
  for (; first < n; first += step) {
    if (whole && first + kPieceValues <= n) {
      Piece piece = *reinterpret_cast<const Piece*>(src + first);
      apply(piece);
      *reinterpret_cast<Piece*>(dst + first) = piece;
      continue;
    }
    for (int64_t i = first; i < first + kPieceValues && i < n; ++i) dst[i] = value(src[i]);
  }
}

}  // namespace mok::core
