// A tile GEMM (gemm.hpp) on tensor cores, as core describes it: the blocks a CTA's MMAs take, the bytes each
// operand panel holds in shared memory, and the epilogue that turns an fp32 accumulator into c. The device code
// (cuda/tensor_tile.cuh) only moves these bytes and issues the MMAs; the host runs this file in tests.
//
// The tile is cut into chunks of kMmaRows x kMmaCols outputs; each chunk's accumulator sums every part's depth in
// blocks of kMmaDepth, kPanelStages blocks of a and b at a time in shared memory, and two chunks' accumulators in
// tensor memory, one summed while the other is written out (sum_tile). Operands are read as
// bf16: a bf16 operand as stored, an e4m3 one as its value (code times scale), which is a bf16 except at extreme
// scales; a part whose a and b are e4m3 stored K-major, for a CTA whose MMAs are block-scaled, as codes and scales
// in blocks of kScaledDepth (scaled_block.hpp). A chunk with a value that is not exactly a bf16 is computed element by
// element instead (gemm_element.hpp), so the products the tensor cores sum are always the operands' own.
#pragma once

#include "core/gemm.hpp"
#include "core/gemm_element.hpp"
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

// A scaled block's depth: an MXFP8 part's e4m3 codes as the block-scaled MMA takes them (core/scaled_block.hpp), 128
// a row, one 128-byte line of the swizzle as a bf16 block's 64 values are, under 4 blocks of scales.
constexpr int kScaledDepth = 128;

// Whether the block-scaled MMA can take part p: both operands e4m3 codes stored K-major, each with its scales along
// the depth in blocks of 32 from k = 0, as the MMA reads them.
MOK_HD inline bool scaled_part(const GemmPart& p) {
  return p.a.dtype == Dtype::e4m3 && p.b.dtype == Dtype::e4m3 && p.a.depth_stride == 1 && p.b.depth_stride == 1;
}
// The parts of g (bit p) the block-scaled MMA can take.
MOK_HD inline uint32_t scaled_parts(const Gemm& g) {
  uint32_t scaled = 0;
  for (int p = 0; p < g.num_parts; ++p)
    if (scaled_part(g.parts[p])) scaled |= 1u << p;
  return scaled;
}
// A block's depth in part p, for a CTA whose MMAs take the parts in `scaled` block-scaled.
MOK_HD inline int block_depth(uint32_t scaled, int part) {
  return scaled >> part & 1u ? kScaledDepth : kMmaDepth;
}

// The blocks of part p's depth, for such a CTA.
MOK_HD inline int part_blocks(const Gemm& g, uint32_t scaled, int part) {
  return ceil_div(g.parts[part].depth, block_depth(scaled, part));
}
// The blocks of a chunk, in the order its accumulator sums them: part 0's depth, then part 1's, those of the parts in
// `scaled` kScaledDepth deep, the others kMmaDepth.
MOK_HD inline int chunk_blocks(const Gemm& g, uint32_t scaled) {
  int n = 0;
  for (int p = 0; p < g.num_parts; ++p) n += part_blocks(g, scaled, p);
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
  return chunk_blocks(g, 0) > 0;
}

// How a panel holds its operand in shared memory, in rows of 128 bytes (64 values) under the UMMA 128-byte swizzle:
// K-major, a row of the operand's depth each (an operand stored K-major), or MN-major, 64 of its rows at one k each
// (an operand stored MN-major: row_stride 1). The MMA reads either (cuda/tensor_tile.cuh), so a panel is laid out as
// its operand is stored and a 16-byte piece of the panel is 16 bytes of the operand's storage.
enum class PanelMajor : uint8_t { k, mn };
MOK_HD inline PanelMajor panel_major(const Operand& o) {
  return o.depth_stride != 1 && o.row_stride == 1 ? PanelMajor::mn : PanelMajor::k;
}
// The majors of a block's panels: a's, then b's (those of its part's operands), which its MMAs read them in.
struct PanelMajors {
  PanelMajor a, b;
};

