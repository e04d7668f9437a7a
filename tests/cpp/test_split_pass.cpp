// core/split_pass.hpp run on the host: the split executor's whole pass (split_plan's launches in stream order,
// each GEMM from split_gemm_operands and the grouped problems, the row steps over split_window_tiles with core's
// wait-free bodies, the home sums) over the memory the host executor left after its own pass, ranks as threads
// meeting at the plan's barrier. It must give the host executor's bytes: out, dx and dw bitwise; the weight
// gradients bitwise where each expert's rows lie in one ring window, else within the fp32 bound below.
//
// The host steps compute each GEMM in core's contract order (gemm.hpp), dgrad_x_up's source C continued by its
// own products as core's dgrad_x task continues dg W_gate's sum; a weight gradient's window product from 0 and
// then added to main_grad, as the wgrad GEMM's epilogue adds it (D = C + P). Only the order inside a GEMM
// differs on a GPU. Random ragged routings (one expert, empty experts, -1 routes, a rank with no tokens),
// swiglu and swiglu_oai with a clamp, both routing scales, rings that turn and rings that hold every row.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "core/comm_tasks.hpp"
#include "core/home_sums.hpp"
#include "core/split_bias.hpp"
#include "core/split_pass.hpp"
#include "core/split_shared.hpp"
#include "core/split_workspace.hpp"
#include "group.hpp"

namespace core = mok::core;
using namespace mok_test;
using core::GroupedGemm;
using core::PassKind;
using core::SplitResult;

namespace {

// The plan's barrier for ranks as threads: bounded, like every wait of the layer.
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int world) : world_(world) {}
  bool wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    int round = round_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++round_;
      done_.notify_all();
      return true;
    }
    return done_.wait_for(lock, std::chrono::seconds(60), [&] { return round_ != round; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  int world_, arrived_ = 0, round_ = 0;
};

const float* sigmoid_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(core::kSigmoidTableSize);
    core::fill_sigmoid_table(t.data());
    return t;
  }();
  return table.data();
}

// One rank's outputs of a split pass: out (forward), or dx, dw and the weight gradients' fp32 main_grad; and its
// y slots after a forward or a recompute (what every rank's combine pushed into its peer buffer).
struct SplitOutputs {
  std::vector<uint16_t> out, dx, slots;
  std::vector<float> dw, main_gate, main_up, main_down, main_sgate, main_sup, main_sdown, main_srouter;
  std::vector<uint16_t> dgate, dup, ddown, dsgate, dsup, dsdown, dsrouter;  // bf16 gradients (no main_grad)
  std::vector<uint16_t> dbgate, dbup, dbdown;                               // bias gradients: bf16 ...
  std::vector<float> main_bgate, main_bup, main_bdown;                      // ... or added into fp32
};

// The split executor's own buffers (core/split_workspace.hpp: dx's fp32 first term, the weight gradients' sums, the
// shared expert's buffers) in one block laid out as a device workspace holds them, every byte set (bf16 and fp32 NaN,
// int32 -1): what the pass reads there it must have written, and a region the layout made too small or overlapping
// another would show in the results (or under ASan past the block's end).
struct ExtrasBlock {
  explicit ExtrasBlock(const core::LayerShape& s)
      : layout(core::split_layout(s, 64)), bytes(layout.bytes + core::kGemmArgumentAlign, 0xff) {
    size_t misaligned = reinterpret_cast<uintptr_t>(bytes.data()) % core::kGemmArgumentAlign;
    char* extras = bytes.data() + (misaligned ? core::kGemmArgumentAlign - misaligned : 0);
    bytes.resize(static_cast<size_t>(extras - bytes.data()) + layout.bytes);  // no slack past the layout's end
    buffers = core::split_buffers_at(s, layout, bytes.data() + (extras - bytes.data()));
  }
  core::SplitLayout layout;
  std::vector<char> bytes;
  core::SplitBuffers buffers;
};

// The host's way of running each step of the split pass over one rank's view.
struct HostSteps {
  core::PassView v;
  core::SplitTargets targets;
  const ref::Problem& p;
  int rank;
  ThreadBarrier& barrier_;
  SplitOutputs& o;
  bool reverse;       // each GEMM's sum in reverse order: another order, as a GPU's tensor cores have their own
  bool block_scaled;  // MXFP8: the block-scaled kinds block-scaled (SM100), else dequantised as on sm_90a
  core::SplitDequantised dequantised;
  core::SplitShared shared;
  core::SplitGradients bf16_grads;
  std::vector<core::bf16_t> staging;
  std::vector<float> scratch, product;

  template <class Body>
  void each_tile(const core::RowWindow& w, Body body) {
    core::SplitTiles tiles = core::split_window_tiles(v, w);
    for (int64_t tile = tiles.first; tile < tiles.end; ++tile) body(tile);
  }
  bool dispatch(core::RowWindow w) {
    int64_t pad = v.s.expert_padding;
    each_tile(w, [&](int64_t t) { core::pull_window(v, t * pad, (t + 1) * pad, staging.data()); });
    return true;
  }
  bool swiglu(core::RowWindow w) {
    each_tile(w,
              [&](int64_t t) { core::swiglu_rows(v, core::split_tile(v, core::TaskKind::swiglu, t), staging.data()); });
    return true;
  }
  bool swiglu_backward(core::RowWindow w) {
    each_tile(w, [&](int64_t t) {
      core::swiglu_backward_rows(v, core::split_tile(v, core::TaskKind::swiglu_bwd, t), staging.data());
    });
    return true;
  }
  bool combine(core::RowWindow w) {
    int64_t pad = v.s.expert_padding;
    each_tile(w, [&](int64_t t) { core::push_rows(v, t * pad, (t + 1) * pad); });
    return true;
  }
  bool gradients(bool write) {
    core::GradientParts parts =
        core::split_gradient_parts(v.s, v.w.shared_router != nullptr, bf16_grads.gate != nullptr, targets, bf16_grads);
    for (int64_t i = 0; i < core::gradient_items(parts); ++i) core::gradient_item(parts, i, write);
    return true;
  }
  // The device's two kernels: the window's ring rows (every column), then the weights element by element.
  bool dequantise(GroupedGemm kind, core::RowWindow w) {
    CHECK_MSG(core::split_dequantises(v.s, kind, block_scaled, core::split_bias(v.w, kind) != nullptr),
              "a dequantise step before GEMM kind %d, which reads "
              "its operands as they are",
              static_cast<int>(kind));
    for (int64_t row = w.row0; row < w.row0 + w.rows; ++row) {
      core::dequantise_ring_row(v, kind, false, row, 0, 1, dequantised.a);
      if (core::is_wgrad(kind)) core::dequantise_ring_row(v, kind, true, row, 0, 1, dequantised.b);
    }
    for (int64_t i = 0; i < core::dequantise_weight_items(v.s, kind); ++i)
      core::dequantise_weight_item(v, kind, i, dequantised.b);
    return true;
  }
  // The device's kernels: a row at a time across its columns; a column of each bias gradient at a time.
  bool add_bias(GroupedGemm kind, core::RowWindow w) {
    CHECK_MSG(core::split_bias(v.w, kind), "an add_bias step after GEMM kind %d, which has no bias",
              static_cast<int>(kind));
    for (int64_t row = w.row0; row < w.row0 + w.rows; ++row) core::add_bias_row(v, targets, kind, row, 0, 1);
    return true;
  }
  bool bias_gradients(core::RowWindow w) {
    for (int64_t i = 0; i < core::bias_gradient_items(v.s, bf16_grads); ++i)
      core::bias_gradient_item(v, targets, bf16_grads, w, i);
    return true;
  }
  bool shared_rows(core::SplitStep step) {
    for (int64_t i = 0; i < core::shared_step_items(v, step); ++i)
      core::shared_step_item(v, shared, targets.wgrad_shared_router, step, i);
    return true;
  }
  bool barrier() { return barrier_.wait(); }
  bool home_sums() {
    int T = p.tokens[rank], H = p.hidden, K = p.top_k;
    if (core::is_backward(v.kind)) {
      o.dx.assign(static_cast<size_t>(T) * H, 0xffff);
      o.dw.assign(static_cast<size_t>(T) * K, NAN);
      for (int t = 0; t < T; ++t) core::combine_backward_token(v, t, p.dout[rank].data(), o.dx.data(), o.dw.data());
    } else {
      o.out.assign(static_cast<size_t>(T) * H, 0xffff);
      for (int t = 0; t < T; ++t) core::combine_forward_token(v, t, p.topk_weights[rank].data(), o.out.data());
    }
    return true;
  }

