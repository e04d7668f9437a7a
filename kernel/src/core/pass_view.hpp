// Everything a worker of one pass on one rank sees: the pass-local counters, memory, and limits.
//
// Pass-local counters (private workspace, zeroed by the rank before its entry barrier):
//   ready[m]   1 once minibatch m's rows are in the ring            producer: comm (dispatch)
//   stage[t]   tasks of tile t's stages finished                    producer: compute (that tile's tasks)
//   done[m]    tasks of minibatch m's tiles' last stage finished    producer: compute
//   freed[m]   1 once minibatch m's rows are combined               producer: comm (combine)
//   wdone[m]   wgrad tasks finished over parts holding minibatch m  producer: compute (wgrad)
//   wchain[]   per slot and wgrad task: the expert's parts done     producer: compute (wgrad)
//   shared     shared-expert chunks added to its weight gradients   producer: compute (shared)
//   heads[2]   next task of the comm / compute queue                producer: workers taking tasks
//   sync[]     the workers' phase hand-overs (SyncWord)               producer: the workers (pass_worker.hpp)
#pragma once

#include <cstdint>

#include "core/numeric.hpp"
#include "core/protocol.hpp"
#include "core/tasks.hpp"
#include "core/tile.hpp"

namespace mok::core {

struct Counters {
  uint32_t *ready, *done, *freed, *wdone, *stage, *wchain, *shared, *heads;
  uint32_t* sync;  // kSyncWords words, indexed by SyncWord
};

// The sync words. A release word is 0 until worker 0 sets it: kGo (carry on) or kStop (the group or
// a worker failed; every worker goes straight to counting itself out).
enum SyncWord : int {
  kZeroed = 0,  // workers that zeroed their share of the weight-gradient accumulators (backward)
  kStart,       // release: worker 0 passed the entry barrier
  kOut,         // workers out of the task loop
  kClosed,      // release: worker 0 passed the closing barrier
  kFinished,    // workers through their share of the home sums and gradient write-out
  kCounted,     // schedule build: workers that counted their experts
  kLaidOut,     // schedule build, release: worker 0 laid the segments out
  kPlaced,      // schedule build: workers that placed their experts' rows
};
static_assert(kPlaced < kSyncWords, "shape.hpp reserves kSyncWords sync words");
constexpr uint32_t kGo = 1, kStop = 2;

MOK_HD inline Counters counters_at(const LayerShape& s, uint32_t* base) {
  int64_t nm = max_minibatches(s);
  Counters c;
  c.ready = base;
  c.done = c.ready + nm;
  c.freed = c.done + nm;
  c.wdone = c.freed + nm;
  c.stage = c.wdone + nm;
  c.wchain = c.stage + max_tiles(s);
  c.shared = c.wchain + max_slots(s) * wgrad_tasks_per_part(s);
  c.heads = c.shared + 1;
  c.sync = c.heads + 2;
  return c;
}

// MXFP8 weights as the caller stores them (mokMxfp8Matrix_t): e4m3 data [E, rows, cols] and the e8m0
// scales of the blocks of 32 along cols, each expert's matrix in the SM100 layout (mxfp8_layout.hpp),
// MxScaleLayout::of(rows, cols).matrix_bytes() apart.
struct MxWeight {
  const uint8_t* data;
  const uint8_t* scales;
};

// The caller's weights, read in place. bf16 mode: gate, up [E, I, H] and down [E, H, I]; MXFP8 mode:
// the forward operands quantised along their GEMM's reduction dim (rowwise: gate, up along H, down
// along I) and the dgrad operands along the other, stored transposed (colwise: gate, up [E, H, I]
// along I; down [E, I, H] along H). The shared expert is bf16 in both modes.
struct LayerWeights {
  const bf16_t *gate, *up, *down;
  MxWeight gate_rowwise, up_rowwise, down_rowwise;
  MxWeight gate_colwise, up_colwise, down_colwise;
  const bf16_t *shared_gate, *shared_up, *shared_down;
  const bf16_t *gate_bias, *up_bias, *down_bias;  // [E, I], [E, I], [E, H]; null: no bias
  const bf16_t* shared_router;                    // [H], or null: the shared expert ungated
};

// The shared expert's fp32 weight-gradient accumulators (summed over every chunk of the pass).
struct Accumulators {
  float *sgate, *sup, *sdown;
  float* srouter;  // [H]: the shared gate's router gradient
};

// The caller's tensors of one call, as the workers find them: inputs staged into the own peer buffer
// before the pass, and the outputs the home sums and the gradient write-out fill. Unused ones are null.
struct PassArgs {
  const bf16_t* x;            // forward, recompute: [tokens, H]
  const float* topk_weights;  // forward, backward: [tokens, K]
  const bf16_t* dout;         // backward: [tokens, H]
  bf16_t* out;                // forward: [tokens, H]
  bf16_t* dx;                 // backward: [tokens, H]
  float* dtopk_weights;       // backward: [tokens, K]
  void *dgate, *dup, *ddown;  // backward: bf16, or fp32 main_grad with accumulate
  void *dshared_gate, *dshared_up, *dshared_down;
  void *dgate_bias, *dup_bias, *ddown_bias;  // backward, each optional: as the weight gradients
  void* dshared_router;                      // with weights.shared_router
  int accumulate;
};

// A ring in MXFP8 mode: the bytes the block-scaled GEMMs read (shape.hpp's MxRingLayout). rows: e4m3
// codes of ring row r at rows + r * stride in blocks of 32 along the row, scales ring_row_scales; tokens:
// e4m3 code (r, c) at tokens + r * stride + c, each column in blocks of 32 ring rows from each tile's
// first row, scales per tile slot ring_token_scales. x and dy (width H, stride H; written by dispatch,
// comm_tasks.hpp) have both; h in the forward (width I, stride 2 I: in ring_h's bytes; written by
// swiglu) its rows; dg, du and h in the backward (in ring_g, ring_u, ring_h; written by swiglu_bwd) both.
struct MxRing {
  uint8_t *rows, *row_scales, *tokens, *token_scales;
  int64_t stride;
};

struct GroupState;  // core/group_state.hpp

struct PassView {
  LayerShape s;
  PassKind kind;
  PeerLayout peer;
  char* const* peers;          // every rank's peer buffer
  PeerHeader* const* headers;  // their headers
  Schedule sched;
  TaskGraph graph;
  Counters c;
  bf16_t *ring_x, *ring_dy, *ring_g, *ring_u, *ring_h, *ring_y;  // ring_y: y (forward) or dx (backward)
  MxRing mx_x, mx_dy;       // MXFP8 mode: x and dy (ring_x and ring_dy are then empty)
  MxRing mx_g, mx_u, mx_h;  // MXFP8 mode: dg, du, h in their rings' bytes (SwiGLU's bf16 g, u before)
  LayerWeights w;
  Accumulators acc;
  float* slots;        // max_slots x slot_floats fp32 (shape.hpp): experts with several parts
  bf16_t* shared_out;  // [tokens, H]: shared output (forward) or its input gradient (backward)
  float* scratch;      // per worker, scratch_floats each: MXFP8's staging, the host's tile GEMMs
  size_t scratch_floats;
  bf16_t* chunk;  // per compute worker, chunk_values each: the shared expert's rows of one chunk
  size_t chunk_values;
  float* sums;  // per compute worker, sums_floats each: a weight-gradient task's sums
  size_t sums_floats;
  const float* sigmoid_table;  // the executor's fill_sigmoid_table, or null (SwiGLU then calls expf)
  int tokens;                  // this rank's tokens
  uint64_t timeout_ns;
  ErrorRecord* error;
  const PassArgs* args;  // the call's tensors (null in a schedule build)
  GroupState* group;     // the rank's group state: epochs, formation, a failure of the group to word
  // A device executor's pass (the fused kernel): worker 0 enters the group's barriers as the device's one-thread
  // barriers do (stream_barrier_passed: a failed rank does not arrive, a failure is recorded there), since no host
  // thread words the group's failure after the workers.
  bool device_barriers;
};

// A pass's view of one rank: every address from core's layouts, over the rank's private workspace and
// every rank's peer buffer (peers[r] starts with rank r's header). The executor adds the call's weights
// (v.w) and tensors (v.args).
MOK_HD inline PassView pass_view_at(const LayerShape& s, PassKind kind, char* local, char* const* peers,
                                    PeerHeader* const* headers, GroupState* group, int tokens, int64_t total_rows,
                                    uint64_t timeout_ns, ErrorRecord* error) {
  LocalLayout l = local_layout(s);
  auto at = [local](size_t offset) { return buffer_at(local, offset); };
  PassView v{};
  v.s = s;
  v.kind = kind;
  v.peer = peer_layout(s);
  v.peers = peers;
  v.headers = headers;
  v.sched =
      Schedule{reinterpret_cast<int32_t*>(at(l.schedule_experts)), reinterpret_cast<RowRef*>(at(l.rows)), total_rows};
  v.graph.comm = reinterpret_cast<Task*>(at(l.tasks));
  v.graph.compute = v.graph.comm + max_minibatches(s) * 2;
  v.graph.parts = reinterpret_cast<WgradPart*>(at(l.parts));
  v.c = counters_at(s, reinterpret_cast<uint32_t*>(at(l.counters)));
  v.ring_x = reinterpret_cast<bf16_t*>(at(l.ring_x));
  v.ring_dy = reinterpret_cast<bf16_t*>(at(l.ring_dy));
  v.ring_g = reinterpret_cast<bf16_t*>(at(l.ring_g));
  v.ring_u = reinterpret_cast<bf16_t*>(at(l.ring_u));
  v.ring_h = reinterpret_cast<bf16_t*>(at(l.ring_h));
  v.ring_y = reinterpret_cast<bf16_t*>(at(l.ring_y));
  auto mx_ring = [&](const MxRingLayout& r, int64_t stride) {
    return MxRing{reinterpret_cast<uint8_t*>(at(r.rows)), reinterpret_cast<uint8_t*>(at(r.row_scales)),
                  reinterpret_cast<uint8_t*>(at(r.tokens)), reinterpret_cast<uint8_t*>(at(r.token_scales)), stride};
  };
  v.mx_x = mx_ring(l.mx_x, s.hidden);
  v.mx_dy = mx_ring(l.mx_dy, s.hidden);
  v.mx_g = mx_ring(l.mx_g, 2 * static_cast<int64_t>(s.intermediate));
  v.mx_u = mx_ring(l.mx_u, 2 * static_cast<int64_t>(s.intermediate));
  v.mx_h = mx_ring(l.mx_h, 2 * static_cast<int64_t>(s.intermediate));
  float* shared_acc = reinterpret_cast<float*>(at(l.shared_acc));
  int64_t is_h = static_cast<int64_t>(s.shared_intermediate) * s.hidden;
  if (shared_acc) v.acc = Accumulators{shared_acc, shared_acc + is_h, shared_acc + 2 * is_h, shared_acc + 3 * is_h};
  v.slots = reinterpret_cast<float*>(at(l.slots));
  v.shared_out = reinterpret_cast<bf16_t*>(at(l.shared_out));
  v.scratch = reinterpret_cast<float*>(at(l.scratch));
  v.scratch_floats = l.scratch_floats;
  v.chunk = reinterpret_cast<bf16_t*>(at(l.chunk));
  v.chunk_values = l.chunk_values;
  v.sums = reinterpret_cast<float*>(at(l.sums));
  v.sums_floats = l.sums_floats;
  v.tokens = tokens;
  v.timeout_ns = timeout_ns;
  v.error = error;
  v.group = group;
  return v;
}

MOK_HD inline PeerHeader* own_header(const PassView& v) {
  return v.headers[v.s.rank];
}

template <class T>
MOK_HD T* peer_array(const PassView& v, int rank, size_t offset) {
  return reinterpret_cast<T*>(v.peers[rank] + offset);
}

MOK_HD inline bf16_t* ring_row(const PassView& v, bf16_t* ring, int64_t row, int width) {
  return ring + (row % v.s.macrobatch) * width;
}

// Row `row` of the output ring (y or dx), width H.
MOK_HD inline bf16_t* out_row(const PassView& v, int64_t row) {
  return v.ring_y + (row % out_ring_rows(v.s)) * v.s.hidden;
}

// Part `part`'s scale blocks of a [kMxBlock, width] block of rows that MXFP8 quantises along its rows:
// (row, scale block) pairs, neighbouring parts on neighbouring blocks of a row, every padding block of the
// scale layout's rows included. body(row, first column, columns): columns <= 0 for a padding block. A stage
// that writes each pair's values with this split and then quantises them along the rows (quantize_ring_block
// without tokens) reads only what the part wrote, in one row job.
template <class Body>
MOK_HD void each_scale_block(Part part, int width, Body body) {
  int64_t blocks = MxScaleLayout::of(kMxBlock, width).padded_k_blocks();
  each_piece(part, kMxBlock * blocks, 1, [&](int64_t pair, int) {
    int64_t first = pair % blocks * kMxBlock;
    body(static_cast<int>(pair / blocks), first, static_cast<int>(width - first < kMxBlock ? width - first : kMxBlock));
  });
}

// Ring rows [row0, row0 + 32) of an MXFP8 ring of `width` columns from their bf16 values (`block`,
// [32, width]; a padding row all zeros): each row along itself (the rowwise GEMMs: gate_up, dgrad_h,
// down, dgrad_x), and with `tokens` also each column's 32 values along the tokens (the weight gradients).
// row0 is a multiple of 32 (P % 32 == 0), so the rows lie in one tile and are one token block of it: the
// blocks a GEMM that starts at the tile's first row reads. A zero row changes no block's scale and
// decodes to 0, so the codes are those of the tile's real rows alone, and a GPU that reads whole blocks
// reads zeros past them. `block` must not overlap the ring's rows; without token_codes the rows only.
// Part `part` of `parts` writes its row scale blocks (each_scale_block: codes and scale), and its columns
// (every parts-th from `part`, up to the scale layout's padding: token codes and scales). So every part has
// values to quantise once the block has as many pairs and columns as parts (all 255 of a CTA's from 255 columns
// on); along the tokens a part reads other parts' rows: the block is staged whole, by a job before, unless only
// the rows are quantised.
// Scalars only (ring_row_scales(s, width) and ring_token_scales(s, width) from macrobatch and padding): a
// struct passed to a call that is not inlined is copied onto a device thread's stack
// (tests/library/test_library.py holds fused_pass' stack).
MOK_HD_NOINLINE void quantize_ring_block(int64_t macrobatch, int padding, int width, int64_t row0, const bf16_t* block,
                                         uint8_t* codes, uint8_t* row_scales, uint8_t* token_codes,
                                         uint8_t* token_scales, int64_t stride, int part, int parts) {
  int64_t at = row0 % macrobatch;
  MxScaleLayout rows = MxScaleLayout::of(macrobatch, width), columns = MxScaleLayout::of(width, padding);
  each_scale_block(Part{part, parts}, width, [&](int r, int64_t first, int n) {
    row_scales[rows.offset(at + r, first / kMxBlock)] =
        n > 0 ? mx_quantize_block(block + r * width + first, n, 1, codes + (at + r) * stride + first, 1) : kMxPadScale;
  });
  if (!token_codes) return;
  uint8_t* scales = token_scales + (at / padding) * columns.matrix_bytes();
  int64_t k_block = (at % padding) / kMxBlock;
  // The slot's first block also writes the padding scales the MMA reads: k blocks past P / 32, rows past the width.
  bool slot_start = at % padding == 0;
  each_piece(Part{part, parts}, rows.padded_k_blocks() * kMxBlock, 1, [&](int64_t c, int) {
    if (c < width)
      scales[columns.offset(c, k_block)] =
          mx_quantize_block(block + c, kMxBlock, width, token_codes + at * stride + c, stride);
    for (int64_t kb = c < width ? columns.k_blocks : 0; slot_start && kb < columns.padded_k_blocks(); ++kb)
      scales[columns.offset(c, kb)] = kMxPadScale;
  });
}

// The same from a ring's view: `tokens` chooses whether the token direction is written too.
MOK_HD inline void quantize_ring_block(const LayerShape& s, const MxRing& ring, int width, int64_t row0,
                                       const bf16_t* block, bool tokens, Part part) {
  quantize_ring_block(s.macrobatch, s.expert_padding, width, row0, block, ring.rows, ring.row_scales,
                      tokens ? ring.tokens : nullptr, ring.token_scales, ring.stride, part.index, part.count);
}

MOK_HD inline int workers_of(const PassView& v) {
  return v.s.comm_workers + v.s.compute_workers;
}

// Worker `worker`'s share [first, end) of n items: contiguous ranges in worker order.
struct Share {
  int64_t first, end;
};
MOK_HD inline Share share_of(int64_t n, int worker, int workers) {
  return Share{n * worker / workers, n * (worker + 1) / workers};
}

MOK_HD inline Failure wait_local(const PassView& v, uint32_t* counter, uint32_t target, WaitId what) {
  return wait_counter(counter, target, own_header(v), v.timeout_ns, what);
}

}  // namespace mok::core
