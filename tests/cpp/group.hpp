// Ranks as threads: random problems, one context per rank over heap (or shared-memory) peer
// buffers, and the collective calls made on W threads through the C ABI.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/layer_checks.hpp"
#include "check.hpp"
#include "core/mxfp8_layout.hpp"
#include "core/shape.hpp"
#include "mok/mok.h"
#include "reference.hpp"

namespace mok_test {

enum class Routing { uniform, one_expert, one_rank, empty_experts, minus_one };

struct Spec {
  int world = 2, experts = 2, hidden = 16, inter = 8, top_k = 2, shared_inter = 0;
  int max_tokens = 8;
  bool ragged = true;   // tokens per rank drawn in [1, max_tokens]
  int empty_rank = -1;  // a rank with 0 tokens
  Routing routing = Routing::uniform;
  bool mxfp8 = false;
  double limit = 0;
  double alpha = 0;          // 0: swiglu; > 0: swiglu_oai with this alpha
  bool bias = false;         // routed-expert biases (gate, up, down)
  int bias_mask = 7;         // with `bias`, which of them (gate 1, up 2, down 4): each is optional on its own
  bool gated = false;        // the shared expert gated by weights.shared_router (needs shared_inter > 0)
  bool input_scale = false;  // mokRoutingScaleInput (Llama4): the routing weights scale the experts' inputs
};

// Uniform in [-a, a], rounded to bf16; never all zeros.
inline std::vector<uint16_t> random_bf16(size_t n, double a, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> d(-a, a);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = ref::bf16_bits(d(rng));
  return v;
}

inline ref::Problem make_problem(const Spec& s, std::mt19937_64& rng) {
  ref::Problem p;
  p.world = s.world;
  p.experts = s.experts;
  p.hidden = s.hidden;
  p.inter = s.inter;
  p.top_k = s.top_k;
  p.shared_inter = s.shared_inter;
  p.limit = s.limit;
  p.alpha = s.alpha;
  p.mxfp8 = s.mxfp8;
  p.gated = s.gated;
  p.input_scale = s.input_scale;
  int n_experts = s.world * s.experts;
  std::uniform_int_distribution<int> tok(1, s.max_tokens), ex(0, n_experts - 1), coin(0, 3);
  std::uniform_real_distribution<float> wt(0.05f, 1.0f);
  int one_expert = ex(rng), one_rank = std::uniform_int_distribution<int>(0, s.world - 1)(rng);
  for (int r = 0; r < s.world; ++r) {
    int T = r == s.empty_rank ? 0 : (s.ragged ? tok(rng) : s.max_tokens);
    p.tokens.push_back(T);
    std::vector<int64_t> ids(static_cast<size_t>(T) * s.top_k);
    for (auto& id : ids) {
      switch (s.routing) {
        case Routing::uniform: id = ex(rng); break;
        case Routing::one_expert: id = one_expert; break;
        case Routing::one_rank: id = one_rank * s.experts + ex(rng) % s.experts; break;
        case Routing::empty_experts: id = (ex(rng) / 2) * 2; break;  // odd experts get nothing
        case Routing::minus_one: id = coin(rng) == 0 ? -1 : ex(rng); break;
      }
    }
    p.ids.push_back(ids);
    std::vector<float> w(ids.size());
    for (auto& x : w) x = wt(rng);
    p.topk_weights.push_back(w);
    p.x.push_back(random_bf16(static_cast<size_t>(T) * s.hidden, 1.0, rng));
    p.dout.push_back(random_bf16(static_cast<size_t>(T) * s.hidden, 1.0, rng));
    size_t eih = static_cast<size_t>(s.experts) * s.inter * s.hidden;
    p.gate.push_back(random_bf16(eih, 1.0 / std::sqrt(s.hidden), rng));
    p.up.push_back(random_bf16(eih, 1.0 / std::sqrt(s.hidden), rng));
    p.down.push_back(random_bf16(eih, 1.0 / std::sqrt(s.inter), rng));
    size_t sih = static_cast<size_t>(s.shared_inter) * s.hidden;
    p.sgate.push_back(random_bf16(sih, 1.0 / std::sqrt(s.hidden), rng));
    p.sup.push_back(random_bf16(sih, 1.0 / std::sqrt(s.hidden), rng));
    p.sdown.push_back(random_bf16(sih, 1.0 / std::sqrt(std::max(1, s.shared_inter)), rng));
    // x . r has standard deviation 4/3 with x and r uniform (x in [-1, 1], r in [-4/sqrt(H), 4/sqrt(H)]): the
    // gates spread over about 0.05..0.95, so both s and s (1 - s) vary across tokens. Drawn last, only when
    // gated: the ungated problems stay the same draws as before.
    p.srouter.push_back(s.gated ? random_bf16(s.hidden, 4.0 / std::sqrt(s.hidden), rng) : std::vector<uint16_t>{});
  }
  // Drawn after everything else (the other draws stay as they were). The GEMM outputs are about 0.3 (g, u)
  // and 0.05 (y) in magnitude: biases of the same order move every output visibly.
  for (int r = 0; s.bias && r < s.world; ++r) {
    p.bgate.push_back(random_bf16(static_cast<size_t>(s.experts) * s.inter, 0.5, rng));
    p.bup.push_back(random_bf16(static_cast<size_t>(s.experts) * s.inter, 0.5, rng));
    p.bdown.push_back(random_bf16(static_cast<size_t>(s.experts) * s.hidden, 0.1, rng));
    for (int i = 0; i < 3; ++i)  // drawn all the same, so a mask changes no other draw
      if (!(s.bias_mask & (1 << i))) (i == 0 ? p.bgate : i == 1 ? p.bup : p.bdown).back().clear();
  }
  return p;
}

struct Knobs {
  int padding = 8, minibatch = 16, macrobatch = 32;
  int comm_workers = 1, compute_workers = 2;
  int backward_comm_workers = 0;  // 0: comm_workers
  int timeout_ms = 60000;
  bool int64_ids = false;
  bool accumulate = false;       // weight gradients into fp32 main_grad buffers
  float main_grad_start = 0.5f;  // what main_grad holds before the call adds to it
  bool recompute = false;        // recompute the context before the backward
  bool backward = true;
  const char* shm_name = nullptr;                // peer memory by shared-memory rendezvous instead of heap bases
  int absent_rank = -1;                          // this rank builds the schedule, then makes no further call
  int abort_rank = -1;                           // this rank calls mokLayerAbort after the schedule
  std::function<void(int, mokLayer_t)> created;  // told each rank's context (e.g. to abort it later)
  std::function<void(int)> before_destroy;       // called before a rank destroys its context
  std::function<void(int, mokLayerConfig_t&)> edit_config;  // a rank's config, changed before creation
};

// MXFP8 needs tiles of whole 32-row token blocks (expert_padding % 32 == 0); the ring holds two minibatches.
inline Knobs mxfp8_knobs() {
  Knobs k;
  k.padding = 32;
  k.minibatch = 32;
  k.macrobatch = 64;
  return k;
}

struct Outputs {
  std::vector<mokStatus_t> status;  // per rank: the first failing call's status
  std::vector<std::string> detail;
  std::vector<mokLayerError_t> error;           // mokLayerGetError after a failure
  std::vector<double> forward_ms, backward_ms;  // per rank, wall time of the call
  std::vector<std::vector<uint16_t>> out, dx, dgate, dup, ddown, dsgate, dsup, dsdown, dsrouter;
  std::vector<std::vector<uint16_t>> slots;  // mokLayerGetSlots after the forward
  std::vector<std::vector<float>> dw, main_gate, main_up, main_down, main_sgate, main_sup, main_sdown, main_srouter;
  std::vector<std::vector<uint16_t>> dbgate, dbup, dbdown;           // bias gradients, bf16
  std::vector<std::vector<float>> main_bgate, main_bup, main_bdown;  // with accumulate
};

inline mokLayerConfig_t config_for(const ref::Problem& p, const Knobs& k, int rank) {
  mokLayerConfig_t c = MOK_LAYER_CONFIG_INIT;
  c.world = p.world;
  c.rank = rank;
  c.experts_per_rank = p.experts;
  c.hidden = p.hidden;
  c.intermediate = p.inter;
  c.top_k = p.top_k;
  int most = 1;
  for (int t : p.tokens) most = std::max(most, t);
  c.max_tokens = most;
  c.shared_intermediate = p.shared_inter;
  c.precision = p.mxfp8 ? mokPrecisionMXFP8 : mokPrecisionBF16;
  c.swiglu_limit = static_cast<float>(p.limit);
  c.activation = p.alpha > 0 ? mokActivationSwigluOai : mokActivationSwiglu;
  c.swiglu_alpha = static_cast<float>(p.alpha > 0 ? p.alpha : 1.0);
  c.expert_padding = k.padding;
  c.minibatch = k.minibatch;
  c.macrobatch = k.macrobatch;
  c.comm_workers = k.comm_workers;
  c.compute_workers = k.compute_workers;
  c.backward_comm_workers = k.backward_comm_workers;
  c.routing_scale = p.input_scale ? mokRoutingScaleInput : mokRoutingScaleOutput;
  c.timeout_ms = k.timeout_ms;
  return c;
}

// The core shape a valid config stands for, as mokLayerCreate reads it (api/layer_checks.cpp check_config): the
// tests that hold core's layouts against a layer's memory build their views from it.
inline mok::core::LayerShape shape_of(const mokLayerConfig_t& c) {
  bool oai = c.activation == mokActivationSwigluOai;
  return mok::core::LayerShape{c.world,
                               c.rank,
                               c.experts_per_rank,
                               c.hidden,
                               c.intermediate,
                               c.top_k,
                               c.max_tokens,
                               c.shared_intermediate,
                               c.precision == mokPrecisionMXFP8 ? 1 : 0,
                               c.swiglu_limit > 0.0f ? c.swiglu_limit : INFINITY,
                               c.expert_padding,
                               c.minibatch,
                               c.macrobatch,
                               c.comm_workers,
                               c.compute_workers,
                               oai ? 1 : 0,
                               oai ? c.swiglu_alpha : 0.0f,
                               c.backward_comm_workers,
                               c.routing_scale == mokRoutingScaleInput ? 1 : 0,
                               mok::api::pass_form(c.executor)};
}

struct AlignedBuffer {
  void* p = nullptr;
  explicit AlignedBuffer(size_t n) {
    size_t bytes = (n + 63) / 64 * 64;
    p = std::aligned_alloc(64, bytes ? bytes : 64);
    std::memset(p, 0, bytes ? bytes : 64);
  }
  ~AlignedBuffer() { std::free(p); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
};

// The MXFP8 forms of one rank's weights, made with mokMxfp8Quantize.
struct MxWeights {
  std::vector<uint8_t> data[6], scales[6];

