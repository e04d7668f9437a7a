// Shapes of one layer on one rank, and where everything lives: the peer-visible buffer every rank
// exposes and the rank's private workspace. All sizes are the worst case, stated before anything runs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/gemm.hpp"
#include "core/platform.hpp"

namespace mok::core {

constexpr int kMaxWorld = 72;
constexpr size_t kAlign = 64;
constexpr size_t kPeerHeaderBytes = 4096;  // room for core::PeerHeader (protocol.hpp)
constexpr size_t kWgradPartBytes = 24;     // core::WgradPart (tasks.hpp)

// Which pass the layer's executor runs, which decides what its workspace holds (local_layout, split_layout):
//   host:  core's workers on host threads; a worker's scratch holds its tile GEMMs' operands and sums;
//   split: the split executor's kernels, which run no core worker (no slots, accumulators or per-worker buffers)
//          and keep their own buffers after core's;
//   fused: core's workers as one kernel's CTAs, whose tiles live in shared and tensor memory (a worker's scratch is
//          MXFP8's staging only), with the split executor's device tables but none of its buffers.
enum class PassForm : int { host = 0, split = 1, fused = 2 };

struct LayerShape {
  int world, rank;
  int experts_per_rank;  // E_local; global expert e lives on rank e / E_local
  int hidden, intermediate, top_k;
  int max_tokens;           // tokens any rank may hold in one pass
  int shared_intermediate;  // 0: no shared expert
  int mxfp8;                // 0: bf16 GEMM operands; 1: MXFP8 operands (DESIGN 1.2)
  float swiglu_limit;       // +inf without a clamp
  int expert_padding;       // each expert's segment is padded to a multiple of this (the tile height)
  int minibatch;            // rows per readiness counter; a multiple of expert_padding
  int macrobatch;           // ring-buffer rows; a multiple of minibatch
  int comm_workers, compute_workers;
  int activation = 0;         // Activation: 0 swiglu, 1 swiglu_oai
  float swiglu_alpha = 0.0f;  // swiglu_oai's alpha; 0 with swiglu (it has none)
  // The backward's split of the same comm_workers + compute_workers workers: its comm workers (0 = comm_workers).
  // Per-worker scratch is sized by the total; a compute worker's chunk and sums by the most compute workers either
  // pass runs (max_compute_workers), so the layout depends on the fewer comm workers.
  int backward_comm_workers = 0;
  int routing_scale = 0;  // RoutingScale: 0 the weights scale the expert outputs, 1 their inputs (Llama4)
  PassForm form = PassForm::host;
};

// mok.h's mokRoutingScale_t: where the routing weight w_k applies.
enum class RoutingScale : int { output = 0, input = 1 };
MOK_HD inline bool input_scaled(const LayerShape& s) {
  return s.routing_scale == static_cast<int>(RoutingScale::input);
}

// The layer's activation as the SwiGLU stages compute it, with the executor's sigmoid table (or null).
MOK_HD inline Swiglu layer_swiglu(const LayerShape& s, const float* sigmoid_table) {
  return Swiglu{s.swiglu_limit, sigmoid_table, static_cast<Activation>(s.activation), s.swiglu_alpha};
}

MOK_HD inline size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

// Worst-case receive rows: every routed row of the group lands on this rank, plus padding.
MOK_HD inline int64_t max_recv_rows(const LayerShape& s) {
  int64_t rows = static_cast<int64_t>(s.world) * s.max_tokens * s.top_k +
                 static_cast<int64_t>(s.experts_per_rank) * (s.expert_padding - 1);
  return (rows + s.expert_padding - 1) / s.expert_padding * s.expert_padding;
}
MOK_HD inline int64_t max_tiles(const LayerShape& s) {
  return max_recv_rows(s) / s.expert_padding;
}
MOK_HD inline int64_t max_minibatches(const LayerShape& s) {
  return (max_recv_rows(s) + s.minibatch - 1) / s.minibatch;
}
// Rows of the output ring (y in forward, dx in backward): two minibatches, so that one is pushed to its
// home ranks while the next is computed (never more than the macrobatch).
MOK_HD inline int64_t out_ring_rows(const LayerShape& s) {
  int64_t two = 2 * static_cast<int64_t>(s.minibatch);
  return two < s.macrobatch ? two : s.macrobatch;
}
// Output columns of one GEMM task, and output rows of one weight-gradient task.
constexpr int kColumnBlock = 256;
MOK_HD inline int column_blocks(int n) {
  return (n + kColumnBlock - 1) / kColumnBlock;
}

// Minibatches the ring holds (R).
MOK_HD inline int64_t ring_minibatches(const LayerShape& s) {
  return s.macrobatch / s.minibatch;
}

// Weight-gradient tasks of one part (tasks.hpp): dW_down's row blocks over H, then dW_gate's and dW_up's
// over I.
MOK_HD inline int wgrad_tasks_per_part(const LayerShape& s) {
  return column_blocks(s.hidden) + 2 * column_blocks(s.intermediate);
}

// Parts of all experts (tasks.hpp): one per expert, plus one per R minibatches an expert spans beyond
// its first window. Adjacent experts share at most one minibatch, so the spans add up to at most
// minibatches + E_local.
MOK_HD inline int64_t max_parts(const LayerShape& s) {
  return s.experts_per_rank + (max_minibatches(s) + s.experts_per_rank) / ring_minibatches(s);
}

// fp32 slots for the weight gradients of experts with more than one part. Such an expert spans at
// least R minibatch boundaries, and no boundary is spanned by two experts, so there are at most
// (minibatches - 1) / R of them.
MOK_HD inline int64_t max_slots(const LayerShape& s) {
  int64_t spanning = (max_minibatches(s) - 1) / ring_minibatches(s);
  return spanning < s.experts_per_rank ? spanning : s.experts_per_rank;
}

// fp32 floats of one slot: dW_down, dW_gate, dW_up (I x H each), then db_down (H), db_gate, db_up (I).
MOK_HD inline int64_t slot_floats(const LayerShape& s) {
  return 3 * static_cast<int64_t>(s.intermediate) * s.hidden + s.hidden + 2 * static_cast<int64_t>(s.intermediate);
}
// Where matrix m's (0 down, 1 gate, 2 up) bias sums start after a slot's three matrices.
MOK_HD inline int64_t bias_slot_offset(const LayerShape& s, int matrix) {
  return matrix == 0 ? 0 : s.hidden + static_cast<int64_t>(matrix - 1) * s.intermediate;
}

MOK_HD inline int64_t shared_chunks(const LayerShape& s) {
  return s.shared_intermediate > 0 ? (s.max_tokens + s.expert_padding - 1) / s.expert_padding : 0;
}

// Hands out aligned byte ranges in order; offsets only, so the same layout serves any base address.
// The offset of a buffer a form's workspace does not hold (PassForm): its view's pointer is null, so a use of it
// faults instead of reaching another buffer's bytes.
constexpr size_t kAbsent = ~static_cast<size_t>(0);

struct Carver {
  size_t used = 0;
  MOK_HD size_t take(size_t bytes, size_t align = kAlign) {
    size_t at = align_up(used, align);
    used = at + bytes;
    return at;
  }
  MOK_HD size_t take_if(bool held, size_t bytes, size_t align = kAlign) { return held ? take(bytes, align) : kAbsent; }
  MOK_HD size_t total() const { return align_up(used, kAlign); }
};

// The buffer at `offset` from `base`, or null where the layout leaves it kAbsent.
MOK_HD inline char* buffer_at(char* base, size_t offset) {
  return offset == kAbsent ? nullptr : base + offset;
}

// The peer-visible buffer of one rank. Peers read its inputs and write its slots. Nothing in it needs
// to be zero when a group is created: the owner resets its header, and every other range is written
// (inputs by the owner before the barrier that publishes them, slots by the combine of every routed
// (token, k)) before it is read.
struct PeerLayout {
  size_t header;        // PeerHeader
  size_t topk_ids;      // int32 [max_tokens, K], staged by schedule builds
  size_t topk_weights;  // fp32 [max_tokens, K], staged by backward (and forward, recompute: input scale)
  size_t x;             // bf16 [max_tokens, H], staged by forward / recompute
  size_t dout;          // bf16 [max_tokens, H], staged by backward
  size_t y_slots;       // bf16 [max_tokens, K, H]: expert outputs pushed by their ranks (the context)
  size_t dx_slots;      // bf16 [max_tokens, K, H]: per-slot input gradients pushed by backward
  size_t bytes;
};

MOK_HD inline PeerLayout peer_layout(const LayerShape& s) {
  Carver c;
  PeerLayout p{};
  size_t t = static_cast<size_t>(s.max_tokens), k = static_cast<size_t>(s.top_k), h = static_cast<size_t>(s.hidden);
  p.header = c.take(kPeerHeaderBytes);
  p.topk_ids = c.take(t * k * 4);
  p.topk_weights = c.take(t * k * 4);
  p.x = c.take(t * h * 2);
  p.dout = c.take(t * h * 2);
  p.y_slots = c.take(t * k * h * 2);
  p.dx_slots = c.take(t * k * h * 2);
  p.bytes = c.total();
  return p;
}

// The scales of an MXFP8 ring of `width` columns (x, dy: H; g, u, h: I; see MxRingLayout). Rowwise: one
// [macrobatch, width] matrix, ring row r its row r. Token-direction: per tile slot of the ring
// (macrobatch / P of them), the [width, P] matrix that slot's weight-gradient GEMMs read (rows the
// columns, depth the slot's P rows, blocks of 32 rows from the slot's first), matrix_bytes() apart.
MOK_HD inline MxScaleLayout ring_row_scales(const LayerShape& s, int width) {
  return MxScaleLayout::of(s.macrobatch, width);
}
MOK_HD inline MxScaleLayout ring_token_scales(const LayerShape& s, int width) {
  return MxScaleLayout::of(width, s.expert_padding);
}
MOK_HD inline MxScaleLayout ring_row_scales(const LayerShape& s) {
  return ring_row_scales(s, s.hidden);
}
MOK_HD inline MxScaleLayout ring_token_scales(const LayerShape& s) {
  return ring_token_scales(s, s.hidden);
}

// Bytes of an MXFP8 ring's scales in each orientation (0 in bf16 mode).
MOK_HD inline size_t mx_row_scale_bytes(const LayerShape& s, int width) {
  return s.mxfp8 ? static_cast<size_t>(ring_row_scales(s, width).matrix_bytes()) : 0;
}
MOK_HD inline size_t mx_token_scale_bytes(const LayerShape& s, int width) {
  size_t tiles = static_cast<size_t>(s.macrobatch / s.expert_padding);
  return s.mxfp8 ? tiles * static_cast<size_t>(ring_token_scales(s, width).matrix_bytes()) : 0;
}

// An MXFP8 ring's four ranges (offsets): the e4m3 codes of its rows quantised along the row (rows) and
// along the tokens (tokens), and their scales. x and dy (width H) have codes of their own, laid out like
// the rows (code (r, c) at r * H + c in each). g, u and h (width I) keep their codes in their bf16 ring's
// own bytes, 2 I per row: ring row r's rowwise codes at r * 2I + c, its token-direction codes at
// r * 2I + I + c; only their scales are taken here. Empty in bf16 mode.
struct MxRingLayout {
  size_t rows, row_scales, tokens, token_scales;
};

MOK_HD inline MxRingLayout take_mx_ring(Carver& c, const LayerShape& s) {
  size_t codes = s.mxfp8 ? static_cast<size_t>(s.macrobatch) * static_cast<size_t>(s.hidden) : 0;
  MxRingLayout r{};
  r.rows = c.take(codes);
  r.row_scales = c.take(mx_row_scale_bytes(s, s.hidden));
  r.tokens = c.take(codes);
  r.token_scales = c.take(mx_token_scale_bytes(s, s.hidden));
  return r;
}

// The scales of g, u or h (their codes are in the bf16 ring at `ring`, see above).
MOK_HD inline MxRingLayout take_mx_scales(Carver& c, const LayerShape& s, size_t ring) {
  MxRingLayout r{};
  r.rows = ring;
  r.row_scales = c.take(mx_row_scale_bytes(s, s.intermediate));
  r.tokens = ring + static_cast<size_t>(s.intermediate);
  r.token_scales = c.take(mx_token_scale_bytes(s, s.intermediate));
  return r;
}

// The most compute workers a pass of the layer runs: its workers less the fewer of the forward's and the backward's
// comm workers (pass_worker.hpp's comm_workers_of; fit_workers, which runs fewer, never more of either class).
MOK_HD inline int max_compute_workers(const LayerShape& s) {
  int comm = s.backward_comm_workers > 0 && s.backward_comm_workers < s.comm_workers ? s.backward_comm_workers
                                                                                     : s.comm_workers;
  return s.comm_workers + s.compute_workers - comm;
}

// bf16 values of a block's staging in MXFP8 mode: a dispatch's (comm_tasks.hpp) one 32-row block of x
// and one of dy, a SwiGLU stage's (compute_tasks.hpp) one of dg, du and h; in the worker's scratch.
constexpr int kMxStagingRows = kMxBlock;
MOK_HD inline size_t mx_staging_values(const LayerShape& s) {
  return 2 * static_cast<size_t>(kMxStagingRows) * static_cast<size_t>(s.hidden);
}
MOK_HD inline size_t mx_swiglu_staging_values(const LayerShape& s) {
  return 3 * static_cast<size_t>(kMxStagingRows) * static_cast<size_t>(s.intermediate);
}

// The private workspace of one rank: schedule, task graph, counters, ring buffers, weight-gradient
// accumulators, the shared expert's output, worker scratch (kAbsent where the layer's PassForm has no use for
// one). Weights are read in place from the caller's tensors; rows are bf16 (every value a ring holds is a bf16
// store of the layer, DESIGN 1), except in MXFP8 mode where a GEMM reads them: x and dy are held only as the e4m3
// bytes their GEMMs read (mx_x, mx_dy) and the bf16 rings x and dy are empty; h (forward), and dg, du, h
// (backward) are turned by their SwiGLU stage into e4m3 codes in their bf16 ring's own bytes, with scales in mx_g,
// mx_u, mx_h.
struct LocalLayout {
  size_t schedule_experts;                         // int32 [E_local][2]: count, first row
  size_t rows;                                     // RowRef [max_recv_rows]
  size_t tasks;                                    // Task [max tasks]
  size_t counters;                                 // uint32 [num_counters]
  size_t ring_x, ring_dy, ring_g, ring_u, ring_h;  // bf16 [macrobatch, H or I]; x, dy: bf16 mode only
  MxRingLayout mx_x, mx_dy;                        // MXFP8 mode: x and dy as e4m3, both orientations
  MxRingLayout mx_g, mx_u, mx_h;                   // MXFP8 mode: dg, du, h's scales (codes in ring_g, _u, _h)
  size_t ring_y;                                   // bf16 [out_ring_rows, H]: y (forward) or dx (backward)
  size_t parts;                                    // WgradPart [max_parts]
  size_t slots;       // fp32 [max_slots][slot_floats]: dW_down, dW_gate, dW_up, db_down, db_gate, db_up
  size_t shared_acc;  // fp32 shared weight-gradient accumulators (3 x I_s x H)
  size_t shared_out;  // bf16 [max_tokens, H]: shared output (forward) or its dx (backward)
  size_t scratch;     // fp32 per worker: MXFP8's staging, and the host executor's tile GEMM scratch
  size_t scratch_floats;
  size_t
      chunk;  // bf16 per compute worker (max_compute_workers): the shared expert's g, u, h, dh over one chunk of tokens
  size_t chunk_values;
  size_t sums;  // fp32 per compute worker: a weight-gradient task's [kColumnBlock, max(H, I)] sums, then its bias sums
  size_t sums_floats;
  size_t bytes;
};

MOK_HD inline size_t max_value(size_t a, size_t b) {
  return a > b ? a : b;
}

// Compute tasks of one tile: forward gate_up, swiglu, down; backward gate_up, dgrad_h, swiglu_bwd,
// dgrad_x; a GEMM stage has one task per block of output columns.
MOK_HD inline int64_t tile_tasks(const LayerShape& s, bool backward) {
  return (backward ? 2 : 1) * column_blocks(s.intermediate) + 1 + column_blocks(s.hidden);
}

// Task-list length: per minibatch a dispatch and a combine; the tiles' tasks; the weight-gradient
// tasks of every part; per shared chunk one task.
MOK_HD inline int64_t max_tasks(const LayerShape& s) {
  return 2 * max_minibatches(s) + max_tiles(s) * tile_tasks(s, true) + max_parts(s) * wgrad_tasks_per_part(s) +
         shared_chunks(s);
}

// Words the workers of one pass or schedule build hand its phases over with (core/pass_worker.hpp).
constexpr int kSyncWords = 8;

// Counters: ready, done, freed, wdone per minibatch; stage per tile; a part chain per slot and wgrad
// task; the shared chain; two queue heads; the workers' sync words.
MOK_HD inline int64_t num_counters(const LayerShape& s) {
  return 4 * max_minibatches(s) + max_tiles(s) + max_slots(s) * wgrad_tasks_per_part(s) + 3 + kSyncWords;
}

MOK_HD inline LocalLayout local_layout(const LayerShape& s) {
  Carver c;
  LocalLayout l{};
  size_t h = static_cast<size_t>(s.hidden);
  size_t i = static_cast<size_t>(s.intermediate), is = static_cast<size_t>(s.shared_intermediate);
  size_t m = static_cast<size_t>(s.macrobatch), p = static_cast<size_t>(s.expert_padding), f = sizeof(float);
  l.schedule_experts = c.take(static_cast<size_t>(s.experts_per_rank) * 2 * 4);
  l.rows = c.take(static_cast<size_t>(max_recv_rows(s)) * 12);
  l.tasks = c.take(static_cast<size_t>(max_tasks(s)) * 8);
  l.counters = c.take(static_cast<size_t>(num_counters(s)) * 4);
  size_t bf16_input_ring = s.mxfp8 ? 0 : m * h * 2;
  l.ring_x = c.take(bf16_input_ring);
  l.ring_dy = c.take(bf16_input_ring);
  l.mx_x = take_mx_ring(c, s);
  l.mx_dy = take_mx_ring(c, s);
  l.ring_g = c.take(m * i * 2);
  l.ring_u = c.take(m * i * 2);
  l.ring_h = c.take(m * i * 2);
  l.mx_g = take_mx_scales(c, s, l.ring_g);
  l.mx_u = take_mx_scales(c, s, l.ring_u);
  l.mx_h = take_mx_scales(c, s, l.ring_h);
  l.ring_y = c.take(static_cast<size_t>(out_ring_rows(s)) * h * 2);
  l.parts = c.take(static_cast<size_t>(max_parts(s)) * kWgradPartBytes);
  bool workers = s.form != PassForm::split;  // the split executor's kernels run no core worker
  l.slots = c.take_if(workers, static_cast<size_t>(max_slots(s) * slot_floats(s)) * f);
  // With a shared expert also its gate's router gradient [H] (used only when a call gives the gate).
  l.shared_acc = c.take_if(workers, (3 * is * h + (is > 0 ? h : 0)) * f);
  l.shared_out = c.take(static_cast<size_t>(s.max_tokens) * h * 2);
  // Per worker (none in the split form, whose sizes are then 0 too): the scratch, in MXFP8 mode where a comm
  // worker's dispatch stages its blocks of x and dy rows, a compute worker's SwiGLU stage its blocks of dg, du, h;
  // in the host form also the host's tile GEMMs, the largest of a pass: a tile of p rows against H, I or I_s columns
  // over H, 2 I or 2 I_s (dgrad_x sums two parts), or a weight-gradient tile of H, I or I_s rows over p tokens,
  // which accumulates in place.
  size_t each = workers ? static_cast<size_t>(s.comm_workers + s.compute_workers) : 0;
  size_t staging = s.mxfp8 && workers ? max_value(mx_staging_values(s), mx_swiglu_staging_values(s)) : 0;
  l.scratch_floats = (staging * 2 + f - 1) / f;
  if (s.form == PassForm::host) {
    size_t wide = max_value(max_value(h, i), is), deep = max_value(h, 2 * max_value(i, is));
    size_t gemm = max_value(gemm_scratch_floats(p, wide, deep, true), gemm_scratch_floats(wide, wide, p, false));
    l.scratch_floats = max_value(l.scratch_floats, gemm);
  }
  l.scratch = c.take_if(each * l.scratch_floats > 0, each * l.scratch_floats * f);
  // Per compute worker (only compute tasks use them; pass_worker.hpp's worker_chunk, worker_sums): g, u, h, dh; with a
  // shared expert then the gated backward's s_t * dout rows (rounded up to an even count) and the chunk's dlogit_t
  // (fp32, two values each).
  size_t computing = workers ? static_cast<size_t>(max_compute_workers(s)) : 0;
  l.chunk_values = workers ? 4 * p * is + (is > 0 ? (p * h + 1) / 2 * 2 + 2 * p : 0) : 0;
  l.chunk = c.take_if(computing * l.chunk_values > 0, computing * l.chunk_values * 2);
  // A weight-gradient task's [kColumnBlock, max(H, I)] sums, then its bias sums.
  l.sums_floats = workers ? static_cast<size_t>(kColumnBlock) * max_value(h, i) + kColumnBlock : 0;
  l.sums = c.take_if(computing * l.sums_floats > 0, computing * l.sums_floats * f);
  l.bytes = c.total();
  return l;
}

}  // namespace mok::core
