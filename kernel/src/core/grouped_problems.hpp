// The grouped GEMMs of a pass as plain data: from core's Schedule, per local expert the problem size
// (M, N, K) and the element offsets of A, B and C/D, and per GEMM kind the leading dimensions and which
// extent of each operand is contiguous. This is what a CUTLASS ptr-array grouped GEMM consumes
// (GroupProblemShape<Shape<int, int, int>>, arrays of pointers, arrays of strides); a device kernel fills
// those arrays from the schedule, one thread per expert, with no host sync (everything here is MOK_HD).
//
// Rows: schedule row r (schedule.hpp) is held at row r % period of its row buffer (the ring of the host
// executor: period macrobatch for x, dy, g, u, h; out_ring_rows for y and dx). A grouped GEMM covers a
// window of schedule rows that lies in one turn of every row buffer it touches (fits_one_turn), so each
// expert's rows in it are contiguous there. Expert e's problem holds its routed rows in the window, in the
// schedule's canonical order; its padding rows are in no problem (nothing reads their products, and a
// weight gradient then never depends on what a padding row holds). An expert with no routed row in the
// window gets the empty problem (0, 0, 0) at offset 0: no tiles, nothing read or written. In a weight
// gradient that expert's window adds nothing; a gradient the layer writes (not accumulates) for an expert
// with no rows at all is zero, written by the executor, not by a GEMM with K = 0.
//
// Weights are the caller's, per local expert: gate, up [E, I, H], down [E, H, I]; weight gradients the same.
#pragma once

#include <cstdint>

#include "core/schedule.hpp"

