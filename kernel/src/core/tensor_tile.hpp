// A tile GEMM (gemm.hpp) on tensor cores, as core describes it: the blocks a CTA's MMAs take, the bytes each
// operand panel holds in shared memory, and the epilogue that turns an fp32 accumulator into c. The device code
// (cuda/tensor_tile.cuh) only moves these bytes and issues the MMAs; the host runs this file in tests.
//
// The tile is cut into chunks of kMmaRows x kMmaCols outputs; each chunk's accumulator sums every part's depth in
// blocks of kMmaDepth, kPanelStages blocks of a and b at a time in shared memory (sum_chunk). Operands are read as
// bf16: a bf16 operand as stored, an e4m3 one as its value (code times scale), which is a bf16 except at extreme
// scales. A chunk with a value that is not exactly a bf16 is computed element by element instead (gemm_element.hpp), so
// the products the tensor cores sum are always the operands' own.
#pragma once

#include "core/gemm.hpp"
#include "core/tile.hpp"

namespace mok::core {

constexpr int kMmaRows = 128;  // a chunk's rows: the MMA's M, one tensor-memory lane each
constexpr int kMmaCols = 128;  // a chunk's columns: the MMA's N, one tensor-memory column each (fp32)
constexpr int kMmaDepth = 64;  // a block's depth: 128 bytes of bf16, one row of the 128-byte swizzle
constexpr int kPanelValues = kMmaRows * kMmaDepth;  // one operand panel in shared memory (a's; b's as long)
static_assert(kMmaCols == kMmaRows, "a's and b's panels have one layout");

MOK_HD inline int ceil_div(int n, int d) {
  return static_cast<int>(mx_ceil_div(n, d));
}

// The blocks of a chunk, in the order its accumulator sums them: part 0's depth, then part 1's.
MOK_HD inline int chunk_blocks(const Gemm& g) {
  int n = 0;
  for (int p = 0; p < g.num_parts; ++p) n += ceil_div(g.parts[p].depth, kMmaDepth);
  return n;
}
// Whether the tensor cores can take g: every operand stored bf16 or e4m3 (no MXFP8 round trip on read) and
// some depth to sum (an empty sum stays with gemm_element).
MOK_HD inline bool tensor_gemm(const Gemm& g) {
  for (int p = 0; p < g.num_parts; ++p) {
    const Operand& a = g.parts[p].a;
    const Operand& b = g.parts[p].b;
    if (a.quantize || b.quantize || a.dtype == Dtype::f32 || b.dtype == Dtype::f32) return false;
  }
  return chunk_blocks(g) > 0;
}

// Where element (row, k) of a [kMmaRows, kMmaDepth] K-major bf16 panel lies in shared memory, in values: rows of
// 128 bytes, each 16-byte chunk k / 8 of row r moved to chunk (k / 8) xor (r mod 8): the UMMA K-major 128-byte
// swizzle (CuTe's UMMA::Layout_K_SW128_Atom tiled down the rows; test_tensor_tile_cute holds it against CuTe).
MOK_HD inline int panel_offset(int row, int k) {
  return row * kMmaDepth + (((k / 8) ^ (row % 8)) * 8) + k % 8;
}

// Operand value (i, k) as the bf16 the tensor cores read, 0 outside [rows, depth) (the panel's padding), and
// whether it is exactly the operand's value (`exact` cleared when not; NaN stays NaN and counts as exact).
MOK_HD inline bf16_t panel_value(const Operand& o, int rows, int depth, int i, int k, bool& exact) {
  if (i >= rows || k >= depth) return bf16_t(0);
  float v = stored_value(o, i, k);
  bf16_t b = float_to_bf16(v);
  float back = bf16_to_float(b);
  if (back != v && (back == back || v == v)) exact = false;
  return b;
}

// One block of a chunk: part `part`'s depth from k0 (at most kMmaDepth of it); the chunk's rows from row0 and
// columns from col0.
struct MmaBlock {
  int row0, col0, part, k0;
};

MOK_HD inline int tensor_chunks(const Gemm& g) {
  return ceil_div(g.rows, kMmaRows) * ceil_div(g.cols, kMmaCols);
}
MOK_HD inline int chunk_row0(const Gemm& g, int chunk) {
  return chunk % ceil_div(g.rows, kMmaRows) * kMmaRows;
}
MOK_HD inline int chunk_col0(const Gemm& g, int chunk) {
  return chunk / ceil_div(g.rows, kMmaRows) * kMmaCols;
}

MOK_HD inline MmaBlock chunk_block(const Gemm& g, int chunk, int block) {
  int p = 0;
  while (p + 1 < g.num_parts && block >= ceil_div(g.parts[p].depth, kMmaDepth))
    block -= ceil_div(g.parts[p++].depth, kMmaDepth);
  return MmaBlock{chunk_row0(g, chunk), chunk_col0(g, chunk), p, block * kMmaDepth};
}

// A panel's 16-byte pieces (tile.hpp's Piece): 8 values of one row, k from a multiple of 8, which the swizzle keeps
// together.
constexpr int kBlockPieces = 2 * kPanelValues / kPieceValues;  // a's panel's, then b's

// A piece's one copy into its panel: a plain 16-byte move (the host's; the device's is asynchronous,
// cuda/tensor_tile.cuh).
struct PieceMove {
  MOK_HD void operator()(Piece* to, const Piece* from) const { *to = *from; }
};

// Piece `p` (0 <= p < kBlockPieces) of a block into the panel pair: a's panel then b's, each walked row by row. A
// K-major bf16 operand's piece that lies whole inside the tile and on 16 bytes is one copy (`move`); any other is read
// value by value (panel_value: `exact` cleared where a value is not a bf16). Threads split the pieces any way they
// like; neighbouring threads taking neighbouring pieces read a row's 128 bytes together.
template <class Move = PieceMove>
MOK_HD inline void fill_piece(const Gemm& g, const MmaBlock& b, int p, bf16_t* panels, bool& exact, Move move = {}) {
  bool second = p >= kBlockPieces / 2;
  int local = second ? p - kBlockPieces / 2 : p;
  int row = local / (kMmaDepth / kPieceValues), k = local % (kMmaDepth / kPieceValues) * kPieceValues;
  const GemmPart& part = g.parts[b.part];
  const Operand& o = second ? part.b : part.a;
  int i = (second ? b.col0 : b.row0) + row, rows = second ? g.cols : g.rows, depth = part.depth;
  Piece* out = reinterpret_cast<Piece*>(panels + (second ? kPanelValues : 0) + panel_offset(row, k));
  if (o.dtype == Dtype::bf16 && o.depth_stride == 1 && i < rows && b.k0 + k + kPieceValues <= depth) {
    const bf16_t* from = static_cast<const bf16_t*>(o.data) + static_cast<int64_t>(i) * o.row_stride + b.k0 + k;
    if (on_piece(from)) return move(out, reinterpret_cast<const Piece*>(from));
  }
  Piece piece;
  for (int v = 0; v < kPieceValues; ++v) piece.values[v] = panel_value(o, rows, depth, i, b.k0 + k + v, exact);
  *out = piece;
}

// The panels' stages: kPanelStages pairs of panels in shared memory. While the MMAs of a chunk's block b run, the
// copies of blocks b + 1 to b + kPanelStages - 2 fly into stages of their own and b - 1's stage, whose MMAs ran before
// b's, takes the copies of the next: the blocks' latencies overlap each other and the MMAs. Block b of a chunk goes to
// stage b % kPanelStages. Each stage has a barrier whose phase the MMAs' commit completes, once per block they take
// from the stage.
constexpr int kPanelStages = 3;
static_assert(kPanelStages >= 2, "a block's MMAs read one stage while the next block's copies fill another");
static_assert(kPanelStages <= 32, "PanelStages keeps a bit a stage");

// What every thread of a CTA knows alike of the stages' barriers (kept across chunks and tiles): the parity of each
// one's next phase, and which stages hold a block whose MMAs were committed and not yet waited for. An mbarrier's
// parity wait names one of two phases, so a stage never has more than one such block: its next fill waits first.
struct PanelStages {
  uint32_t parities = 0;  // bit s: the parity of stage s's next phase
  uint32_t pending = 0;   // bit s: stage s's last MMAs not yet waited for