  // Expert e's product P over the window into `product` ([m, n] fp32, from 0 or from `start`), in core's order.
  void multiply(const core::GroupedProblem& pr, const core::GroupedLayout& l, const core::SplitGemmOperands& ops,
                const float* start) {
    product.assign(static_cast<size_t>(pr.m) * pr.n, 0.0f);
    for (int i = 0; start && i < pr.m; ++i)
      for (int j = 0; j < pr.n; ++j) product[static_cast<size_t>(i) * pr.n + j] = start[pr.c + i * l.ldc + j];
    multiply(core::problem_gemm(pr, l, ops.a, ops.b, product.data(), core::Epilogue::accumulate_f32));
  }
  // g's one part added into `product` ([rows, cols] fp32, as it starts).
  void multiply(core::Gemm g) {
    g.c = product.data();  // P alone, [m, n]: the result's epilogue follows in gemm()
    g.c_stride = g.cols;
    g.epilogue = core::Epilogue::accumulate_f32;
    if (reverse) return multiply_reversed(g);
    scratch.assign(core::gemm_scratch_floats(g.rows, g.cols, g.parts[0].depth, false), 0.0f);
    core::reference_gemm(g, scratch.data());
  }
  void multiply_reversed(const core::Gemm& g) {
    const core::GemmPart& part = g.parts[0];
    for (int i = 0; i < g.rows; ++i)
      for (int j = 0; j < g.cols; ++j) {
        float& sum = static_cast<float*>(g.c)[static_cast<int64_t>(i) * g.c_stride + j];
        for (int k = part.depth - 1; k >= 0; --k)
          sum = core::add_rn(sum, core::mul_rn(core::stored_value(part.a, i, k), core::stored_value(part.b, j, k)));
      }
  }
  // A block-scaled GEMM as the GPU's launcher is given it (grouped_mx_problem): each expert's A from its first ring
  // row's codes and scales, read through the group's own scale layout of M rows, as CUTLASS reads it; B the expert's
  // weight quantised along K (rowwise; dgrad_h: down's colwise form) and its scales.
  bool grouped_mx(GroupedGemm kind, core::RowWindow w) {
    core::SplitMxOperands o = core::split_mx_gemm_operands(v, kind);
    core::RowPeriods periods = core::ring_periods(v.s);
    CHECK_MSG(core::mx_block_scaled_kind(kind) && core::window_fits(kind, periods, w) &&
                  core::mx_tiles_whole(v.s, periods, w),
              "an MXFP8 GEMM (kind %d, rows %lld + %lld) the GPU's launcher would refuse", static_cast<int>(kind),
              static_cast<long long>(w.row0), static_cast<long long>(w.rows));
    core::GroupedLayout l = core::grouped_mx_layout(v.s, kind);  // as the device's fill gives CUTLASS the strides
    CHECK_MSG(l.a_k_major && l.b_k_major, "block-scaled kind %d with an operand not K-major", static_cast<int>(kind));
    for (int e = 0; e < v.s.experts_per_rank; ++e) {
      core::GroupedMxProblem q = core::grouped_mx_problem(v.s, v.sched, kind, periods, w, o.a_stride, e);
      const core::GroupedProblem& pr = q.p;
      if (pr.m == 0) continue;
      core::Gemm g{};
      g.rows = pr.m;
      g.cols = pr.n;
      g.parts[0] = core::GemmPart{
          core::e4m3_operand(o.a + pr.a, q.lda, o.a_scales + q.a_scales, core::MxScaleLayout::of(pr.m, pr.k)),
          core::e4m3_operand(o.b + pr.b, l.ldb, o.b_scales + q.b_scales, core::MxScaleLayout::of(pr.n, pr.k)), pr.k};
      g.num_parts = 1;
      product.assign(static_cast<size_t>(pr.m) * pr.n, 0.0f);
      multiply(g);
      for (int i = 0; i < pr.m; ++i)
        for (int j = 0; j < pr.n; ++j)
          o.d[pr.c + i * l.ldc + j] = core::float_to_bf16(product[static_cast<size_t>(i) * pr.n + j]);
    }
    return true;
  }
  bool gemm(GroupedGemm kind, core::RowWindow w) {
    core::SplitRoutedGemm g = core::split_routed_gemm(v, kind, targets, dequantised, block_scaled);
    if (g.block_scaled) return grouped_mx(kind, w);
    return grouped(kind, g.bf16, v.s, v.sched, core::ring_periods(v.s), w);
  }
  bool shared_gemm(GroupedGemm kind) {
    return grouped(kind, core::shared_gemm_operands(v, kind, shared, targets), core::shared_expert_shape(v.s),
                   core::shared_schedule(v.s, shared, v.tokens), core::shared_periods(v.s), core::shared_window(v.s));
  }
  // One grouped GEMM: every expert's problem of `kind` over the window, as the GPU's launcher is given it.
  bool grouped(GroupedGemm kind, const core::SplitGemmOperands& ops, const core::LayerShape& s,
               const core::Schedule& sched, const core::RowPeriods& periods, core::RowWindow w) {
    core::GroupedLayout l = core::grouped_layout(s, kind);
    CHECK_MSG(core::window_fits(kind, periods, w), "a %s window the GPU's launcher would refuse",
              core::split_step_name(core::SplitStep::gemm));
    for (int e = 0; e < s.experts_per_rank; ++e) {
      core::GroupedProblem pr = core::grouped_problem(s, sched, kind, periods, w, e);
      if (pr.m == 0) continue;
      multiply(pr, l, ops, ops.result == SplitResult::add_source_bf16 ? ops.c_fp32 : nullptr);
      for (int i = 0; i < pr.m; ++i)
        for (int j = 0; j < pr.n; ++j) {
          int64_t at = pr.c + i * l.ldc + j;
          float value = product[static_cast<size_t>(i) * pr.n + j];
          switch (ops.result) {
            case SplitResult::store_bf16:
            case SplitResult::add_source_bf16: ops.d[at] = core::float_to_bf16(value); break;
            case SplitResult::store_f32: ops.d_fp32[at] = value; break;
            case SplitResult::accumulate_f32: ops.d_fp32[at] = core::add_rn(ops.d_fp32[at], value); break;
          }
        }
    }
    return true;
  }
};