namespace mok::core {

// C/D = A B^T with A [M, K], B [N, K], C/D [M, N] row-major (N contiguous).
enum class GroupedGemm : int32_t {
  gate,          // g = x W_gate^T:  A x [rows, H],  B W_gate[e] [I, H],  D g [rows, I]
  up,            // u = x W_up^T:    A x,            B W_up[e],           D u
  down,          // y = h W_down^T:  A h [rows, I],  B W_down[e] [H, I],  D y [rows, H] (output ring)
  dgrad_h,       // dh = dy W_down:  A dy [rows, H], B W_down[e] read as [I, H] (N contiguous), D dh [rows, I]
  dgrad_x_gate,  // dx += dg W_gate: A dg [rows, I], B W_gate[e] read as [H, I] (N contiguous), D dx (output ring)
  dgrad_x_up,    // dx += du W_up:   A du,           B W_up[e],                               D dx
  wgrad_down,    // dW_down[e] = dy^T h: A dy read as [H, rows] (M contiguous), B h as [I, rows] (N contiguous)
  wgrad_gate,    // dW_gate[e] = dg^T x: A dg as [I, rows], B x as [H, rows]
  wgrad_up,      // dW_up[e] = du^T x:   A du as [I, rows], B x as [H, rows]
  count
};

// The element layout of one kind, the same for every expert. ld: elements from one row (of the extent
// that is not contiguous) to the next. K-major: K contiguous (CUTLASS RowMajor A, ColumnMajor B).
struct GroupedLayout {
  int64_t lda, ldb, ldc;
  bool a_k_major, b_k_major;
};

struct GroupedProblem {
  int32_t m, n, k;
  int64_t a, b, c;  // element offsets into the A, B and C/D buffers
};

// Schedule rows [row0, row0 + rows).
struct RowWindow {
  int64_t row0, rows;
};

// Row-buffer periods: `ring` for x, dy, g, u, h; `out` for y and dx.
struct RowPeriods {
  int64_t ring, out;
};

// The host executor's buffers (shape.hpp local_layout).
MOK_HD inline RowPeriods ring_periods(const LayerShape& s) {
  return RowPeriods{s.macrobatch, out_ring_rows(s)};
}

MOK_HD inline bool fits_one_turn(const RowWindow& w, int64_t period) {
  return w.row0 >= 0 && w.rows >= 0 && w.row0 % period + w.rows <= period;
}

// Whether the window's rows are contiguous in every row buffer `kind` touches.
MOK_HD inline bool window_fits(GroupedGemm kind, const RowPeriods& p, const RowWindow& w) {
  bool writes_out = kind == GroupedGemm::down || kind == GroupedGemm::dgrad_x_gate || kind == GroupedGemm::dgrad_x_up;
  return fits_one_turn(w, p.ring) && (!writes_out || fits_one_turn(w, p.out));
}

// Rows from schedule row row0 to the end of the turn of every row buffer `kind` touches: the longest
// window from row0 that window_fits.
MOK_HD inline int64_t rows_in_turn(GroupedGemm kind, const RowPeriods& p, int64_t row0) {
  int64_t rows = p.ring - row0 % p.ring, out = p.out - row0 % p.out;
  RowWindow probe{row0, out < rows ? out : rows};
  return window_fits(kind, p, RowWindow{row0, rows}) ? rows : probe.rows;
}

MOK_HD inline bool is_wgrad(GroupedGemm kind) {
  return kind == GroupedGemm::wgrad_down || kind == GroupedGemm::wgrad_gate || kind == GroupedGemm::wgrad_up;
}

MOK_HD inline GroupedLayout grouped_layout(const LayerShape& s, GroupedGemm kind) {
  int64_t h = s.hidden, in = s.intermediate;
  switch (kind) {
    case GroupedGemm::gate:
    case GroupedGemm::up: return GroupedLayout{h, h, in, true, true};
    case GroupedGemm::down: return GroupedLayout{in, in, h, true, true};
    case GroupedGemm::dgrad_h: return GroupedLayout{h, in, in, true, false};
    case GroupedGemm::dgrad_x_gate:
    case GroupedGemm::dgrad_x_up: return GroupedLayout{in, h, h, true, false};
    case GroupedGemm::wgrad_down: return GroupedLayout{h, in, in, false, false};
    case GroupedGemm::wgrad_gate:
    case GroupedGemm::wgrad_up: return GroupedLayout{in, h, h, false, false};
    case GroupedGemm::count: break;
  }
  return GroupedLayout{0, 0, 0, true, true};
}

// Expert e's routed rows in the window: [first, first + rows).
struct ExpertRows {
  int64_t first, rows;
};

MOK_HD inline ExpertRows window_rows(const Schedule& sched, int e, const RowWindow& w) {
  int64_t lo = expert_first(sched, e), hi = lo + expert_count(sched, e);
  lo = lo > w.row0 ? lo : w.row0;
  hi = hi < w.row0 + w.rows ? hi : w.row0 + w.rows;
  return ExpertRows{lo, hi > lo ? hi - lo : 0};
}

// Expert e's problem of `kind` over the window (window_fits must hold). One call per expert: a device
// thread fills the expert's entries of the CUTLASS arrays from it.
MOK_HD inline GroupedProblem grouped_problem(const LayerShape& s, const Schedule& sched, GroupedGemm kind,
                                             const RowPeriods& p, const RowWindow& w, int e) {
  ExpertRows r = window_rows(sched, e, w);
  if (r.rows == 0) return GroupedProblem{0, 0, 0, 0, 0, 0};
  int32_t rows = static_cast<int32_t>(r.rows), h = s.hidden, in = s.intermediate;
  int64_t ring = r.first % p.ring, out = r.first % p.out, weight = static_cast<int64_t>(e) * h * in;
  switch (kind) {
    case GroupedGemm::gate:
    case GroupedGemm::up: return GroupedProblem{rows, in, h, ring * h, weight, ring * in};
    case GroupedGemm::down: return GroupedProblem{rows, h, in, ring * in, weight, out * h};
    case GroupedGemm::dgrad_h: return GroupedProblem{rows, in, h, ring * h, weight, ring * in};
    case GroupedGemm::dgrad_x_gate:
    case GroupedGemm::dgrad_x_up: return GroupedProblem{rows, h, in, ring * in, weight, out * h};
    case GroupedGemm::wgrad_down: return GroupedProblem{h, in, rows, ring * h, ring * in, weight};
    case GroupedGemm::wgrad_gate:
    case GroupedGemm::wgrad_up: return GroupedProblem{in, h, rows, ring * in, ring * h, weight};
    case GroupedGemm::count: break;
  }
  return GroupedProblem{0, 0, 0, 0, 0, 0};
}

// Every local expert's problem, in expert order (the host's loop over what device threads do at once).
MOK_HD inline void grouped_problems(const LayerShape& s, const Schedule& sched, GroupedGemm kind, const RowPeriods& p,
                                    const RowWindow& w, GroupedProblem* problems) {
  for (int e = 0; e < s.experts_per_rank; ++e) problems[e] = grouped_problem(s, sched, kind, p, w, e);
}

// Element count of the A, B and C/D buffers a kind addresses: row buffers of period rows, weights of
// E_local experts. Every element a problem touches lies below these (test_grouped_problems).
struct GroupedBuffers {
  int64_t a, b, c;
};

MOK_HD inline GroupedBuffers grouped_buffers(const LayerShape& s, GroupedGemm kind, const RowPeriods& p) {
  int64_t h = s.hidden, in = s.intermediate, weights = static_cast<int64_t>(s.experts_per_rank) * h * in;
  switch (kind) {
    case GroupedGemm::gate:
    case GroupedGemm::up: return GroupedBuffers{p.ring * h, weights, p.ring * in};
    case GroupedGemm::down: return GroupedBuffers{p.ring * in, weights, p.out * h};
    case GroupedGemm::dgrad_h: return GroupedBuffers{p.ring * h, weights, p.ring * in};
    case GroupedGemm::dgrad_x_gate:
    case GroupedGemm::dgrad_x_up: return GroupedBuffers{p.ring * in, weights, p.out * h};
    case GroupedGemm::wgrad_down: return GroupedBuffers{p.ring * h, p.ring * in, weights};
    case GroupedGemm::wgrad_gate:
    case GroupedGemm::wgrad_up: return GroupedBuffers{p.ring * in, p.ring * h, weights};
    case GroupedGemm::count: break;
  }
  return GroupedBuffers{0, 0, 0};
}

}  // namespace mok::core
