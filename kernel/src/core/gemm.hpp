// The one GEMM of the layer, as core describes it to an executor: c = a · bᵀ over a tile. Core decides
// every address, orientation, operand encoding and the epilogue; the executor only computes it.
//
// The order of the sum is part of the contract on the host: element (i, j) starts from 0 (or from c,
// when the epilogue accumulates) and adds the products a(i, k) · b(j, k) one at a time, k = 0, 1, ...,
// part by part, each product rounded before it is added (no FMA). reference_gemm below is that order;
// the host executor's micro-kernels give the same bits. A GPU executor's tensor cores keep their own
// fixed order, the same on every run.
#pragma once

#include <cstdint>

#include "core/mxfp8.hpp"
#include "core/mxfp8_layout.hpp"
#include "core/numeric.hpp"

namespace mok::core {

enum class Dtype : int8_t { f32, bf16, e4m3 };

// A [rows, depth] operand: element (i, k) lives at data[i * row_stride + k * depth_stride], so one
// type serves K-major (depth_stride 1) and MN-major (row_stride 1) storage.
struct Operand {
  const void* data;
  Dtype dtype;
  int64_t row_stride, depth_stride;
  // e4m3 only: the e8m0 scales of the [rows, depth] matrix the operand's rows belong to, in the SM100
  // layout the block-scaled MMA reads (mxfp8_layout.hpp); the operand's row i is the matrix's row
  // scale_row0 + i, so element (i, k)'s scale is scales[scale_layout.offset(scale_row0 + i, k / 32)].
  const uint8_t* scales;
  MxScaleLayout scale_layout;
  int64_t scale_row0;
  // f32 / bf16 only: the GEMM reads the value's MXFP8 round trip, blocks of 32 along depth from k = 0
  // (the last block may be shorter): an MXFP8 GEMM's activation operand (DESIGN 1.2).
  bool quantize;
};

// One stretch of the reduction: a [rows, depth] times b [cols, depth].
struct GemmPart {
  Operand a, b;
  int depth;
};

enum class Epilogue : int8_t {
  store_bf16,      // c (bf16) = round_bf16(sum + bias[j]), the sum from 0 (bias: when given)
  accumulate_f32,  // c (fp32) = sum started from c's value: a reduction continued across calls
};

struct Gemm {
  int rows, cols;
  GemmPart parts[2];  // the sum runs over parts[0], then parts[1]: one accumulator, K concatenated
  int num_parts;
  void* c;  // c(i, j) at c[i * c_stride + j]
  int64_t c_stride;
  Epilogue epilogue;
  // store_bf16 only: bias[j] (bf16) added to column j's fp32 sum after its last product, before the
  // rounding to bf16 (one rounded add); null: none.
  const bf16_t* bias;
};

// The fp32 sum of column j as store_bf16 rounds it: with the column's bias added when there is one.
MOK_HD inline float with_bias(const Gemm& g, int j, float sum) {
  return g.bias ? add_rn(sum, bf16_to_float(g.bias[j])) : sum;
}

MOK_HD inline Operand bf16_operand(const bf16_t* data, int64_t row_stride, int64_t depth_stride, bool quantize) {
  return Operand{data, Dtype::bf16, row_stride, depth_stride, nullptr, MxScaleLayout{0, 0}, 0, quantize};
}

// A K-major e4m3 operand: the codes of row i at data + i * row_stride; `scales` is the matrix's whole
// laid-out scale block (matrix_bytes() of `layout`), whose row 0 is the operand's row 0.
MOK_HD inline Operand e4m3_operand(const uint8_t* data, int64_t row_stride, const uint8_t* scales,
                                   MxScaleLayout layout) {
  return Operand{data, Dtype::e4m3, row_stride, 1, scales, layout, 0, false};
}

// e4m3 only: the e8m0 byte of operand row i's k block `block` (32 values of depth).
MOK_HD inline uint8_t operand_scale(const Operand& o, int64_t i, int64_t block) {
  return o.scales[o.scale_layout.offset(o.scale_row0 + i, block)];
}

// The value (i, k) holds as stored, before any quantisation on read.
MOK_HD inline float stored_value(const Operand& o, int64_t i, int64_t k) {
  int64_t at = i * o.row_stride + k * o.depth_stride;
  switch (o.dtype) {
    case Dtype::f32: return static_cast<const float*>(o.data)[at];
    case Dtype::bf16: return bf16_to_float(static_cast<const bf16_t*>(o.data)[at]);
    case Dtype::e4m3:
      return mx_value(static_cast<const uint8_t*>(o.data)[at], e8m0_decode(operand_scale(o, i, k / kMxBlock)));
  }
  return 0.0f;
}

// Row i of an operand as the GEMM reads it: depth values in fp32 (the MXFP8 round trip when asked).
MOK_HD inline void load_operand_row(const Operand& o, int64_t i, int depth, float* out) {
  for (int k = 0; k < depth; ++k) out[k] = stored_value(o, i, k);
  if (o.quantize) mx_round_trip_row(out, depth);
}

// Floats of scratch a worker holds for one GEMM of `rows` x `cols` whose parts' depths add up to `depth`:
// a in fp32 (decoded, or packed into panels of up to 8 rows), one panel of up to 32 columns of b (or one
// row of it), the running sums of 32 columns per row (rounded up to 8 rows), and, when the epilogue stores,
// the tile's fp32 sums. Core sizes every worker's scratch with it; reference_gemm and the host executor's
// micro-kernels fit in it.
MOK_HD inline size_t gemm_scratch_floats(size_t rows, size_t cols, size_t depth, bool stores) {
  return (rows + 40) * depth + (rows + 8) * 32 + (stores ? rows * cols : 0);
}

// The contract's order, one element at a time. Reads every operand before it writes c, so c may not
// alias an operand.
MOK_HD inline void reference_gemm(const Gemm& g, float* scratch) {
  bool store = g.epilogue == Epilogue::store_bf16;
  // The running sums: a dense scratch tile when the result is stored as bf16, c itself when it accumulates.
  float* acc = store ? scratch : static_cast<float*>(g.c);
  int64_t acc_stride = store ? g.cols : g.c_stride;
  float* a = store ? scratch + static_cast<int64_t>(g.rows) * g.cols : scratch;
  for (int i = 0; store && i < g.rows; ++i)
    for (int j = 0; j < g.cols; ++j) acc[static_cast<int64_t>(i) * acc_stride + j] = 0.0f;
  for (int p = 0; p < g.num_parts; ++p) {
    const GemmPart& part = g.parts[p];
    float* b = a + static_cast<int64_t>(g.rows) * part.depth;
    for (int i = 0; i < g.rows; ++i) load_operand_row(part.a, i, part.depth, a + static_cast<int64_t>(i) * part.depth);
    for (int j = 0; j < g.cols; ++j) {
      load_operand_row(part.b, j, part.depth, b);
      for (int i = 0; i < g.rows; ++i) {
        const float* ai = a + static_cast<int64_t>(i) * part.depth;
        float& out = acc[static_cast<int64_t>(i) * acc_stride + j];
        float sum = out;
        for (int k = 0; k < part.depth; ++k) sum = add_rn(sum, mul_rn(ai[k], b[k]));
        out = sum;
      }
    }
  }
  for (int i = 0; store && i < g.rows; ++i)
    for (int j = 0; j < g.cols; ++j)
      static_cast<bf16_t*>(g.c)[static_cast<int64_t>(i) * g.c_stride + j] =
          float_to_bf16(with_bias(g, j, acc[static_cast<int64_t>(i) * acc_stride + j]));
}

}  // namespace mok::core