// The view's row buffers filled with bf16 NaN (in MXFP8 mode x's and dy's codes and every scale with e4m3 and e8m0
// NaN, all bits set: the bf16 rings of g, u and h hold their codes): what the split pass reads there it must have
// written itself.
void poison_rings(const core::PassView& v) {
  const core::LayerShape& s = v.s;
  int64_t ring = s.macrobatch, h = s.hidden, in = s.intermediate;
  std::vector<std::pair<core::bf16_t*, int64_t>> rings = {
      {v.ring_g, ring * in}, {v.ring_u, ring * in}, {v.ring_h, ring * in}, {v.ring_y, core::out_ring_rows(s) * h}};
  if (s.mxfp8) {  // x's and dy's codes both ways, and every scale
    for (const core::MxRing* mx : {&v.mx_x, &v.mx_dy}) {
      std::fill(mx->rows, mx->rows + ring * h, uint8_t{0xff});
      std::fill(mx->tokens, mx->tokens + ring * h, uint8_t{0xff});
      std::fill(mx->row_scales, mx->row_scales + core::mx_row_scale_bytes(s, s.hidden), uint8_t{0xff});
      std::fill(mx->token_scales, mx->token_scales + core::mx_token_scale_bytes(s, s.hidden), uint8_t{0xff});
    }
    for (const core::MxRing* mx : {&v.mx_g, &v.mx_u, &v.mx_h}) {
      std::fill(mx->row_scales, mx->row_scales + core::mx_row_scale_bytes(s, s.intermediate), uint8_t{0xff});
      std::fill(mx->token_scales, mx->token_scales + core::mx_token_scale_bytes(s, s.intermediate), uint8_t{0xff});
    }
  } else {
    rings.insert(rings.end(), {{v.ring_x, ring * h}, {v.ring_dy, ring * h}});
  }
  for (auto [rows, width] : rings) std::fill(rows, rows + width, core::bf16_t{0xffff});
  if (s.shared_intermediate > 0)
    std::fill(v.shared_out, v.shared_out + static_cast<int64_t>(v.tokens) * h, core::bf16_t{0xffff});
}

// The home slots of this rank's tokens (y or dx per (token, k)) filled likewise: the home sums must read only
// what this pass's combines pushed there.
void poison_slots(const core::PassView& v, int tokens) {
  size_t slots = core::is_backward(v.kind) ? v.peer.dx_slots : v.peer.y_slots;
  core::bf16_t* first = core::peer_array<core::bf16_t>(v, v.s.rank, slots);
  std::fill(first, first + static_cast<int64_t>(tokens) * v.s.top_k * v.s.hidden, core::bf16_t{0xffff});
}

// Every rank's memory: the host executor's pass runs over it first, then the split pass.
struct Group {
  const ref::Problem& p;
  const Knobs& k;
  mokLayerSizes_t sizes;
  std::vector<std::unique_ptr<AlignedBuffer>> peers, work;
  std::vector<void*> bases, workspaces;

  std::vector<MxWeights> mx;  // MXFP8 mode: each rank's weights as the host executor's run quantises them

  Group(const ref::Problem& problem, const Knobs& knobs)
      : p(problem), k(knobs), sizes(sizes_for(p, k)), mx(static_cast<size_t>(problem.world)) {
    for (int r = 0; r < p.world; ++r) {
      mokLayerWeights_t unused = MOK_LAYER_WEIGHTS_INIT;
      if (p.mxfp8) mx[static_cast<size_t>(r)].wire(p, r, unused);
      peers.emplace_back(new AlignedBuffer(sizes.peer_bytes));
      work.emplace_back(new AlignedBuffer(sizes.workspace_bytes));
      bases.push_back(peers.back()->p);
      workspaces.push_back(work.back()->p);
    }
  }

  Outputs host() { return run_layer_over(p, k, bases.data(), workspaces.data(), sizes.workspace_bytes); }

  // Rank r's view of a pass of `kind` over the memory the host executor left: its schedule, staged inputs, rings.
  core::PassView view(int r, PassKind kind, const core::PassArgs* args, core::PeerHeader* const* headers,
                      core::ErrorRecord* error) const {
    core::LayerShape s = shape_of(config_for(p, k, r));
    core::PassView v =
        core::pass_view_at(s, kind, static_cast<char*>(workspaces[r]), reinterpret_cast<char* const*>(bases.data()),
                           headers, nullptr, p.tokens[r], 0, 0, error);
    v.sched.total_rows = core::schedule_rows(s, v.sched);
    // The split executor's workspace holds none of what only core's workers use (core::PassForm::split): null here
    // too, so that a split step using one faults in this test.
    v.slots = v.scratch = v.sums = nullptr, v.chunk = nullptr, v.acc = core::Accumulators{};
    v.scratch_floats = v.chunk_values = v.sums_floats = 0;
    v.w = core::LayerWeights{};
    v.w.gate = p.gate[r].data();
    v.w.up = p.up[r].data();
    v.w.down = p.down[r].data();
    std::array<const uint16_t*, 3> biases = problem_biases(p, r);  // as the host executor's run takes them
    v.w.gate_bias = biases[0], v.w.up_bias = biases[1], v.w.down_bias = biases[2];
    if (p.mxfp8) {  // the forward's rowwise forms, the backward's colwise ones
      const MxWeights& m = mx[static_cast<size_t>(r)];
      core::MxWeight* forms[6] = {&v.w.gate_rowwise, &v.w.gate_colwise, &v.w.up_rowwise,
                                  &v.w.up_colwise,   &v.w.down_rowwise, &v.w.down_colwise};
      for (int i = 0; i < 6; ++i) *forms[i] = core::MxWeight{m.data[i].data(), m.scales[i].data()};
    }
    if (p.shared_inter > 0) {
      v.w.shared_gate = p.sgate[r].data();
      v.w.shared_up = p.sup[r].data();
      v.w.shared_down = p.sdown[r].data();
      if (p.gated) v.w.shared_router = p.srouter[r].data();
    }
    v.args = args;
    v.sigmoid_table = sigmoid_table();
    return v;
  }