  void quantise(int slot, const std::vector<uint16_t>& w, int batch, int rows, int cols) {
    size_t n = static_cast<size_t>(batch) * rows * cols;
    data[slot].resize(n);
    data[slot + 1].resize(n);
    // The scales in the SM100 layout, each matrix matrix_bytes() long (rows padded to 128, blocks to 4).
    scales[slot].resize(static_cast<size_t>(mok::core::MxScaleLayout::of(rows, cols).batch_bytes(batch)));
    scales[slot + 1].resize(static_cast<size_t>(mok::core::MxScaleLayout::of(cols, rows).batch_bytes(batch)));
    mokStatus_t s = mokMxfp8Quantize(w.data(), mokDataBF16, batch, rows, cols, data[slot].data(), scales[slot].data(),
                                     data[slot + 1].data(), scales[slot + 1].data(), nullptr);
    CHECK_MSG(s == mokSuccess, "%s", mokGetLastError());
  }
  mokMxfp8Matrix_t matrix(int slot) const { return {data[slot].data(), scales[slot].data()}; }

  // w with rank r's routed experts in place of its bf16 ones: gate, up and down quantised rowwise and colwise.
  void wire(const ref::Problem& p, int r, mokLayerWeights_t& w) {
    w.gate = w.up = w.down = nullptr;
    quantise(0, p.gate[r], p.experts, p.inter, p.hidden);
    quantise(2, p.up[r], p.experts, p.inter, p.hidden);
    quantise(4, p.down[r], p.experts, p.hidden, p.inter);
    w.gate_rowwise = matrix(0);
    w.gate_colwise = matrix(1);
    w.up_rowwise = matrix(2);
    w.up_colwise = matrix(3);
    w.down_rowwise = matrix(4);
    w.down_colwise = matrix(5);
  }
};

template <class F>
void each_rank(int world, F f) {
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(f, r);
  for (auto& t : ranks) t.join();
}

// One rank's calls: schedule, forward, (recompute), backward; outputs and status into o[rank].
// Rank r's bf16 weights as the C ABI takes them (the shared expert's when it has one).
// Rank r's expert biases (gate, up, down) as a layer takes them: null for one the problem's mask left out, or for
// all in a problem without biases.
inline std::array<const uint16_t*, 3> problem_biases(const ref::Problem& p, int r) {
  if (p.bgate.empty()) return {};
  auto given = [r](const std::vector<std::vector<uint16_t>>& b) { return b[r].empty() ? nullptr : b[r].data(); };
  return {given(p.bgate), given(p.bup), given(p.bdown)};
}

// Where rank r's bias gradients go (into[i]: the call's pointer), each only for a bias given (a gradient is required
// exactly where its bias is): added into fp32 `main` from `start` when accumulating, else bf16 `bf16`, NaN until
// written.
inline void bias_gradient_buffers(const ref::Problem& p, int r, bool accumulate, float start,
                                  std::vector<float>* const main[3], std::vector<uint16_t>* const bf16[3],
                                  void** const into[3]) {
  std::array<const uint16_t*, 3> given = problem_biases(p, r);
  size_t ei = static_cast<size_t>(p.experts) * p.inter, eh = static_cast<size_t>(p.experts) * p.hidden;
  size_t sizes[3] = {ei, ei, eh};
  for (int i = 0; i < 3; ++i) {
    if (!given[i]) continue;
    if (accumulate)
      main[i]->assign(sizes[i], start), *into[i] = main[i]->data();
    else
      bf16[i]->assign(sizes[i], 0xffff), *into[i] = bf16[i]->data();
  }
}

inline mokLayerWeights_t bf16_weights(const ref::Problem& p, int r) {
  mokLayerWeights_t w = MOK_LAYER_WEIGHTS_INIT;
  w.gate = p.gate[r].data();
  w.up = p.up[r].data();
  w.down = p.down[r].data();
  if (p.shared_inter > 0) {
    w.shared_gate = p.sgate[r].data();
    w.shared_up = p.sup[r].data();
    w.shared_down = p.sdown[r].data();
    if (p.gated) w.shared_router = p.srouter[r].data();
  }
  std::array<const uint16_t*, 3> biases = problem_biases(p, r);
  w.gate_bias = biases[0], w.up_bias = biases[1], w.down_bias = biases[2];
  return w;
}

// The outputs of rank r's backward with bf16 weight gradients, filled with `fill` until the call
// writes them, and the mokLayerGrads_t that points at them.
struct Bf16Grads {
  std::vector<uint16_t> dx, dgate, dup, ddown, dsgate, dsup, dsdown, dsrouter;
  std::vector<float> dw;

