// The caller's weights as fp32 GEMM operands in the private workspace, once per pass.
#include <cstdint>

#include "core/mxfp8.hpp"
#include "core/numeric.hpp"
#include "host/layer.hpp"

namespace mok::host {
namespace {

float* bf16_to_f32(const void* src, size_t n, float* dst) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = core::bf16_to_float(s[i]);
  return dst;
}

// MXFP8 data [batch, rows, cols] with blocks along cols, dequantised into dst [batch, rows, cols],
// or into dst [batch, cols, rows] when the data is a transposed (colwise) form.
float* mx_to_f32(const mokMxfp8Matrix_t& m, size_t batch, size_t rows, size_t cols, bool transpose, float* dst) {
  size_t blocks = (cols + core::kMxBlock - 1) / core::kMxBlock;
  for (size_t b = 0; b < batch; ++b)
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) {
        float scale = core::e8m0_decode(m.scales[(b * rows + r) * blocks + c / core::kMxBlock]);
        float v = core::e4m3_decode(m.data[(b * rows + r) * cols + c]) * scale;
        dst[transpose ? (b * cols + c) * rows + r : (b * rows + r) * cols + c] = v;
      }
  return dst;
}

}  // namespace

core::StagedWeights stage_weights(const Layer& layer, const mokLayerWeights_t& w) {
  const core::LayerShape& s = layer.shape;
  const core::LocalLayout& l = layer.local_layout;
  auto at = [&](size_t offset) { return reinterpret_cast<float*>(layer.local + offset); };
  size_t e = s.experts_per_rank, h = s.hidden, in = s.intermediate, is = s.shared_intermediate;
  core::StagedWeights out{};
  if (s.mxfp8) {
    out.gate = mx_to_f32(w.gate_rowwise, e, in, h, false, at(l.w_gate));
    out.up = mx_to_f32(w.up_rowwise, e, in, h, false, at(l.w_up));
    out.down = mx_to_f32(w.down_rowwise, e, h, in, false, at(l.w_down));
    // colwise forms are stored transposed: [E, H, I] for gate/up, [E, I, H] for down
    out.bgate = mx_to_f32(w.gate_colwise, e, h, in, true, at(l.wt_gate));
    out.bup = mx_to_f32(w.up_colwise, e, h, in, true, at(l.wt_up));
    out.bdown = mx_to_f32(w.down_colwise, e, in, h, true, at(l.wt_down));
  } else {
    out.gate = out.bgate = bf16_to_f32(w.gate, e * in * h, at(l.w_gate));
    out.up = out.bup = bf16_to_f32(w.up, e * in * h, at(l.w_up));
    out.down = out.bdown = bf16_to_f32(w.down, e * h * in, at(l.w_down));
  }
  if (is > 0) {
    float* shared = at(l.shared_w);
    out.sgate = bf16_to_f32(w.shared_gate, is * h, shared);
    out.sup = bf16_to_f32(w.shared_up, is * h, shared + is * h);
    out.sdown = bf16_to_f32(w.shared_down, h * is, shared + 2 * is * h);
  }
  return out;
}

}  // namespace mok::host