  // The split pass of `kind` on every rank (each on its own thread); weight gradients added into main_grad
  // that starts at k.main_grad_start, or without k.accumulate bf16 of the pass's own fp32 sums (NaN before).
  // block_scaled: in MXFP8 the block-scaled kinds so (SM100); false: dequantised, as on sm_90a.
  std::vector<SplitOutputs> split(PassKind kind, bool reverse = false, bool block_scaled = true) {
    int W = p.world;
    std::vector<SplitOutputs> outputs(static_cast<size_t>(W));
    std::vector<core::PeerHeader*> headers;
    for (void* b : bases) headers.push_back(static_cast<core::PeerHeader*>(b));
    ThreadBarrier barrier(W);
    for (int r = 0; r < W; ++r) {  // before any rank's combine can write into them
      core::ErrorRecord unused{};
      poison_slots(view(r, kind, nullptr, headers.data(), &unused), p.tokens[r]);
    }
    each_rank(W, [&](int r) {
      SplitOutputs& o = outputs[static_cast<size_t>(r)];
      core::ErrorRecord error{};
      core::PassArgs args{};
      core::PassView v = view(r, kind, &args, headers.data(), &error);
      if (kind != PassKind::backward_kept) poison_rings(v);  // a step left out cannot pass on the host's bytes
      size_t eih = static_cast<size_t>(p.experts) * p.inter * p.hidden;
      size_t sih = static_cast<size_t>(p.shared_inter) * p.hidden;
      for (auto* m : {&o.main_gate, &o.main_up, &o.main_down}) m->assign(eih, k.main_grad_start);
      for (auto* m : {&o.main_sgate, &o.main_sup, &o.main_sdown}) m->assign(sih, k.main_grad_start);
      o.main_srouter.assign(p.gated ? static_cast<size_t>(p.hidden) : 0, k.main_grad_start);
      ExtrasBlock extras(v.s);
      float* main_grad[core::kGradientSums] = {o.main_gate.data(),   o.main_up.data(),  o.main_down.data(),
                                               o.main_sgate.data(),  o.main_sup.data(), o.main_sdown.data(),
                                               o.main_srouter.data()};
      // without main_grad: the pass's own fp32 sums (NaN in the block), which it must zero first
      core::SplitTargets targets = core::split_targets(extras.buffers, main_grad, !k.accumulate);
      core::SplitGradients grads{};
      if (!k.accumulate) {
        for (auto* g : {&o.dgate, &o.dup, &o.ddown}) g->assign(eih, 0xffff);
        for (auto* g : {&o.dsgate, &o.dsup, &o.dsdown}) g->assign(sih, 0xffff);
        o.dsrouter.assign(o.main_srouter.size(), 0xffff);
        grads = core::SplitGradients{
            o.dgate.data(),    o.dup.data(), o.ddown.data(), o.dsgate.data(), o.dsup.data(), o.dsdown.data(),
            o.dsrouter.data(), nullptr,      nullptr,        nullptr,         false};
      }
      if (core::is_backward(kind)) {  // as the host's: bf16, or added into fp32 from its start
        std::vector<float>* main[3] = {&o.main_bgate, &o.main_bup, &o.main_bdown};
        std::vector<uint16_t>* bf16[3] = {&o.dbgate, &o.dbup, &o.dbdown};
        void** into[3] = {&grads.gate_bias, &grads.up_bias, &grads.down_bias};
        bias_gradient_buffers(p, r, k.accumulate, k.main_grad_start, main, bf16, into);
        grads.bias_accumulate = k.accumulate;
      }
      HostSteps steps{
          v,     targets, p,  r, barrier, o, reverse, block_scaled, extras.buffers.dequantised, extras.buffers.shared,
          grads, {},      {}, {}};
      steps.staging.assign(std::max(core::mx_staging_values(v.s), core::mx_swiglu_staging_values(v.s)) + 1, 0);
      core::RowPeriods periods = core::ring_periods(v.s);
      bool gated = v.w.shared_router != nullptr;
      core::SplitCall call = core::split_call(v, grads, block_scaled);
      CHECK_MSG(call.gated == gated && call.bf16_gradients == (core::is_backward(kind) && !k.accumulate),
                "split_call misreads the call");
      std::vector<core::SplitLaunch> launches(static_cast<size_t>(core::split_plan(v.s, kind, periods, call, nullptr)));
      CHECK(core::split_plan(v.s, kind, periods, call, launches.data()) == static_cast<int64_t>(launches.size()));
      int64_t ran = core::run_split_pass(launches.data(), static_cast<int64_t>(launches.size()), steps);
      CHECK_MSG(ran == static_cast<int64_t>(launches.size()), "rank %d: launch %lld (%s) stopped the split pass", r,
                static_cast<long long>(ran), core::split_step_name(launches[static_cast<size_t>(ran)].step));
      if (!core::is_backward(kind)) {  // the plan's barrier has passed: every peer's pushes are in
        o.slots.assign(static_cast<size_t>(p.tokens[r]) * p.top_k * p.hidden, 0xffff);
        for (int t = 0; t < p.tokens[r]; ++t) core::copy_slots_token(v, t, o.slots.data());  // as mokLayerGetSlots
      }
    });
    return outputs;
  }
};

void check_bits(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, const char* what, int r) {
  CHECK_MSG(got.size() == want.size(), "%s rank %d: %zu values, host %zu", what, r, got.size(), want.size());
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (got[i] != want[i]) {
      CHECK_MSG(false, "%s rank %d [%zu]: split %04x, host %04x", what, r, i, got[i], want[i]);
      return;
    }
}

// fp32 values: bitwise, or with `fp32_bound` > 0 within it relative to the largest |value - start| (below).
void check_floats(const std::vector<float>& got, const std::vector<float>& want, const char* what, int r,
                  double fp32_bound = 0, float start = 0) {
  CHECK_MSG(got.size() == want.size(), "%s rank %d: %zu values, host %zu", what, r, got.size(), want.size());
  double scale = 0;
  for (float x : want) scale = std::max(scale, std::fabs(static_cast<double>(x) - start));
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    bool same = std::memcmp(&got[i], &want[i], sizeof(float)) == 0;
    if (same || (fp32_bound > 0 && std::fabs(static_cast<double>(got[i]) - want[i]) <= fp32_bound * scale)) continue;
    CHECK_MSG(false, "%s rank %d [%zu]: split %.9g, host %.9g (bound %g of %g)", what, r, i, got[i], want[i],
              fp32_bound, scale);
    return;
  }
}

// bf16 values: bitwise, or (not `exact`) each within 2^-7 of the largest |value|: fp32 sums grouped differently
// (within 2^-16 of it, above) move a bf16 rounding by at most one unit, at most 2^-7 of a value.
void check_bf16(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, const char* what, int r,
                bool exact) {
  if (exact) return check_bits(got, want, what, r);
  CHECK_MSG(got.size() == want.size(), "%s rank %d: %zu values, host %zu", what, r, got.size(), want.size());
  double scale = 0;
  for (uint16_t x : want) scale = std::max(scale, std::fabs(static_cast<double>(core::bf16_to_float(x))));
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    double g = core::bf16_to_float(got[i]), w = core::bf16_to_float(want[i]);
    if (std::fabs(g - w) <= std::ldexp(scale, -7)) continue;  // false for a NaN the pass left
    CHECK_MSG(false, "%s rank %d [%zu]: split %04x, host %04x (scale %g)", what, r, i, got[i], want[i], scale);
    return;
  }
}