// Where element (row, k) of a [kMmaRows, kMmaDepth] bf16 panel lies in shared memory, in values (test_tensor_tile_cute
// holds both against CuTe's UMMA::Layout_K_SW128_Atom and Layout_MN_SW128_Atom tiled as cuda/tensor_tile.cuh tiles
// them). K-major: row r's 128 bytes, each 16-byte chunk k / 8 moved to chunk (k / 8) xor (r mod 8). MN-major: blocks
// of 64 rows, each k's 128 bytes of them, the 16-byte chunk of rows r / 8 mod 8 moved to chunk that xor (k mod 8). A
// 16-byte chunk (8 values along the depth, K-major, or down the rows, MN-major) stays whole.
MOK_HD inline int panel_offset(PanelMajor major, int row, int k) {
  if (major == PanelMajor::k) return row * kMmaDepth + (((k / 8) ^ (row % 8)) * 8) + k % 8;
  constexpr int kRowsAcross = 64;  // a 128-byte line of bf16
  return row / kRowsAcross * (kRowsAcross * kMmaDepth) + k * kRowsAcross + (((row % kRowsAcross / 8) ^ (k % 8)) * 8) +
         row % 8;
}

// An operand's value as the bf16 the tensor cores read, `exact` cleared when it is not that value (NaN stays NaN and
// counts as exact).
MOK_HD inline bf16_t tensor_value(float v, bool& exact) {
  bf16_t b = float_to_bf16(v);
  float back = bf16_to_float(b);
  if (back != v && (back == back || v == v)) exact = false;
  return b;
}

// Operand value (i, k) as the bf16 the tensor cores read, 0 outside [rows, depth) (the panel's padding).
MOK_HD inline bf16_t panel_value(const Operand& o, int rows, int depth, int i, int k, bool& exact) {
  if (i >= rows || k >= depth) return bf16_t(0);
  return tensor_value(stored_value(o, i, k), exact);
}

