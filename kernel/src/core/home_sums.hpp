// The home rank's sums after the closing barrier (DESIGN 1): the output and the input gradient in
// k order with the shared term first, and the exact fp32 router-weight gradient.
#pragma once

#include <cstdint>

#include "core/pass_view.hpp"

namespace mok::core {

// The home sums run over blocks of kSumBlock elements of H (of kSumBlock slots for the router-weight
// gradient): a block's running sums are independent, so they stay in registers or vectors and their adds
// overlap, while each element still adds its terms in the contract's order.
constexpr int kSumBlock = 16;

MOK_HD inline int block_size(int total, int first) {
  return total - first < kSumBlock ? total - first : kSumBlock;
}

// out_t = bf16(s_t + sum_k w_k y_k), in fp32, shared term first, then k in order.
MOK_HD inline void combine_forward_token(const PassView& v, int64_t t, const float* topk_weights, bf16_t* out) {
  int h = v.s.hidden, k = v.s.top_k;
  const int32_t* ids = peer_array<const int32_t>(v, v.s.rank, v.peer.topk_ids) + t * k;
  const bf16_t* y = peer_array<const bf16_t>(v, v.s.rank, v.peer.y_slots) + t * k * h;
  for (int i0 = 0; i0 < h; i0 += kSumBlock) {
    int n = block_size(h, i0);
    float acc[kSumBlock];
    for (int i = 0; i < n; ++i)
      acc[i] = v.s.shared_intermediate > 0 ? bf16_to_float(v.shared_out[t * h + i0 + i]) : 0.0f;
    for (int s = 0; s < k; ++s) {
      if (ids[s] < 0) continue;
      float w = topk_weights[t * k + s];
      for (int i = 0; i < n; ++i) acc[i] = add_rn(acc[i], mul_rn(w, bf16_to_float(y[s * h + i0 + i])));
    }
    for (int i = 0; i < n; ++i) out[t * h + i0 + i] = float_to_bf16(acc[i]);
  }
}

// dx_t = bf16(dxs_t + sum_k dx_k) in k order; dw_k = <dOut_t, y_k> over H in fp32 (0 for a -1 route).
MOK_HD inline void combine_backward_token(const PassView& v, int64_t t, const bf16_t* dout, bf16_t* dx, float* dw) {
  int h = v.s.hidden, k = v.s.top_k;
  const int32_t* ids = peer_array<const int32_t>(v, v.s.rank, v.peer.topk_ids) + t * k;
  const bf16_t* y = peer_array<const bf16_t>(v, v.s.rank, v.peer.y_slots) + t * k * h;
  const bf16_t* dxs = peer_array<const bf16_t>(v, v.s.rank, v.peer.dx_slots) + t * k * h;
  for (int i0 = 0; i0 < h; i0 += kSumBlock) {
    int n = block_size(h, i0);
    float acc[kSumBlock];
    for (int i = 0; i < n; ++i)
      acc[i] = v.s.shared_intermediate > 0 ? bf16_to_float(v.shared_out[t * h + i0 + i]) : 0.0f;
    for (int s = 0; s < k; ++s)
      if (ids[s] >= 0)
        for (int i = 0; i < n; ++i) acc[i] = add_rn(acc[i], bf16_to_float(dxs[s * h + i0 + i]));
    for (int i = 0; i < n; ++i) dx[t * h + i0 + i] = float_to_bf16(acc[i]);
  }
  // Each slot's dot runs over H in order; kSumBlock slots at a time keep that many chains of adds in flight.
  for (int s0 = 0; s0 < k; s0 += kSumBlock) {
    int n = block_size(k, s0);
    float acc[kSumBlock];
    for (int s = 0; s < n; ++s) acc[s] = 0.0f;
    for (int i = 0; i < h; ++i) {
      float d = bf16_to_float(dout[t * h + i]);
      for (int s = 0; s < n; ++s) acc[s] = add_rn(acc[s], mul_rn(d, bf16_to_float(y[(s0 + s) * h + i])));
    }
    for (int s = 0; s < n; ++s) dw[t * k + s0 + s] = ids[s0 + s] >= 0 ? acc[s] : 0.0f;
  }
}

// Slot (t, k) as the combine read it: expert output y_k, zeros for a -1 route (nothing was pushed there).
MOK_HD inline void copy_slots_token(const PassView& v, int64_t t, bf16_t* y_slots) {
  int h = v.s.hidden, k = v.s.top_k;
  const int32_t* ids = peer_array<const int32_t>(v, v.s.rank, v.peer.topk_ids) + t * k;
  const bf16_t* y = peer_array<const bf16_t>(v, v.s.rank, v.peer.y_slots) + t * k * h;
  for (int s = 0; s < k; ++s)
    for (int i = 0; i < h; ++i) y_slots[(t * k + s) * h + i] = ids[s] >= 0 ? y[s * h + i] : bf16_t{0};
}

}  // namespace mok::core