// A backward without main_grad: bf16 weight gradients of the pass's own sums, which it zeroes first (NaN before).
void check_bf16_gradients(const ref::Problem& p, Knobs k, bool one_window, bool block_scaled) {
  k.accumulate = false;
  Group bf16(p, k);
  Outputs host = bf16.host();
  for (int r = 0; r < p.world; ++r)
    CHECK_MSG(host.status[r] == mokSuccess, "host rank %d: %s", r, host.detail[r].c_str());
  bf16.split(PassKind::forward, false, block_scaled);
  std::vector<SplitOutputs> split = bf16.split(PassKind::backward, false, block_scaled);
  for (int r = 0; r < p.world; ++r) {
    std::printf("  bf16-gradient backward rank %d\n", r);
    check_bits(split[r].dx, host.dx[r], "dx", r);
    check_bf16(split[r].dgate, host.dgate[r], "dgate", r, one_window);
    check_bf16(split[r].dup, host.dup[r], "dup", r, one_window);
    check_bf16(split[r].ddown, host.ddown[r], "ddown", r, one_window);
    if (!p.bgate.empty()) {  // one sum per expert from 0, rows in canonical order window after window: the host's
      check_bits(split[r].dbgate, host.dbgate[r], "dgate_bias", r);
      check_bits(split[r].dbup, host.dbup[r], "dup_bias", r);
      check_bits(split[r].dbdown, host.dbdown[r], "ddown_bias", r);
    }
    if (p.shared_inter == 0) continue;
    check_bits(split[r].dsgate, host.dsgate[r], "dshared_gate", r);
    check_bits(split[r].dsup, host.dsup[r], "dshared_up", r);
    check_bits(split[r].dsdown, host.dsdown[r], "dshared_down", r);
    if (p.gated) check_bits(split[r].dsrouter, host.dsrouter[r], "dshared_router", r);
  }
}

// The forward's y slots, and a recompute's (which rebuilds them alone: no shared expert, no home sums) over slots
// NaN-filled first, each the host executor's forward's bitwise (mokLayerGetSlots).
void check_recompute(Group& group, const Outputs& host, bool block_scaled) {
  std::vector<SplitOutputs> forward = group.split(PassKind::forward, false, block_scaled),
                            recompute = group.split(PassKind::recompute, false, block_scaled);
  for (int r = 0; r < group.p.world; ++r) {
    check_bits(forward[r].slots, host.slots[r], "forward y slots", r);
    check_bits(recompute[r].slots, host.slots[r], "recompute y slots", r);
  }
}

// One problem: the host's forward, the split forward over its memory; the host's forward and backward, then the
// split forward, backward and (where the ring keeps every row) kept backward over theirs. In MXFP8 `block_scaled`
// runs the block-scaled kinds so (SM100: the forward's, dgrad_h), else over dequantised operands (sm_90a).
void check_case(const Spec& spec, Knobs k, uint64_t seed, bool block_scaled = true) {
  std::mt19937_64 rng(seed);
  ref::Problem p = make_problem(spec, rng);
  k.accumulate = true;  // the split pass adds weight gradients into fp32 main_grad (docs/gpu.md)
  k.backward = false;
  Group forward_only(p, k);
  Outputs host = forward_only.host();
  for (int r = 0; r < p.world; ++r)
    CHECK_MSG(host.status[r] == mokSuccess, "host rank %d: %s", r, host.detail[r].c_str());
  std::vector<SplitOutputs> split = forward_only.split(PassKind::forward, false, block_scaled);
  for (int r = 0; r < p.world; ++r) check_bits(split[r].out, host.out[r], "forward out", r);
  check_recompute(forward_only, host, block_scaled);

  k.backward = true;
  Group both(p, k);
  host = both.host();
  for (int r = 0; r < p.world; ++r)
    CHECK_MSG(host.status[r] == mokSuccess, "host rank %d: %s", r, host.detail[r].c_str());
  mokLayerConfig_t c0 = config_for(p, k, 0);
  core::LayerShape s = shape_of(c0);
  // An expert whose rows span ring windows gets its weight gradient as (main_grad + P_1) + P_2 ..., the host as
  // main_grad + (P_1 + P_2 ...): the same products, grouped differently, each fp32 addition rounding by at most
  // 2^-24 of its running sum. Measured: at most 1.2e-7 of the largest |main_grad - start| (three runs of every
  // case); the bound 2^-16 (1.5e-5) leaves 100x. A wrong row, operand or window moves a gradient by the order
  // of that largest value itself.
  bool one_window = core::max_recv_rows(s) <= s.macrobatch;
  double bound = one_window ? 0 : std::ldexp(1.0, -16);
  for (PassKind kind : {PassKind::backward, PassKind::backward_kept}) {
    if (kind == PassKind::backward_kept && !core::split_keeps_ring(s, core::ring_periods(s))) continue;
    split = both.split(PassKind::forward, false, block_scaled);  // the ring holds the forward's x, g and u again
    for (int r = 0; r < p.world; ++r) check_bits(split[r].out, host.out[r], "forward out (again)", r);
    split = both.split(kind, false, block_scaled);
    const char* name = kind == PassKind::backward ? "backward" : "kept backward";
    for (int r = 0; r < p.world; ++r) {
      std::printf("  %s rank %d\n", name, r);
      check_bits(split[r].dx, host.dx[r], "dx", r);
      check_floats(split[r].dw, host.dw[r], "dw", r);
      check_floats(split[r].main_gate, host.main_gate[r], "main_grad gate", r, bound, k.main_grad_start);
      check_floats(split[r].main_up, host.main_up[r], "main_grad up", r, bound, k.main_grad_start);
      check_floats(split[r].main_down, host.main_down[r], "main_grad down", r, bound, k.main_grad_start);
      if (!p.bgate.empty()) {  // the whole pass's sum added once, as the host adds it
        check_floats(split[r].main_bgate, host.main_bgate[r], "main_grad gate bias", r);
        check_floats(split[r].main_bup, host.main_bup[r], "main_grad up bias", r);
        check_floats(split[r].main_bdown, host.main_bdown[r], "main_grad down bias", r);
      }
      if (p.shared_inter == 0) continue;
      // The shared expert's: one window of every token, one sum from 0 in token order, as the host's: bitwise.
      check_floats(split[r].main_sgate, host.main_sgate[r], "main_grad shared gate", r);
      check_floats(split[r].main_sup, host.main_sup[r], "main_grad shared up", r);
      check_floats(split[r].main_sdown, host.main_sdown[r], "main_grad shared down", r);
      if (p.gated) check_floats(split[r].main_srouter, host.main_srouter[r], "main_grad shared router", r);
    }
  }
  check_bf16_gradients(p, k, one_window, block_scaled);
}

template <class T>
double normwise(const std::vector<T>& got, const std::vector<T>& want, double start = 0) {
  return got.size() == want.size() ? core::normwise_difference(got.data(), want.data(), want.size(), start) : NAN;
}

Spec spec_of(int world, Routing routing) {
  Spec spec;
  spec.world = world;
  spec.experts = 3;
  spec.hidden = 24;
  spec.inter = 16;
  spec.top_k = 2;
  spec.max_tokens = 9;
  spec.routing = routing;
  return spec;
}

}  // namespace

