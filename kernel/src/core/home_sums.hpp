// The home rank's sums after the closing barrier (DESIGN 1): the output and the input gradient in
// k order with the shared term first, and the exact fp32 router-weight gradient.
#pragma once

#include <cstdint>

#include "core/pass_view.hpp"

namespace mok::core {

// out_t = bf16(s_t + sum_k w_k y_k), in fp32, shared term first, then k in order.
MOK_HD inline void combine_forward_token(const PassView& v, int64_t t, const float* topk_weights, bf16_t* out) {
  int h = v.s.hidden, k = v.s.top_k;
  const int32_t* ids = peer_array<const int32_t>(v, v.s.rank, v.peer.topk_ids) + t * k;
  const bf16_t* y = peer_array<const bf16_t>(v, v.s.rank, v.peer.y_slots) + t * k * h;
  for (int i = 0; i < h; ++i) {
    float acc = v.s.shared_intermediate > 0 ? bf16_to_float(v.shared_out[t * h + i]) : 0.0f;
    for (int s = 0; s < k; ++s)
      if (ids[s] >= 0) acc = add_rn(acc, mul_rn(topk_weights[t * k + s], bf16_to_float(y[s * h + i])));
    out[t * h + i] = float_to_bf16(acc);
  }
}

// dx_t = bf16(dxs_t + sum_k dx_k) in k order; dw_k = <dOut_t, y_k> over H in fp32 (0 for a -1 route).
MOK_HD inline void combine_backward_token(const PassView& v, int64_t t, const bf16_t* dout, bf16_t* dx, float* dw) {
  int h = v.s.hidden, k = v.s.top_k;
  const int32_t* ids = peer_array<const int32_t>(v, v.s.rank, v.peer.topk_ids) + t * k;
  const bf16_t* y = peer_array<const bf16_t>(v, v.s.rank, v.peer.y_slots) + t * k * h;
  const bf16_t* dxs = peer_array<const bf16_t>(v, v.s.rank, v.peer.dx_slots) + t * k * h;
  for (int i = 0; i < h; ++i) {
    float acc = v.s.shared_intermediate > 0 ? bf16_to_float(v.shared_out[t * h + i]) : 0.0f;
    for (int s = 0; s < k; ++s)
      if (ids[s] >= 0) acc = add_rn(acc, bf16_to_float(dxs[s * h + i]));
    dx[t * h + i] = float_to_bf16(acc);
  }
  for (int s = 0; s < k; ++s) {
    float acc = 0.0f;
    if (ids[s] >= 0)
      for (int i = 0; i < h; ++i)
        acc = add_rn(acc, mul_rn(bf16_to_float(dout[t * h + i]), bf16_to_float(y[s * h + i])));
    dw[t * k + s] = acc;
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