  Bf16Grads(const ref::Problem& p, int r, uint16_t fill = 0, float dw_fill = 0.0f) {
    size_t th = static_cast<size_t>(p.tokens[r]) * p.hidden, eih = static_cast<size_t>(p.experts) * p.inter * p.hidden;
    size_t sih = static_cast<size_t>(p.shared_inter) * p.hidden;
    dx.assign(th, fill);
    dw.assign(static_cast<size_t>(p.tokens[r]) * p.top_k, dw_fill);
    for (auto* v : {&dgate, &dup, &ddown}) v->assign(eih, fill);
    for (auto* v : {&dsgate, &dsup, &dsdown}) v->assign(sih, fill);
    if (p.gated) dsrouter.assign(p.hidden, fill);
  }
  mokLayerGrads_t grads() {
    mokLayerGrads_t g = MOK_LAYER_GRADS_INIT;
    g.dx = dx.data();
    g.dtopk_weights = dw.data();
    g.dgate = dgate.data();
    g.dup = dup.data();
    g.ddown = ddown.data();
    g.dshared_gate = dsgate.data();
    g.dshared_up = dsup.data();
    g.dshared_down = dsdown.data();
    if (!dsrouter.empty()) g.dshared_router = dsrouter.data();
    return g;
  }
};

inline void run_rank(const ref::Problem& p, const Knobs& k, int r, void* const* bases, void* workspace,
                     size_t workspace_bytes, Outputs& o) {
  auto step = [&](mokStatus_t s) {
    if (s != mokSuccess && o.status[r] == mokSuccess) {
      o.status[r] = s;
      o.detail[r] = mokGetLastError();
    }
    return s == mokSuccess;
  };
  mokLayerConfig_t c = config_for(p, k, r);
  if (k.edit_config) k.edit_config(r, c);
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  if (k.shm_name)
    m.shm_name = k.shm_name;
  else
    m.peer_bases = bases;
  m.workspace = workspace;
  m.workspace_bytes = workspace_bytes;
  mokLayer_t layer = nullptr;
  if (!step(mokLayerCreate(&c, &m, &layer))) return;
  if (k.created) k.created(r, layer);
  int T = p.tokens[r], H = p.hidden, K = p.top_k;
  std::vector<int32_t> ids32(p.ids[r].begin(), p.ids[r].end());
  const void* ids = k.int64_ids ? static_cast<const void*>(p.ids[r].data()) : ids32.data();
  MxWeights mx;
  mokLayerWeights_t w = bf16_weights(p, r);
  if (p.mxfp8) mx.wire(p, r, w);
  o.out[r].assign(static_cast<size_t>(T) * H, 0);
  bool ok = step(mokLayerBuildSchedule(layer, ids, k.int64_ids ? mokIndexInt64 : mokIndexInt32, T, nullptr));
  if (r == k.absent_rank) ok = false;
  if (ok && r == k.abort_rank) step(mokLayerAbort(layer, nullptr));
  auto t0 = std::chrono::steady_clock::now();
  ok = ok && step(mokLayerForward(layer, &w, p.x[r].data(), p.topk_weights[r].data(), o.out[r].data(), nullptr));
  o.forward_ms[r] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (ok) {
    o.slots[r].assign(static_cast<size_t>(T) * K * H, 0xffff);
    ok = step(mokLayerGetSlots(layer, o.slots[r].data(), nullptr));
  }
  // With input scaling the context depends on the weights: the recompute that takes them.
  if (ok && k.recompute)
    ok = step(p.input_scale ? mokLayerRecomputeWeighted(layer, &w, p.x[r].data(), p.topk_weights[r].data(), nullptr)
                            : mokLayerRecompute(layer, &w, p.x[r].data(), nullptr));
  if (ok && k.backward) {
    size_t eih = static_cast<size_t>(p.experts) * p.inter * H, sih = static_cast<size_t>(p.shared_inter) * H;
    o.dx[r].assign(static_cast<size_t>(T) * H, 0);
    o.dw[r].assign(static_cast<size_t>(T) * K, 0);
    mokLayerGrads_t g = MOK_LAYER_GRADS_INIT;
    g.dx = o.dx[r].data();
    g.dtopk_weights = o.dw[r].data();
    g.accumulate = k.accumulate;
    if (k.accumulate) {
      o.main_gate[r].assign(eih, k.main_grad_start);  // main_grad already holds something: the call adds to it
      o.main_up[r].assign(eih, k.main_grad_start);
      o.main_down[r].assign(eih, k.main_grad_start);
      g.dgate = o.main_gate[r].data();
      g.dup = o.main_up[r].data();
      g.ddown = o.main_down[r].data();
    } else {
      for (auto* v : {&o.dgate, &o.dup, &o.ddown}) (*v)[r].assign(eih, 0);
      g.dgate = o.dgate[r].data();
      g.dup = o.dup[r].data();
      g.ddown = o.ddown[r].data();
    }
    if (sih && k.accumulate) {  // accumulate covers the shared expert's gradients too: fp32 buffers
      for (auto* v : {&o.main_sgate, &o.main_sup, &o.main_sdown, &o.main_srouter})
        (*v)[r].assign(sih, k.main_grad_start);
      g.dshared_gate = o.main_sgate[r].data();
      g.dshared_up = o.main_sup[r].data();
      g.dshared_down = o.main_sdown[r].data();
      if (p.gated) {
        o.main_srouter[r].assign(H, k.main_grad_start);
        g.dshared_router = o.main_srouter[r].data();
      }
    } else if (sih) {
      for (auto* v : {&o.dsgate, &o.dsup, &o.dsdown}) (*v)[r].assign(sih, 0);
      g.dshared_gate = o.dsgate[r].data();
      g.dshared_up = o.dsup[r].data();
      g.dshared_down = o.dsdown[r].data();
      if (p.gated) {
        o.dsrouter[r].assign(H, 0);
        g.dshared_router = o.dsrouter[r].data();
      }
    }
    std::vector<float>* main[3] = {&o.main_bgate[r], &o.main_bup[r], &o.main_bdown[r]};
    std::vector<uint16_t>* bf16[3] = {&o.dbgate[r], &o.dbup[r], &o.dbdown[r]};
    void** into[3] = {&g.dgate_bias, &g.dup_bias, &g.ddown_bias};
    bias_gradient_buffers(p, r, k.accumulate, k.main_grad_start, main, bf16, into);
    auto t1 = std::chrono::steady_clock::now();
    step(mokLayerBackward(layer, &w, p.topk_weights[r].data(), p.dout[r].data(), &g, nullptr));
    o.backward_ms[r] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  }
  if (o.status[r] != mokSuccess) mokLayerGetError(layer, &o.error[r]);
  if (k.before_destroy) k.before_destroy(r);
  mokLayerDestroy(layer);
}

inline Outputs empty_outputs(int world) {
  Outputs o;
  o.status.assign(world, mokSuccess);
  o.detail.assign(world, "");
  o.error.assign(world, mokLayerError_t MOK_LAYER_ERROR_INIT);
  o.forward_ms.assign(world, 0);
  o.backward_ms.assign(world, 0);
  for (auto* v : {&o.out, &o.dx, &o.dgate, &o.dup, &o.ddown, &o.dsgate, &o.dsup, &o.dsdown, &o.dsrouter, &o.slots})
    v->resize(world);
  for (auto* v :
       {&o.dw, &o.main_gate, &o.main_up, &o.main_down, &o.main_sgate, &o.main_sup, &o.main_sdown, &o.main_srouter})
    v->resize(world);
  for (auto* v : {&o.dbgate, &o.dbup, &o.dbdown}) v->resize(world);
  for (auto* v : {&o.main_bgate, &o.main_bup, &o.main_bdown}) v->resize(world);
  return o;
}

inline mokLayerSizes_t sizes_for(const ref::Problem& p, const Knobs& k) {
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  mokLayerConfig_t c0 = config_for(p, k, 0);
  CHECK_MSG(mokLayerGetSizes(&c0, &sizes) == mokSuccess, "mokLayerGetSizes: %s", mokGetLastError());
  return sizes;
}

// Every rank on its own thread over caller buffers: peer buffers (heap mode) and workspaces, each at
// least as large as mokLayerGetSizes asks for p.
inline Outputs run_layer_over(const ref::Problem& p, const Knobs& k, void* const* bases, void* const* workspaces,
                              size_t workspace_bytes) {
  Outputs o = empty_outputs(p.world);
  each_rank(p.world, [&](int r) { run_rank(p, k, r, bases, workspaces[r], workspace_bytes, o); });
  return o;
}

// Every rank on its own thread, peer buffers from the heap (or shared memory with k.shm_name).
inline Outputs run_layer(const ref::Problem& p, const Knobs& k) {
  int W = p.world;
  mokLayerSizes_t sizes = sizes_for(p, k);
  std::vector<std::unique_ptr<AlignedBuffer>> peers, work;
  std::vector<void*> bases, workspaces;
  for (int r = 0; r < W; ++r) {
    peers.emplace_back(new AlignedBuffer(k.shm_name ? 0 : sizes.peer_bytes));
    work.emplace_back(new AlignedBuffer(sizes.workspace_bytes));
    bases.push_back(peers.back()->p);
    workspaces.push_back(work.back()->p);
  }
  return run_layer_over(p, k, bases.data(), workspaces.data(), sizes.workspace_bytes);
}

inline bool all_ok(const Outputs& o) {
  bool ok = true;
  for (size_t r = 0; r < o.status.size(); ++r)
    if (o.status[r] != mokSuccess) {
      std::printf("  rank %zu: %s: %s\n", r, mokGetStatusString(o.status[r]), o.detail[r].c_str());
      ok = false;
    }
  return ok;
}

// |got - ref| <= tol * max|ref| for every element; tol is a fraction of the tensor's scale. With
// min_exact > 0 (bf16 outputs), also at least that fraction of the elements must equal the reference
// exactly: both round at the same points, so only a sum that lands next to a rounding boundary can differ
// (measured: under 5% of elements), while a missing or extra rounding point changes about half of them.
// One boundary upstream (an element of h) moves a whole row of `width` elements, so the fraction is judged
// only over kExactRows rows or more (a rank of 2 tokens with one row half changed is 75% exact).
// `scale`, when given, stands for max|ref| (close_dw).
constexpr size_t kExactRows = 8;
inline bool close(const char* what, int rank, const std::vector<double>& got, const ref::Vec& want, double tol,
                  double min_exact = 0, size_t width = 1, double scale = 0) {
  if (got.size() != want.size()) {
    CHECK_MSG(false, "%s rank %d: %zu values, expected %zu", what, rank, got.size(), want.size());
    return false;
  }
  double worst = 0;
  size_t at = 0, exact = 0;
  scale = std::max(scale, 1e-30);
  for (double v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < got.size(); ++i) {
    double e = std::fabs(got[i] - want[i]);
    exact += e == 0;
    if (!(e <= worst)) {
      worst = e;
      at = i;
    }
  }
  bool ok = worst <= tol * scale;
  CHECK_MSG(ok, "%s rank %d: max error %.3g at %zu (got %.6g, want %.6g), allowed %.3g", what, rank, worst, at,
            got.empty() ? 0.0 : got[at], want.empty() ? 0.0 : want[at], tol * scale);
  if (got.size() >= 64 && got.size() >= kExactRows * width) {
    double fraction = static_cast<double>(exact) / got.size();
    CHECK_MSG(fraction >= min_exact, "%s rank %d: %.1f%% of %zu elements equal the reference exactly, want >= %.0f%%",
              what, rank, 100 * fraction, got.size(), 100 * min_exact);
    ok = ok && fraction >= min_exact;
  }
  return ok;
}

// The router-weight gradients: each a sum of H products (d_h · y_h, or x_h · dx_h with input scaling) that may cancel
// far below its terms, where one bf16 flip upstream moves a term by 2^-8 of its own size. So the tolerance is a
// fraction of the largest sum of the terms' magnitudes (ref::Result::dw_terms), not of the largest sum: at 8 terms
// a sum of 0.04 took an error of 0.0007 from terms an order larger (world72_threads_small, one seed in many).
inline bool close_dw(int rank, const std::vector<double>& got, const ref::Result& want, double tol) {
  double terms = 0;
  for (double v : want.dw_terms[rank]) terms = std::max(terms, v);
  return close("dtopk_weights", rank, got, want.dw[rank], tol, 0, 1, terms);
}

inline std::vector<double> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = ref::bf16_value(v[i]);
  return d;
}

inline std::vector<double> from_float(const std::vector<float>& v, double minus = 0) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = v[i] - minus;
  return d;
}

}  // namespace mok_test
