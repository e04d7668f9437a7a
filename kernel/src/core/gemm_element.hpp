// One element of a tile GEMM (gemm.hpp) on its own, in the contract's order: what a GPU worker computes when the
// threads of its CTA share a tile, an element each. Element (i, j) reads only a's row i and b's row j, so the
// elements may be computed in any order, by any thread, and give reference_gemm's bits.
#pragma once

#include "core/gemm.hpp"
#include "core/tile.hpp"

namespace mok::core {

// Whether an operand of g is quantised on read: its MXFP8 round trip takes a whole block of 32 along the depth, not
// one value, so such a GEMM is computed whole (reference_gemm). Core's tasks read stored codes and never ask for it.
MOK_HD inline bool quantises_on_read(const Gemm& g) {
  for (int p = 0; p < g.num_parts; ++p)
    if (g.parts[p].a.quantize || g.parts[p].b.quantize) return true;
  return false;
}

// c(i, j) computed and written as reference_gemm does: the products a(i, k) · b(j, k) added one at a time, k = 0,
// 1, ..., part by part, each rounded before it is added, from 0 (store_bf16: then the bias and one rounding to bf16)
// or from c's value (accumulate_f32). Not for a GEMM that quantises on read.
MOK_HD inline void gemm_element(const Gemm& g, int i, int j) {
  int64_t at = static_cast<int64_t>(i) * g.c_stride + j;
  bool store = g.epilogue == Epilogue::store_bf16;
  float sum = store ? 0.0f : static_cast<float*>(g.c)[at];
  for (int p = 0; p < g.num_parts; ++p) {
    const GemmPart& part = g.parts[p];
    for (int k = 0; k < part.depth; ++k)
      sum = add_rn(sum, mul_rn(stored_value(part.a, i, k), stored_value(part.b, j, k)));
  }
  if (store)
    static_cast<bf16_t*>(g.c)[at] = float_to_bf16(with_bias(g, j, sum));
  else
    static_cast<float*>(g.c)[at] = sum;
}

// Part `part` of g's elements in the window of `rows` x `cols` from (row0, col0), those inside g: element e of the
// window, row by row, to part e mod count (neighbouring parts on neighbouring elements of a row).
MOK_HD inline void gemm_elements(const Gemm& g, int row0, int col0, int rows, int cols, Part part) {
  for (int64_t e = part.index, n = static_cast<int64_t>(rows) * cols; e < n; e += part.count) {
    int i = row0 + static_cast<int>(e / cols), j = col0 + static_cast<int>(e % cols);
    if (i < g.rows && j < g.cols) gemm_element(g, i, j);
  }
}

}  // namespace mok::core