// Rings that turn inside a pass (macrobatch below the worst case) and rings that hold every row.
TEST(split_pass_gives_the_host_executors_bytes) {
  for (int world : {1, 2, 3})
    for (Routing routing : {Routing::uniform, Routing::one_expert, Routing::empty_experts, Routing::minus_one})
      for (int macrobatch : {16, 256}) {
        Spec spec = spec_of(world, routing);
        Knobs k;
        k.padding = 8;
        k.minibatch = 8;
        k.macrobatch = macrobatch;
        std::printf("world %d routing %d macrobatch %d\n", world, static_cast<int>(routing), macrobatch);
        check_case(spec, k, seed() + static_cast<uint64_t>(world * 100 + macrobatch + static_cast<int>(routing)));
      }
}

// The variants the split pass's row steps carry: swiglu_oai with a clamp, the input-side routing scale, a rank
// with no tokens.
TEST(split_pass_variants) {
  Spec spec = spec_of(2, Routing::uniform);
  spec.alpha = 1.702;
  spec.limit = 0.75;
  Knobs k;
  check_case(spec, k, seed() + 1);
  spec = spec_of(2, Routing::uniform);
  spec.input_scale = true;
  check_case(spec, k, seed() + 2);
  spec = spec_of(3, Routing::uniform);
  spec.empty_rank = 1;
  check_case(spec, k, seed() + 3);
}

// The shared expert (its own GEMMs over a one-expert schedule of the rank's tokens): narrower and wider than the
// hidden size, gated by a router (Qwen2-MoE) with its gradient, with a rank that holds no token and ranks of
// several chunks; a ring that turns, and one that keeps every row (the kept backward).
TEST(split_pass_shared_expert) {
  for (int shared_inter : {16, 40})
    for (bool gated : {false, true}) {
      int macrobatch = gated ? 256 : 32;
      Spec spec = spec_of(3, Routing::uniform);
      spec.shared_inter = shared_inter;
      spec.gated = gated;
      spec.max_tokens = 21;
      spec.empty_rank = 2;
      Knobs k;
      k.padding = 8;
      k.minibatch = 8;
      k.macrobatch = macrobatch;
      std::printf("shared %d gated %d macrobatch %d\n", shared_inter, gated, macrobatch);
      check_case(spec, k, seed() + static_cast<uint64_t>(10 + shared_inter + gated));
    }
}

// MXFP8: dispatch quantises x (and dy) into the ring's codes and scales; on SM100 the block-scaled gate, up, down and
// dgrad_h GEMMs read them through each group's own scale layout (grouped_mx_problem, as CUTLASS is given it), and
// every other GEMM (the backward's others; all of them with `block_scaled` false, as on sm_90a) is the BF16 one over
// the operands a dequantise step wrote (split_dequantise.hpp); SwiGLU writes h's codes (and the backward's dg, du, h
// both ways) into the bf16 rings' bytes. out, the y slots, dx and dw are the host executor's bitwise, the weight
// gradients as in BF16. Tiles of 128 rows and whole 32-code blocks (split_supports); H of 3 blocks and I of 1, so each
// scale row's 4-block tile has padding blocks, which the MMA reads; rings that turn and one that holds every row; a
// shared expert (bf16 in both precisions).
void check_mx_case(const Spec& spec, int macrobatch, uint64_t seed, bool block_scaled) {
  Knobs k;
  k.padding = 128;
  k.minibatch = 128;
  k.macrobatch = macrobatch;
  std::mt19937_64 rng(seed);
  core::LayerShape s = shape_of(config_for(make_problem(spec, rng), k, 0));
  CHECK_MSG(core::split_supports(s), "an MXFP8 layer refused");
  check_case(spec, k, seed, block_scaled);
}

TEST(split_pass_mxfp8) {
  for (bool block_scaled : {true, false})
    for (int world : {1, 2, 3})
      for (Routing routing : {Routing::uniform, Routing::one_expert, Routing::empty_experts, Routing::minus_one})
        for (int macrobatch : {128, 512}) {
          Spec spec = spec_of(world, routing);
          spec.mxfp8 = true;
          spec.hidden = 96;
          spec.inter = 32;
          std::printf("MXFP8 %s world %d routing %d macrobatch %d\n", block_scaled ? "block-scaled" : "dequantised",
                      world, static_cast<int>(routing), macrobatch);
          check_mx_case(spec, macrobatch,
                        seed() + static_cast<uint64_t>(500 + world * 100 + macrobatch + static_cast<int>(routing)),
                        block_scaled);
        }
  Spec spec = spec_of(2, Routing::uniform);
  spec.mxfp8 = true;
  spec.hidden = 64;
  spec.inter = 32;
  spec.shared_inter = 40;
  spec.gated = true;
  spec.alpha = 1.702;
  spec.limit = 0.75;
  std::printf("MXFP8 with a gated shared expert, swiglu_oai\n");
  check_mx_case(spec, 128, seed() + 900, true);
  check_mx_case(spec, 128, seed() + 901, false);
}

// Expert biases (gpt-oss): gate, up and down write their fp32 products and the add_bias steps add each row's expert's
// bias before the one rounding; the backward sums each bias gradient down the expert's rows in canonical order, window
// after window (bias_gradients), zeroed first and written last: out, dx, dw and the bias gradients the host
// executor's bitwise, bf16 or added into fp32; in BF16 and MXFP8 (block-scaled or not: a biased forward GEMM always
// reads dequantised operands, the block-scaled unit writing bf16), rings that turn and that hold every row, with
// swiglu_oai's clamp.
TEST(split_pass_expert_biases) {
  for (int world : {1, 3})
    for (int macrobatch : {16, 256}) {
      Spec spec = spec_of(world, Routing::uniform);
      spec.bias = true;
      Knobs k;
      k.padding = 8;
      k.minibatch = 8;
      k.macrobatch = macrobatch;
      std::printf("biases world %d macrobatch %d\n", world, macrobatch);
      check_case(spec, k, seed() + static_cast<uint64_t>(1200 + world * 10 + macrobatch));
    }
  // Many rows per expert (hundreds, in 8-row tiles over 64-row windows): fp32 sums long enough that their order shows.
  Spec many = spec_of(1, Routing::uniform);
  many.bias = true, many.experts = 2, many.max_tokens = 200;
  Knobs windows;
  windows.padding = 8, windows.minibatch = 8, windows.macrobatch = 64;
  std::printf("biases over many rows\n");
  check_case(many, windows, seed() + 1250);
  Spec oai = spec_of(2, Routing::empty_experts);
  oai.bias = true, oai.alpha = 1.702, oai.limit = 0.75;
  std::printf("biases with swiglu_oai\n");
  check_case(oai, Knobs{}, seed() + 1300);
  for (int mask : {1, 2, 4, 5, 6}) {  // each bias on its own, and pairs: only those given, and only their gradients
    Spec some = spec_of(2, Routing::uniform);
    some.bias = true, some.bias_mask = mask;
    std::printf("biases %d of gate 1, up 2, down 4\n", mask);
    check_case(some, Knobs{}, seed() + static_cast<uint64_t>(1350 + mask));
  }
  for (bool block_scaled : {true, false})
    for (int macrobatch : {128, 512}) {
      Spec spec = spec_of(2, Routing::uniform);
      spec.mxfp8 = true, spec.bias = true, spec.hidden = 96, spec.inter = 32;
      std::printf("MXFP8 %s biases macrobatch %d\n", block_scaled ? "block-scaled" : "dequantised", macrobatch);
      check_mx_case(spec, macrobatch, seed() + static_cast<uint64_t>(1400 + macrobatch + block_scaled), block_scaled);
    }
}

