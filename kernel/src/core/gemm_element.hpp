// One element of a tile GEMM (gemm.hpp) on its own, in the contract's order and in no scratch: what a GPU worker
// computes when the threads of its CTA share a tile, an element each. Element (i, j) reads only a's row i and b's
// row j, so the elements may be computed in any order, by any thread, and give reference_gemm's bits.
#pragma once

#include "core/gemm.hpp"
#include "core/tile.hpp"

namespace mok::core {

// Operand o's row i over depth [k0, k0 + n) of its part as the GEMM reads it: stored, or (o.quantize) after the
// MXFP8 round trip of that block of 32, as load_operand_row takes it: the block's scale exponent found once, then
// each value on its own, so no row is held.
struct BlockReader {
  const Operand* o;
  int64_t row;
  bool finite;
  int exponent;
  MOK_HD float operator()(int64_t k) const {
    float value = stored_value(*o, row, k);
    if (!o->quantize) return value;
    return finite ? mx_round_trip_value(value, exponent) : quiet_nan();
  }
};
MOK_HD inline BlockReader block_reader(const Operand& o, int64_t i, int k0, int n) {
  BlockReader r{&o, i, true, 0};
  if (!o.quantize) return r;
  float amax = mx_amax(n, [&](int k) { return stored_value(o, i, k0 + k); });
  r.finite = amax == amax;
  r.exponent = r.finite ? mx_scale_exponent(amax) : 0;
  return r;
}

// Whether an operand of g is quantised on read (which core's tasks never ask for).
MOK_HD inline bool quantises_on_read(const Gemm& g) {
  for (int p = 0; p < g.num_parts; ++p)
    if (g.parts[p].a.quantize || g.parts[p].b.quantize) return true;
  return false;
}

// c(i, j) computed and written as reference_gemm does: the products a(i, k) · b(j, k) added one at a time, k = 0,
// 1, ..., part by part, each rounded before it is added, from 0 (store_bf16: then the bias and one rounding to bf16)
// or from c's value (accumulate_f32). kQuantised: operands quantised on read are read as reference_gemm reads them,
// a block of 32 at a time; without it, a GEMM with such an operand is not for this function.
template <bool kQuantised>
MOK_HD inline void element(const Gemm& g, int i, int j) {
  int64_t at = static_cast<int64_t>(i) * g.c_stride + j;
  bool store = g.epilogue == Epilogue::store_bf16;
  float sum = store ? 0.0f : static_cast<float*>(g.c)[at];
  for (int p = 0; p < g.num_parts; ++p) {
    const GemmPart& part = g.parts[p];
    for (int k0 = 0; kQuantised && k0 < part.depth; k0 += kMxBlock) {
      int n = part.depth - k0 < kMxBlock ? part.depth - k0 : kMxBlock;
      BlockReader a = block_reader(part.a, i, k0, n), b = block_reader(part.b, j, k0, n);
      for (int k = k0; k < k0 + n; ++k) sum = add_rn(sum, mul_rn(a(k), b(k)));
    }
    for (int k = 0; !kQuantised && k < part.depth; ++k)
      sum = add_rn(sum, mul_rn(stored_value(part.a, i, k), stored_value(part.b, j, k)));
  }
  if (store)
    static_cast<bf16_t*>(g.c)[at] = float_to_bf16(with_bias(g, j, sum));
  else
    static_cast<float*>(g.c)[at] = sum;
}

// Part `part` of g's elements in the window of `rows` x `cols` from (row0, col0), those inside g: element e of the
// window, row by row, to part e mod count (neighbouring parts on neighbouring elements of a row).
template <bool kQuantised>
MOK_HD inline void window_elements(const Gemm& g, int row0, int col0, int rows, int cols, Part part) {
  for (int64_t e = part.index, n = static_cast<int64_t>(rows) * cols; e < n; e += part.count) {
    int i = row0 + static_cast<int>(e / cols), j = col0 + static_cast<int>(e % cols);
    if (i < g.rows && j < g.cols) element<kQuantised>(g, i, j);
  }
}
// Out of line: the plain loop stays small on the device, where core's tasks never quantise on read.
MOK_HD_NOINLINE void quantised_elements(const Gemm& g, int row0, int col0, int rows, int cols, Part part) {
  window_elements<true>(g, row0, col0, rows, cols, part);
}

// The window's part for any g, and one element.
MOK_HD inline void gemm_elements(const Gemm& g, int row0, int col0, int rows, int cols, Part part) {
  if (quantises_on_read(g)) return quantised_elements(g, row0, col0, rows, cols, part);
  window_elements<false>(g, row0, col0, rows, cols, part);
}
MOK_HD inline void gemm_element(const Gemm& g, int i, int j) {
  gemm_elements(g, i, j, 1, 1, kWhole);
}

}  // namespace mok::core