  MOK_HD bool busy(int stage) const { return (pending >> stage) & 1u; }
  MOK_HD uint32_t parity(int stage) const { return (parities >> stage) & 1u; }
  MOK_HD void committed(int stage) { pending |= 1u << stage; }
  // The busy stages among `stages` (a bit each) waited for.
  MOK_HD void waited(uint32_t stages) {
    stages &= pending;
    pending &= ~stages;
    parities ^= stages;
  }
};

// This thread's waits for every busy stage's MMAs, up to the first that runs out (the MMAs run in order: a later one
// would run out too); false then. Only the CTA's vote after them (drain_stages) marks the stages waited.
template <class Cta>
MOK_HD bool wait_busy(const PanelStages& stages, Cta& cta) {
  for (int stage = 0; stage < kPanelStages; ++stage)
    if (stages.busy(stage) && !cta.wait(stage, stages.parity(stage))) return false;
  return true;
}

// Every busy stage's MMAs waited for, by every thread of a CTA (`cta` as in sum_chunk); false when a wait ran out.
template <class Cta>
MOK_HD bool drain_stages(PanelStages& stages, Cta& cta) {
  if (!cta.sync(wait_busy(stages, cta))) return false;
  stages.waited(stages.pending);
  return true;
}

// This thread's copies of a chunk's block started into its stage, once the MMAs that read the stage before are done:
// false when that wait ran out. `waits` gathers the stage waited for, which the CTA's next vote marks.
template <class Cta>
MOK_HD bool start_fill(const Gemm& g, int chunk, int block, const PanelStages& stages, Cta& cta, uint32_t& waits) {
  int stage = block % kPanelStages;
  if (stages.busy(stage)) {
    if (!cta.wait(stage, stages.parity(stage))) return false;
    waits |= 1u << stage;
  }
  cta.fill(chunk_block(g, chunk, block), stage);
  return true;
}

// A chunk's sum in the accumulator, by every thread of a CTA alike, its blocks through the stages. The first
// kPanelStages - 1 blocks' copies start before any MMA; each later block's start kPanelStages - 1 steps before its
// MMAs, into the stage whose MMAs were issued the step before (once they are done). A block's copies land just
// before its MMAs. `cta` is how a CTA takes each step:
//   bool wait(stage, parity)     the stage's barrier passed its phase of that parity (false: not in time)
//   void fill(block, stage)      this thread's copies of the MmaBlock started into the stage's panels, as one group
//   void land(groups)            this thread's groups of copies landed, but the last `groups` started
//   bool sync(ok)                the CTA's barrier after every thread's landing; false for all when `ok` was false for
//                                one
//   void multiply(stage, first)  the MMAs over the stage's panels (first: into a zeroed accumulator), then their
//                                commit to the stage's barrier; by the threads that issue MMAs, nothing by the others
// Returns false when a wait ran out, with none of this thread's copies in flight; `stages` then names each stage whose
// MMAs may still run.
template <class Cta>
MOK_HD bool sum_chunk(const Gemm& g, int chunk, PanelStages& stages, Cta& cta) {
  int blocks = chunk_blocks(g), started = 0;
  uint32_t waits = 0;  // stages waited for since the last vote
  bool ok = true;
  for (; ok && started < blocks && started < kPanelStages - 1; ++started)
    ok = start_fill(g, chunk, started, stages, cta, waits);
  for (int block = 0; block < blocks; ++block) {
    cta.land(ok ? started - block - 1 : 0);
    if (!cta.sync(ok)) {  // another thread's wait ran out: nothing left to write into the panels
      cta.land(0);
      return false;
    }
    stages.waited(waits);
    waits = 0;
    cta.multiply(block % kPanelStages, block == 0);
    stages.committed(block % kPanelStages);
    // Block b + kPanelStages - 1 into b - 1's stage. The last starts in step blocks - kPanelStages, so a later step's
    // vote has `ok`.
    if (started < blocks) ok = start_fill(g, chunk, started++, stages, cta, waits);
  }
  return drain_stages(stages, cta);  // the accumulator whole before the epilogue reads it
}

// Element (i, j) of the chunk from its accumulator: store_bf16 adds the bias and rounds once, as reference_gemm;
// accumulate_f32 adds the chunk's sum to c's value (one more rounding than the product-by-product order).
MOK_HD inline void tensor_epilogue(const Gemm& g, int i, int j, float sum) {
  if (i >= g.rows || j >= g.cols) return;
  int64_t at = static_cast<int64_t>(i) * g.c_stride + j;
  if (g.epilogue == Epilogue::store_bf16)
    static_cast<bf16_t*>(g.c)[at] = float_to_bf16(with_bias(g, j, sum));
  else
    static_cast<float*>(g.c)[at] = add_rn(static_cast<float*>(g.c)[at], sum);
}

}  // namespace mok::core