// The layers the split pass computes (core::split_supports): every GEMM width (H, I, I_s) a multiple of 8 (16-byte
// rows); in MXFP8 H and I whole 32-code blocks and expert_padding of 128-row tiles. Each rule broken alone is refused.
// And which GEMMs read dequantised operands (core::split_dequantises): none in BF16; in MXFP8 all but the forward's
// on SM100 without a bias, all without block-scaled MMA.
TEST(split_supports_layers_of_16_byte_rows_and_mxfp8_tiles) {
  core::LayerShape s{};
  s.hidden = 24, s.intermediate = 16, s.shared_intermediate = 40, s.expert_padding = 8;
  CHECK(core::split_supports(s));
  for (int* width : {&s.hidden, &s.intermediate, &s.shared_intermediate}) {
    *width += 4;  // 8 bytes off a 16-byte row
    CHECK_MSG(!core::split_supports(s), "H %d, I %d, I_s %d accepted", s.hidden, s.intermediate, s.shared_intermediate);
    *width -= 4;
  }
  core::LayerShape mx = s;
  mx.mxfp8 = 1;
  mx.hidden = 64, mx.intermediate = 32, mx.expert_padding = 256;
  CHECK(core::split_supports(mx));
  for (int* width : {&mx.hidden, &mx.intermediate})
    for (int off : {8, 16}) {  // 16-byte rows, but not whole 32-code blocks
      *width += off;
      CHECK_MSG(!core::split_supports(mx), "MXFP8 H %d, I %d accepted", mx.hidden, mx.intermediate);
      *width -= off;
    }
  mx.shared_intermediate = 8;  // the shared expert is bf16 in both precisions
  CHECK(core::split_supports(mx));
  for (int padding : {32, 64, 96, 160, 384 - 32}) {
    mx.expert_padding = padding;
    CHECK_MSG(!core::split_supports(mx), "MXFP8 expert_padding %d accepted", padding);
  }
  mx.expert_padding = 128;
  CHECK(core::split_supports(mx));
  for (int g = 0; g < static_cast<int>(GroupedGemm::count); ++g) {
    auto kind = static_cast<GroupedGemm>(g);
    bool scaled = kind == GroupedGemm::gate || kind == GroupedGemm::up || kind == GroupedGemm::down ||
                  kind == GroupedGemm::dgrad_h;
    for (bool biased : {false, true}) {
      CHECK_MSG(!core::split_dequantises(s, kind, true, biased) && !core::split_dequantises(s, kind, false, biased),
                "BF16 kind %d", g);
      CHECK_MSG(core::split_dequantises(mx, kind, true, biased) == (!scaled || biased), "MXFP8 kind %d on SM100", g);
      CHECK_MSG(core::split_dequantises(mx, kind, false, biased), "MXFP8 kind %d without block-scaled MMA", g);
    }
  }
  s.shared_intermediate = 0;  // no shared expert
  CHECK(core::split_supports(s));
}

// What an executor must hold (core::split_buffers_complete, enqueue_split_pass's bad_device): from buffers that hold
// everything, each pointer nulled in turn is refused exactly where the pass of that kind and call would use it.
// Each refusal names the buffer (split_missing_buffer), as the cuda executor's error says it.
TEST(split_buffers_complete_refuses_each_buffer_a_pass_uses) {
  struct Slot {
    const char* name;
    void** at;
    bool used;  // by the pass below
  };
  for (PassKind kind : {PassKind::forward, PassKind::backward})
    for (int shared_inter : {0, 8})
      for (bool gated : {false, true})
        for (int variant = 0; variant < 10; ++variant) {
          // the biases given (gate 1, up 2, down 4), each with its gradient in a backward
          bool bf16 = variant & 1;
          int mask = std::array<int, 5>{0, 1, 2, 4, 7}[variant / 2];
          bool gate_up = mask & 3, down = mask & 4;
          if (gated && shared_inter == 0) continue;
          core::PassView v{};
          v.kind = kind;
          v.s.experts_per_rank = 2, v.s.hidden = 16, v.s.intermediate = 8, v.s.shared_intermediate = shared_inter;
          bool backward = core::is_backward(kind), shared = shared_inter > 0;
          core::SplitCall call{gated, bf16, true, static_cast<uint8_t>(mask), mask != 0 && backward};
          std::vector<char> memory(64);  // every pointer somewhere, none null
          char* any = memory.data();
          core::SplitTargets t{};
          core::SplitGradients g{};
          g.gate_bias = mask & 1 ? any : nullptr, g.up_bias = mask & 2 ? any : nullptr;
          g.down_bias = mask & 4 ? any : nullptr;
          core::SplitShared sh{};
          std::vector<Slot> slots = {
              {"dx_partial", reinterpret_cast<void**>(&t.dx_partial), backward || down},
              {"biased", reinterpret_cast<void**>(&t.biased), gate_up},
              {"bias_gate", reinterpret_cast<void**>(&t.bias_gate), backward && (mask & 1)},
              {"bias_up", reinterpret_cast<void**>(&t.bias_up), backward && (mask & 2)},
              {"bias_down", reinterpret_cast<void**>(&t.bias_down), backward && down},
              {"wgrad_gate", reinterpret_cast<void**>(&t.wgrad_gate), backward},
              {"wgrad_up", reinterpret_cast<void**>(&t.wgrad_up), backward},
              {"wgrad_down", reinterpret_cast<void**>(&t.wgrad_down), backward},
              {"wgrad_shared_gate", reinterpret_cast<void**>(&t.wgrad_shared_gate), backward && shared},
              {"wgrad_shared_up", reinterpret_cast<void**>(&t.wgrad_shared_up), backward && shared},
              {"wgrad_shared_down", reinterpret_cast<void**>(&t.wgrad_shared_down), backward && shared},
              {"wgrad_shared_router", reinterpret_cast<void**>(&t.wgrad_shared_router), backward && gated},
              {"gradients.gate", reinterpret_cast<void**>(&g.gate), backward && bf16},
              {"gradients.up", reinterpret_cast<void**>(&g.up), backward && bf16},
              {"gradients.down", reinterpret_cast<void**>(&g.down), backward && bf16},
              {"gradients.shared_gate", reinterpret_cast<void**>(&g.shared_gate), backward && bf16 && shared},
              {"gradients.shared_up", reinterpret_cast<void**>(&g.shared_up), backward && bf16 && shared},
              {"gradients.shared_down", reinterpret_cast<void**>(&g.shared_down), backward && bf16 && shared},
              {"gradients.shared_router", reinterpret_cast<void**>(&g.shared_router), backward && bf16 && gated},
              {"shared.g", reinterpret_cast<void**>(&sh.g), shared},
              {"shared.u", reinterpret_cast<void**>(&sh.u), shared},
              {"shared.h", reinterpret_cast<void**>(&sh.h), shared},
              {"shared.schedule", reinterpret_cast<void**>(&sh.schedule), shared},
              {"shared.dh", reinterpret_cast<void**>(&sh.dh), shared && backward},
              {"shared.dx_partial", reinterpret_cast<void**>(&sh.dx_partial), shared && backward},
              {"shared.scaled", reinterpret_cast<void**>(&sh.scaled), gated && backward},
              {"shared.dlogit", reinterpret_cast<void**>(&sh.dlogit), gated && backward},
          };
          for (Slot& slot : slots) *slot.at = any;
          CHECK(core::split_buffers_complete(v, call, t, g, sh));
          for (Slot& slot : slots) {
            *slot.at = nullptr;
            CHECK_MSG(core::split_buffers_complete(v, call, t, g, sh) == !slot.used,
                      "%s null: %s (kind %d, I_s %d, gated %d, bf16 gradients %d, biases %d)", slot.name,
                      slot.used ? "accepted" : "refused", static_cast<int>(kind), shared_inter, gated, bf16, mask);
            const char* missing = core::split_missing_buffer(v, call, t, g, sh);
            CHECK_MSG(slot.used ? missing && std::strcmp(missing, slot.name) == 0 : missing == nullptr,
                      "%s null: named '%s'", slot.name, missing ? missing : "(none)");
            *slot.at = any;
          }
        }
}

