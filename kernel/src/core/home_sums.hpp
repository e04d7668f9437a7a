// The home rank's sums after the closing barrier (DESIGN 1): the output and the input gradient in
// k order with the shared term first, and the exact fp32 router-weight gradient; and a worker's shares of
// them and of the shared expert's weight-gradient write-out.
#pragma once

#include <cstdint>

#include "core/pass_view.hpp"
#include "core/tile.hpp"

namespace mok::core {

// The home sums run over blocks of N elements of H (of N slots for the router-weight gradient), N a
// constant: a block's running sums are independent, so they stay in registers (vectors on the host) and
// their adds overlap, while each element still adds its terms in the contract's order. Full blocks take
// N = kSumBlock, the rest N = 1.
constexpr int kSumBlock = 16;

// The shared gate of a token (Qwen2-MoE): s = sigmoid(x . r), the dot over H in fp32 in index order,
// the sigmoid in fp32 (numeric.hpp's, 1 / (1 + expf(-z))).
MOK_HD inline float shared_gate_of(const bf16_t* x, const bf16_t* router, int h) {
  float z = 0.0f;
  for (int i = 0; i < h; ++i) z = add_rn(z, mul_rn(bf16_to_float(x[i]), bf16_to_float(router[i])));
  return sigmoid(z);
}

// The shared term of elements [i0, i0 + N) of token t, or 0 without a shared expert.
template <int N>
MOK_HD void start_sums(const PassView& v, int64_t t, int i0, float* acc) {
  int h = v.s.hidden;
  for (int i = 0; i < N; ++i) acc[i] = v.s.shared_intermediate > 0 ? bf16_to_float(v.shared_out[t * h + i0 + i]) : 0.0f;
}

// The forward's shared term: the gated one is s_t * shared in fp32 (the bf16 shared output times the
// fp32 gate, one rounding); the ungated one the shared output itself.
template <int N>
MOK_HD void start_forward_sums(const PassView& v, int64_t t, int i0, float gate, float* acc) {
  start_sums<N>(v, t, i0, acc);
  if (v.w.shared_router && v.s.shared_intermediate > 0)
    for (int i = 0; i < N; ++i) acc[i] = mul_rn(gate, acc[i]);
}

template <int N>
MOK_HD void combine_forward_block(const PassView& v, int64_t t, int i0, float gate, const float* topk_weights,
                                  bf16_t* out) {
  int h = v.s.hidden, k = v.s.top_k;
  const int32_t* ids = peer_array<const int32_t>(v, v.s.rank, v.peer.topk_ids) + t * k;
  const bf16_t* y = peer_array<const bf16_t>(v, v.s.rank, v.peer.y_slots) + t * k * h + i0;
  float acc[N];
  start_forward_sums<N>(v, t, i0, gate, acc);
  bool input = input_scaled(v.s);  // the weights scaled the experts' inputs: y_k adds unweighted
  for (int s = 0; s < k; ++s) {
    if (ids[s] < 0) continue;
    if (input) {
      for (int i = 0; i < N; ++i) acc[i] = add_rn(acc[i], bf16_to_float(y[s * h + i]));
      continue;
    }
    float w = topk_weights[t * k + s];
    for (int i = 0; i < N; ++i) acc[i] = add_rn(acc[i], mul_rn(w, bf16_to_float(y[s * h + i])));
  }
  for (int i = 0; i < N; ++i) out[t * h + i0 + i] = float_to_bf16(acc[i]);
}

// out_t = bf16(g_t * shared_t + sum_k w_k y_k), in fp32, shared term first, then k in order; g_t the
// shared gate (computed once per token here), 1 when ungated. With input scaling the sum is of the y_k alone.
MOK_HD inline void combine_forward_token(const PassView& v, int64_t t, const float* topk_weights, bf16_t* out) {
  float gate = 1.0f;
  if (v.w.shared_router && v.s.shared_intermediate > 0)
    gate =
        shared_gate_of(peer_array<const bf16_t>(v, v.s.rank, v.peer.x) + t * v.s.hidden, v.w.shared_router, v.s.hidden);
  int i0 = 0;
  for (; i0 + kSumBlock <= v.s.hidden; i0 += kSumBlock)
    combine_forward_block<kSumBlock>(v, t, i0, gate, topk_weights, out);
  for (; i0 < v.s.hidden; ++i0) combine_forward_block<1>(v, t, i0, gate, topk_weights, out);
}

template <int N>
MOK_HD void combine_dx_block(const PassView& v, int64_t t, int i0, bf16_t* dx) {
  int h = v.s.hidden, k = v.s.top_k;
  const int32_t* ids = peer_array<const int32_t>(v, v.s.rank, v.peer.topk_ids) + t * k;
  const bf16_t* dxs = peer_array<const bf16_t>(v, v.s.rank, v.peer.dx_slots) + t * k * h + i0;
  const float* weights = peer_array<const float>(v, v.s.rank, v.peer.topk_weights) + t * k;
  bool input = input_scaled(v.s);  // the slot holds the gradient w.r.t. the scaled row: w_k brings it to x
  float acc[N];
  start_sums<N>(v, t, i0, acc);
  for (int s = 0; s < k; ++s) {
    if (ids[s] < 0) continue;
    if (input)
      for (int i = 0; i < N; ++i) acc[i] = add_rn(acc[i], mul_rn(weights[s], bf16_to_float(dxs[s * h + i])));
    else
      for (int i = 0; i < N; ++i) acc[i] = add_rn(acc[i], bf16_to_float(dxs[s * h + i]));
  }
  for (int i = 0; i < N; ++i) dx[t * h + i0 + i] = float_to_bf16(acc[i]);
}

// dw of slots [s0, s0 + N): each slot's dot runs over H in order, N chains of adds in flight. The dot is
// <dOut_t, y_k> when the weights scale the outputs, <x_t, dx_k> (the home's unscaled x, the slot's gradient
// w.r.t. the scaled row) when they scale the inputs.
template <int N>
MOK_HD void router_gradient_block(const PassView& v, int64_t t, int s0, const bf16_t* dout, float* dw) {
  int h = v.s.hidden, k = v.s.top_k;
  bool input = input_scaled(v.s);
  const int32_t* ids = peer_array<const int32_t>(v, v.s.rank, v.peer.topk_ids) + t * k;
  const bf16_t* row = input ? peer_array<const bf16_t>(v, v.s.rank, v.peer.x) + t * h : dout + t * h;
  const bf16_t* y = peer_array<const bf16_t>(v, v.s.rank, input ? v.peer.dx_slots : v.peer.y_slots) + (t * k + s0) * h;
  float acc[N];
  for (int s = 0; s < N; ++s) acc[s] = 0.0f;
  for (int i = 0; i < h; ++i) {
    float d = bf16_to_float(row[i]);
    for (int s = 0; s < N; ++s) acc[s] = add_rn(acc[s], mul_rn(d, bf16_to_float(y[s * h + i])));
  }
  for (int s = 0; s < N; ++s) dw[t * k + s0 + s] = ids[s0 + s] >= 0 ? acc[s] : 0.0f;
}

// dx_t = bf16(dxs_t + sum_k dx_k) in k order (sum_k w_k dx_k with input scaling); dw_k = <dOut_t, y_k>
// (<x_t, dx_k> with input scaling) over H in fp32 (0 for a -1 route).
MOK_HD inline void combine_backward_token(const PassView& v, int64_t t, const bf16_t* dout, bf16_t* dx, float* dw) {
  int i0 = 0, s0 = 0;
  for (; i0 + kSumBlock <= v.s.hidden; i0 += kSumBlock) combine_dx_block<kSumBlock>(v, t, i0, dx);
  for (; i0 < v.s.hidden; ++i0) combine_dx_block<1>(v, t, i0, dx);
  for (; s0 + kSumBlock <= v.s.top_k; s0 += kSumBlock) router_gradient_block<kSumBlock>(v, t, s0, dout, dw);
  for (; s0 < v.s.top_k; ++s0) router_gradient_block<1>(v, t, s0, dout, dw);
}

// Slot (t, k) as the combine read it: expert output y_k, zeros for a -1 route (nothing was pushed there).
MOK_HD inline void copy_slots_token(const PassView& v, int64_t t, bf16_t* y_slots) {
  int h = v.s.hidden, k = v.s.top_k;
  const int32_t* ids = peer_array<const int32_t>(v, v.s.rank, v.peer.topk_ids) + t * k;
  const bf16_t* y = peer_array<const bf16_t>(v, v.s.rank, v.peer.y_slots) + t * k * h;
  for (int s = 0; s < k; ++s)
    for (int i = 0; i < h; ++i) y_slots[(t * k + s) * h + i] = ids[s] >= 0 ? y[s * h + i] : bf16_t{0};
}

// ---- a worker's shares after the closing barrier (and, zeroed, before the pass) -------------------

// One weight gradient: its fp32 accumulator, its element count, the caller's tensor.
struct GradPart {
  float* acc;
  int64_t n;
  void* dst;
};
constexpr int kGradParts = 4;

// The shared expert's (and its gate's router, when gated): the routed experts' are written by their wgrad tasks
// (compute_tasks.hpp).
MOK_HD inline int grad_parts(const PassView& v, GradPart* out) {
  int64_t s_ih = static_cast<int64_t>(v.s.shared_intermediate) * v.s.hidden;
  if (s_ih == 0) return 0;
  const PassArgs* a = v.args;
  out[0] = GradPart{v.acc.sgate, s_ih, a ? a->dshared_gate : nullptr};
  out[1] = GradPart{v.acc.sup, s_ih, a ? a->dshared_up : nullptr};
  out[2] = GradPart{v.acc.sdown, s_ih, a ? a->dshared_down : nullptr};
  if (!v.w.shared_router) return 3;
  out[3] = GradPart{v.acc.srouter, v.s.hidden, a ? a->dshared_router : nullptr};
  return 4;
}

// Part `part` of the worker's share of each accumulator zeroed.
MOK_HD inline void zero_accumulators(const PassView& v, int worker, Part part) {
  GradPart grads[kGradParts];
  for (int g = 0, n = grad_parts(v, grads); g < n; ++g) {
    Share s = share_of(grads[g].n, worker, workers_of(v));
    each_piece(part, s.end - s.first, kPieceValues, [&](int64_t first, int count) {
      for (int64_t i = s.first + first; i < s.first + first + count; ++i) grads[g].acc[i] = 0.0f;
    });
  }
}

// Part `part` of the worker's share of the weight gradients out of their fp32 accumulators: bf16, or added into
// fp32 main_grad.
MOK_HD inline void write_grads(const PassView& v, int worker, Part part) {
  GradPart grads[kGradParts];
  for (int g = 0, n = grad_parts(v, grads); g < n; ++g) {
    Share s = share_of(grads[g].n, worker, workers_of(v));
    each_piece(part, s.end - s.first, kPieceValues, [&](int64_t first, int count) {
      write_gradient(grads[g].acc + s.first + first, count, v.args->accumulate != 0, grads[g].dst, s.first + first);
    });
  }
}

// Part `part` of the worker's share: the home rank's sums of its tokens (token i to part i mod count: a token's
// router-weight gradient and shared gate are dots over the whole row), and in backward its part of the write-out.
MOK_HD inline void finish_share(const PassView& v, int worker, Part part) {
  const PassArgs& a = *v.args;
  Share t = share_of(v.tokens, worker, workers_of(v));
  if (v.kind == PassKind::forward)
    for (int64_t i = t.first + part.index; i < t.end; i += part.count)
      combine_forward_token(v, i, a.topk_weights, a.out);
  if (!is_backward(v.kind)) return;
  for (int64_t i = t.first + part.index; i < t.end; i += part.count)
    combine_backward_token(v, i, a.dout, a.dx, a.dtopk_weights);
  write_grads(v, worker, part);
}

}  // namespace mok::core
