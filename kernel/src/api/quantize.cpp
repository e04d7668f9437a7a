// C ABI: MXFP8 quantisation of a [batch, rows, cols] tensor, rowwise and/or colwise (transposed), on the host.
#include <cmath>

#include "api/c_enum.hpp"
#include "api/error.hpp"
#include "api/layer_checks.hpp"
#include "api/limits.hpp"
#include "core/mxfp8.hpp"
#include "core/mxfp8_layout.hpp"
#include "core/numeric.hpp"

using mok::api::fail;

namespace {

float load(const void* src, mokDataType_t dtype, int64_t i) {
  return dtype == mokDataBF16 ? mok::core::bf16_to_float(static_cast<const uint16_t*>(src)[i])
                              : static_cast<const float*>(src)[i];
}

// Blocks of 32 along the last dim of a [rows, cols] view of src (element offset `at`, strides
// row_stride and col_stride): codes [rows, cols] into data, and every byte of the view's scales in the
// SM100 layout (core/mxfp8_layout.hpp) into scales, padding as mx_quantize_rows writes it.
void quantize_view(const void* src, mokDataType_t dtype, int64_t at, int64_t rows, int64_t cols, int64_t row_stride,
                   int64_t col_stride, uint8_t* data, uint8_t* scales) {
  mok::core::MxScaleLayout layout = mok::core::MxScaleLayout::of(rows, cols);
  float block[mok::core::kMxBlock];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < layout.k_blocks; ++b) {
      int64_t c0 = b * mok::core::kMxBlock;
      int n = static_cast<int>(cols - c0 < mok::core::kMxBlock ? cols - c0 : mok::core::kMxBlock);
      for (int i = 0; i < n; ++i) block[i] = load(src, dtype, at + r * row_stride + (c0 + i) * col_stride);
      scales[layout.offset(r, b)] = mok::core::mx_quantize_block(block, n, 1, data + r * cols + c0, 1);
    }
    for (int64_t b = layout.k_blocks; b < layout.padded_k_blocks(); ++b)
      scales[layout.offset(r, b)] = mok::core::kMxPadScale;
  }
  mok::core::mx_fill_pad_rows(layout, scales);
}

// Each dimension >= 1, and their product at most limits::kMaxQuantizeElements (computed without overflow).
mokStatus_t check_dims(int64_t batch, int64_t rows, int64_t cols, const char* func) {
  const char* names[3] = {"batch", "rows", "cols"};
  int64_t dims[3] = {batch, rows, cols};
  for (int i = 0; i < 3; ++i)
    if (dims[i] < 1)
      return fail(mokInvalidArgument, "%s: argument '%s' (%lld) must be >= 1", func, names[i],
                  static_cast<long long>(dims[i]));
  if (mok::api::limits::product({batch, rows, cols}) > mok::api::limits::kMaxQuantizeElements)
    return fail(mokInvalidArgument,
                "%s: arguments 'batch' x 'rows' x 'cols' (%lld x %lld x %lld) must be at most 2^40 = %lld elements",
                func, static_cast<long long>(batch), static_cast<long long>(rows), static_cast<long long>(cols),
                static_cast<long long>(mok::api::limits::kMaxQuantizeElements));
  return mokSuccess;
}

}  // namespace

extern "C" MOK_API mokStatus_t mokMxfp8Quantize(const void* src, mokDataType_t dtype, int64_t batch, int64_t rows,
                                                int64_t cols, uint8_t* rowwise_data, uint8_t* rowwise_scales,
                                                uint8_t* colwise_data, uint8_t* colwise_scales, void* stream) {
  mok::api::clear_error();
  const char* func = "mokMxfp8Quantize";
  // A host function today: it works on the calling thread, so there is no stream to enqueue it on.
  if (stream != nullptr)
    return fail(mokInvalidArgument,
                "%s: argument 'stream' (%p) must be NULL: mokMxfp8Quantize runs on the host, on the calling thread",
                func, stream);
  int32_t type = mok::api::enum_bits(dtype);
  if (type != mokDataBF16 && type != mokDataFloat32)
    return fail(mokInvalidArgument, "%s: argument 'dtype' (%d) must be mokDataBF16 (0) or mokDataFloat32 (1)", func,
                type);
  mokDataType_t checked = static_cast<mokDataType_t>(type);  // now in range: safe to load as the enum
  if (mokStatus_t s = check_dims(batch, rows, cols, func); s != mokSuccess) return s;
  int64_t n = batch * rows * cols;
  if (mokStatus_t s = mok::api::check_array(src, "src", n, checked == mokDataBF16 ? 2 : 4, func); s != mokSuccess)
    return s;
  if (!rowwise_data != !rowwise_scales || !colwise_data != !colwise_scales)
    return fail(mokInvalidArgument, "%s: arguments '*_data' and '*_scales' are given together or not at all", func);
  if (!rowwise_data && !colwise_data)
    return fail(mokInvalidArgument, "%s: at least one of 'rowwise_data' and 'colwise_data' must be given", func);
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(load(src, checked, i)))
      return fail(mokInvalidArgument, "%s: argument 'src' holds a NaN or Inf at element %lld", func,
                  static_cast<long long>(i));
  }
  // Each matrix's scales fill its layout's matrix_bytes(), one matrix after the other.
  int64_t row_bytes = mok::core::MxScaleLayout::of(rows, cols).matrix_bytes();
  int64_t col_bytes = mok::core::MxScaleLayout::of(cols, rows).matrix_bytes();
  for (int64_t b = 0; b < batch; ++b) {
    int64_t at = b * rows * cols;
    if (rowwise_data)
      quantize_view(src, checked, at, rows, cols, cols, 1, rowwise_data + at, rowwise_scales + b * row_bytes);
    if (colwise_data)
      quantize_view(src, checked, at, cols, rows, 1, cols, colwise_data + at, colwise_scales + b * col_bytes);
  }
  return mokSuccess;
}