// The self-test's one_rank stage's problem: one rank, four experts (one with no rows, one hot), H 512, I 256, a shared
// expert of I_s 384, 300 tokens; and its knobs: 128-row tiles, a 256-row ring.
ref::Problem stage_problem(bool gated, bool mxfp8, uint64_t draw, bool bias = false) {
  std::mt19937_64 rng(draw);
  Spec spec = spec_of(1, Routing::uniform);
  spec.experts = 4;
  spec.hidden = 512;
  spec.inter = 256;
  spec.shared_inter = 384;
  spec.gated = gated;
  spec.max_tokens = 300;
  spec.ragged = false;
  spec.mxfp8 = mxfp8;
  spec.bias = bias;
  ref::Problem p = make_problem(spec, rng);
  for (auto& ids : p.ids)
    for (auto& id : ids) id = std::array<int64_t, 8>{0, 0, 0, 0, 1, 1, 3, -1}[rng() % 8];
  return p;
}

Knobs stage_knobs() {
  Knobs k;
  k.padding = 128;
  k.minibatch = 128;
  k.macrobatch = 256;
  return k;
}

// The GPU's GEMMs sum in their own order: the pass with every GEMM summed in reverse stays within
// core::kSplitOrderTolerance of the host's bytes (the bound the self-test's one_rank stage holds a GPU to), at that
// stage's shape and in its three layers: gated with the weight gradients into fp32 main_grad, ungated with bf16
// weight gradients, and the MXFP8 one (gated, main_grad; with `block_scaled` false every GEMM over dequantised
// operands, as on sm_90a). In MXFP8 another order moves a bf16 g, u, dh or dg by a unit where it lies near a rounding
// boundary, and a quantisation can carry that to an e4m3 unit (2^-4 relative) of one value, or to its block's scale
// where the value is the block's largest; the results still stay within the bound.
void check_reversed_order(bool gated, bool bf16_gradients, bool mxfp8 = false, bool block_scaled = true,
                          bool bias = false) {
  ref::Problem p = stage_problem(gated, mxfp8, seed() + 7 + gated + 2 * mxfp8 + 4 * bias, bias);
  Knobs k = stage_knobs();
  k.accumulate = !bf16_gradients;
  Group group(p, k);
  Outputs host = group.host();
  CHECK_MSG(host.status[0] == mokSuccess, "host: %s", host.detail[0].c_str());
  std::vector<SplitOutputs> fwd = group.split(PassKind::forward, true, block_scaled),
                            bwd = group.split(PassKind::backward, true, block_scaled);
  const SplitOutputs &f = fwd[0], &b = bwd[0];
  std::vector<std::pair<const char*, double>> errors = {
      {"out", normwise(f.out, host.out[0])}, {"dx", normwise(b.dx, host.dx[0])}, {"dw", normwise(b.dw, host.dw[0])}};
  if (bf16_gradients) {
    errors.insert(errors.end(), {{"dW_gate", normwise(b.dgate, host.dgate[0])},
                                 {"dW_up", normwise(b.dup, host.dup[0])},
                                 {"dW_down", normwise(b.ddown, host.ddown[0])},
                                 {"dW_shared_gate", normwise(b.dsgate, host.dsgate[0])},
                                 {"dW_shared_up", normwise(b.dsup, host.dsup[0])},
                                 {"dW_shared_down", normwise(b.dsdown, host.dsdown[0])}});
    if (gated) errors.push_back({"dW_shared_router", normwise(b.dsrouter, host.dsrouter[0])});
  } else {
    double start = k.main_grad_start;
    errors.insert(errors.end(), {{"dW_gate", normwise(b.main_gate, host.main_gate[0], start)},
                                 {"dW_up", normwise(b.main_up, host.main_up[0], start)},
                                 {"dW_down", normwise(b.main_down, host.main_down[0], start)},
                                 {"dW_shared_gate", normwise(b.main_sgate, host.main_sgate[0], start)},
                                 {"dW_shared_up", normwise(b.main_sup, host.main_sup[0], start)},
                                 {"dW_shared_down", normwise(b.main_sdown, host.main_sdown[0], start)}});
    if (gated) errors.push_back({"dW_shared_router", normwise(b.main_srouter, host.main_srouter[0], start)});
    if (bias)
      errors.insert(errors.end(), {{"db_gate", normwise(b.main_bgate, host.main_bgate[0], start)},
                                   {"db_up", normwise(b.main_bup, host.main_bup[0], start)},
                                   {"db_down", normwise(b.main_bdown, host.main_bdown[0], start)}});
  }
  double largest = 0;
  for (auto [name, error] : errors) {
    std::printf("  reversed sums (%s%s%s): %s %.3g\n", mxfp8 ? (block_scaled ? "MXFP8, " : "MXFP8 dequantised, ") : "",
                bias ? "biases, " : "", gated ? "gated" : "ungated", name, error);
    CHECK_MSG(error <= core::kSplitOrderTolerance, "%s: %g above %g", name, error, core::kSplitOrderTolerance);
    largest = std::max(largest, error);
  }
  CHECK_MSG(largest > 0, "the reversed order changed no result: this test would not see an order's effect");
}

TEST(another_summation_order_stays_within_the_self_tests_bound) {
  check_reversed_order(true, false);
  check_reversed_order(false, true);
  check_reversed_order(true, false, true, true);
  check_reversed_order(true, false, true, false);
  check_reversed_order(false, false, false, true, true);  // the self-test's biased layer
}

MOK_TEST_MAIN