// One block of a chunk: part `part`'s depth from k0 (at most kMmaDepth of it, or kScaledDepth when `scaled`: its
// codes and scales for the block-scaled MMA); the chunk's rows from row0 and columns from col0.
struct MmaBlock {
  int row0, col0, part, k0;
  bool scaled;
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

MOK_HD inline PanelMajors block_majors(const Gemm& g, const MmaBlock& b) {
  return PanelMajors{panel_major(g.parts[b.part].a), panel_major(g.parts[b.part].b)};
}

// Block `block` of chunk `chunk`, for a CTA whose MMAs take the parts in `scaled` block-scaled.
MOK_HD inline MmaBlock chunk_block(const Gemm& g, int chunk, int block, uint32_t scaled) {
  int p = 0;
  while (p + 1 < g.num_parts && block >= part_blocks(g, scaled, p)) block -= part_blocks(g, scaled, p++);
  return MmaBlock{chunk_row0(g, chunk), chunk_col0(g, chunk), p, block * block_depth(scaled, p),
                  (scaled >> p & 1u) != 0};
}

// One operand of a block as its panel takes it: its part's a (second false) or b, with its rows (the GEMM's rows, or
// its columns), the part's depth, and the block's first row of it (the chunk's first row, or column).
struct BlockOperand {
  const Operand& o;
  int rows, depth, row0;
};
MOK_HD inline BlockOperand block_operand(const Gemm& g, const MmaBlock& b, bool second) {
  const GemmPart& part = g.parts[b.part];
  return BlockOperand{second ? part.b : part.a, second ? g.cols : g.rows, part.depth, second ? b.col0 : b.row0};
}

// A panel's 16-byte pieces (tile.hpp's Piece): 8 values the swizzle keeps together, along the depth (K-major) or down
// the rows (MN-major).
constexpr int kBlockPieces = 2 * kPanelValues / kPieceValues;  // a's panel's, then b's

// A piece's one copy into its panel: a plain 16-byte move (the host's; the device's is asynchronous,
// cuda/tensor_tile.cuh).
struct PieceMove {
  MOK_HD void operator()(Piece* to, const Piece* from) const { *to = *from; }
};

// Piece `p` (0 <= p < kBlockPieces) of a block into the panel pair: a's panel then b's, each in its operand's major
// (panel_major). Neighbouring pieces are neighbours in the operand's storage: K-major, row by row, 8 pieces a row's
// 128 bytes; MN-major, k by k, 16 pieces 128 rows. A bf16 operand's piece that lies whole inside the tile and on 16
// bytes is one copy (`move`); a K-major e4m3 one's 8 codes, inside one 32-value block, share one scale, read once;
// any other is read value by value (panel_value). `exact` is cleared where a value is not a bf16. Threads split the
// pieces any way they like; neighbouring threads taking neighbouring pieces read 128 or 256 bytes together.
template <class Move = PieceMove>
MOK_HD inline void fill_piece(const Gemm& g, const MmaBlock& b, int p, bf16_t* panels, bool& exact, Move move = {}) {
  bool second = p >= kBlockPieces / 2;
  int local = second ? p - kBlockPieces / 2 : p;
  BlockOperand side = block_operand(g, b, second);
  const Operand& o = side.o;
  PanelMajor major = panel_major(o);
  bool mn = major == PanelMajor::mn;
  constexpr int kDepthPieces = kMmaDepth / kPieceValues, kRowPieces = kMmaRows / kPieceValues;
  int row = mn ? local % kRowPieces * kPieceValues : local / kDepthPieces;
  int k = mn ? local / kRowPieces : local % kDepthPieces * kPieceValues;
  int i = side.row0 + row, rows = side.rows, depth = side.depth;
  Piece* out = reinterpret_cast<Piece*>(panels + (second ? kPanelValues : 0) + panel_offset(major, row, k));
  int last_i = mn ? i + kPieceValues - 1 : i, last_k = b.k0 + k + (mn ? 0 : kPieceValues - 1);
  bool inside = last_i < rows && last_k < depth;  // every value of the piece is the operand's
  bool contiguous = mn || o.depth_stride == 1;    // the piece's 8 values are 16 bytes of the operand's storage
  if (o.dtype == Dtype::bf16 && contiguous && inside) {
    const bf16_t* from = static_cast<const bf16_t*>(o.data) + i * o.row_stride + (b.k0 + k) * o.depth_stride;
    if (on_piece(from)) return move(out, reinterpret_cast<const Piece*>(from));
  }
  Piece piece;
  static_assert(kMxBlock % kPieceValues == 0 && kMmaDepth % kMxBlock == 0, "a K-major piece is inside a scale block");
  if (o.dtype == Dtype::e4m3 && !mn && inside) {
    const uint8_t* codes = static_cast<const uint8_t*>(o.data) + i * o.row_stride + (b.k0 + k) * o.depth_stride;
    float scale = e8m0_decode(operand_scale(o, i, (b.k0 + k) / kMxBlock));
    for (int v = 0; v < kPieceValues; ++v)
      piece.values[v] = tensor_value(mx_value(codes[v * o.depth_stride], scale), exact);
  } else {
    for (int v = 0; v < kPieceValues; ++v)
      piece.values[v] = panel_value(o, rows, depth, mn ? i + v : i, mn ? b.k0 + k : b.k0 + k + v, exact);
  }
  *out = piece;
}

// The panels' stages: kPanelStages pairs of panels in shared memory. While the MMAs of a tile's block b run, the
// copies of blocks b + 1 to b + kPanelStages - 2 fly into stages of their own and b - 1's stage, whose MMAs ran before
// b's, takes the copies of the next: the blocks' latencies overlap each other and the MMAs. Block b of a tile (its
// chunks' blocks one after the other) goes to stage b % kPanelStages. Each stage has a barrier whose phase the MMAs'
// commit completes, once per block they take from the stage.
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

// Every busy stage's MMAs waited for, by every thread of a CTA (`cta` as in sum_tile); false when a wait ran out.
template <class Cta>
MOK_HD bool drain_stages(PanelStages& stages, Cta& cta) {
  if (!cta.sync(wait_busy(stages, cta))) return false;
  stages.waited(stages.pending);
  return true;
}

// Two accumulators in tensor memory: chunk c sums into accumulator c % 2 while the epilogue reads chunk c - 1's from
// the other.
constexpr int kAccumulators = 2;
// A chunk's epilogue in slices of kEpilogueColumns columns (one tensor-memory load of 8 columns a thread), spread
// over the next chunk's blocks so that the tensor cores sum that chunk meanwhile.
constexpr int kEpilogueColumns = 8;
constexpr int kEpilogueSlices = kMmaCols / kEpilogueColumns;
static_assert(kMmaCols % kEpilogueColumns == 0, "a chunk's columns are whole slices");

// The slices of a chunk's epilogue written by the end of step `step` of `steps`: all of them by the last step.
MOK_HD inline int slices_by(int step, int steps) {
  return static_cast<int>(static_cast<int64_t>(kEpilogueSlices) * (step + 1) / steps);
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

// Slices [from, to) of chunk `chunk` element by element (gemm_element), part `part` of them: the epilogue of a chunk
// with a value that is not a bf16, whose accumulator is not the operands' sum.
MOK_HD inline void chunk_elements(const Gemm& g, int chunk, int from, int to, Part part) {
  gemm_elements(g, chunk_row0(g, chunk), chunk_col0(g, chunk) + from * kEpilogueColumns, kMmaRows,
                (to - from) * kEpilogueColumns, part);
}

// The state of one thread's walk over a tile's blocks (sum_tile): the tile's chunks one after the other, each chunk's
// blocks in the order its accumulator sums them, block q of the tile in stage q % kPanelStages.
template <class Cta>
struct TileWalk {
  const Gemm& g;
  PanelStages& stages;
  Cta& cta;
  uint32_t scaled;     // the parts whose blocks the CTA's MMAs take block-scaled
  int per_chunk;       // the blocks of a chunk (chunk_blocks: every chunk has as many)
  int blocks;          // the tile's
  int started = 0;     // blocks whose copies this thread started
  uint32_t waits = 0;  // stages whose MMAs this thread waited for since the CTA's last vote
  // Bit c % 32: this thread put a value that is not a bf16 into chunk c's panels. The chunks filled and not yet
  // judged (by agree) are at most kPanelStages: fills run kPanelStages - 1 blocks ahead.
  uint32_t inexact = 0;
  bool exact = true;  // the chunk being written is the operands' own values, for every thread

  // Stage `stage`'s MMAs waited for, unless this thread did since the last vote; false when the wait ran out.
  MOK_HD bool await(int stage) {
    if (!stages.busy(stage) || (waits >> stage & 1u)) return true;
    if (!cta.wait(stage, stages.parity(stage))) return false;
    waits |= 1u << stage;
    return true;
  }
  // The next block's copies started into its stage, once the MMAs that read the stage before are done; false when
  // that wait ran out.
  MOK_HD bool start_next() {
    int stage = started % kPanelStages, chunk = started / per_chunk;
    if (!await(stage)) return false;
    MmaBlock block = chunk_block(g, chunk, started % per_chunk, scaled);
    if (!cta.fill(block, stage)) inexact |= 1u << (chunk % 32);
    ++started;
    return true;
  }
  // The CTA's vote: true when every thread was `ok`, the stages waited for since the last vote then marked; false
  // (another thread's wait ran out, or this one's) with this thread's copies landed: nothing writes the panels after.
  MOK_HD bool vote(bool ok) {
    if (!cta.sync(ok)) {
      cta.land(started, 0);
      return false;
    }
    stages.waited(waits);
    waits = 0;
    return true;
  }
  // After a vote: whether chunk `chunk`'s panels held only bf16 values, from every thread.
  MOK_HD void judge(int chunk) {
    uint32_t bit = 1u << (chunk % 32);
    exact = cta.agree(!(inexact & bit));
    inexact &= ~bit;
  }
  // Step `step` of `steps` of chunk `chunk`'s epilogue: its share of the slices, from the last step's on.
  MOK_HD void write_share(int chunk, int step, int steps) {
    int from = step == 0 ? 0 : slices_by(step - 1, steps), to = slices_by(step, steps);
    if (from < to) cta.write(chunk, chunk % kAccumulators, from, to, exact);
  }
};

// A tile's sum and epilogue on tensor cores, by every thread of a CTA alike: every chunk's blocks, one after the
// other through the stages, into the chunk's accumulator, the chunk then written out from it. The copies of a block
// start kPanelStages - 1 steps before its MMAs (the tile's first blocks' before any MMA), into the stage whose MMAs
// were issued the step before (once they are done), and land just before its MMAs, from one chunk into the next: the
// blocks' latencies overlap each other and the MMAs. Chunk c's epilogue is written in slices over chunk c + 1's
// steps, from the other accumulator, while the tensor cores sum c + 1; the last chunk's after every MMA is done. `cta`
// is how a CTA takes each step:
//   uint32_t scaled              the parts (bit p) whose blocks its MMAs take block-scaled, of those scaled_parts names
//   bool wait(stage, parity)     the stage's barrier passed its phase of that parity (false: not in time)
//   bool fill(block, stage)      this thread's copies of the MmaBlock started into the stage's panels (fill_piece, in
//                                the block's majors, block_majors; a scaled block's codes and scales, fill_codes and
//                                fill_scales), as one group; false when a value it put there is not the operand's own
//                                (panel_value)
//   bool land(fills, groups)     this thread's copies landed, but those of the last `groups` of the tile's `fills` so
//                                far; false when one did not land in time (a TMA load's wait ran out): the tile has
//                                failed
//   bool sync(ok)                the CTA's barrier after every thread's landing; false for all when `ok` was false for
//                                one: the tile has failed (a wait ran out)
//   bool agree(yes)              the CTA's barrier; true for all when `yes` was true for every one: a verdict, not a
//                                failure
//   void multiply(stage, accumulator, first)
//                                the MMAs over the stage's panels, read as the block its last fill put there holds
//                                them (its majors, or its codes and scales), into the accumulator (first: zeroed
//                                before), then their commit to the stage's barrier; by the threads that issue MMAs
//   void write(chunk, accumulator, from, to, exact)
//                                the chunk's epilogue slices [from, to) into c: core's tensor_epilogue from the
//                                accumulator, or (not exact) gemm_element's, by the CTA's threads
// Returns false when a wait ran out, with none of this thread's copies in flight; `stages` then names each stage whose
// MMAs may still run.
template <class Cta>
MOK_HD bool sum_tile(const Gemm& g, PanelStages& stages, Cta& cta) {
  uint32_t scaled = cta.scaled & scaled_parts(g);
  int per_chunk = chunk_blocks(g, scaled);
  TileWalk<Cta> walk{g, stages, cta, scaled, per_chunk, tensor_chunks(g) * per_chunk};
  if (walk.blocks == 0) return true;  // no rows or no columns
  bool ok = true;
  while (ok && walk.started < walk.blocks && walk.started < kPanelStages - 1) ok = walk.start_next();
  for (int block = 0; block < walk.blocks; ++block) {
    bool landed = cta.land(walk.started, ok ? walk.started - block - 1 : 0);
    if (!walk.vote(ok && landed)) return false;
    int chunk = block / per_chunk, step = block % per_chunk, stage = block % kPanelStages;
    cta.multiply(stage, chunk % kAccumulators, step == 0);
    stages.committed(stage);
    if (chunk > 0 && step == 0) {  // the chunk before's epilogue, once its last MMAs (the step before's) are done
      if (!walk.vote(walk.await((block - 1) % kPanelStages))) return false;
      walk.judge(chunk - 1);
    }
    // Block `block` + kPanelStages - 1 into the stage of the block before, its copies in flight while this thread
    // writes its epilogue slices. The last starts in step blocks - kPanelStages, so a later step's vote has `ok`.
    if (walk.started < walk.blocks) ok = walk.start_next();
    // Every thread alike, whatever its wait above: the chunk before's last MMAs were waited for by all.
    if (chunk > 0) walk.write_share(chunk - 1, step, per_chunk);
  }
  if (!drain_stages(stages, cta)) return false;
  int last = tensor_chunks(g) - 1;
  walk.judge(last);
  walk.write_share(last, 0, 1);
  return true;
}

}  // namespace mok::core
