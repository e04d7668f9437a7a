// The self-test's one-rank stage (cuda/selftest.hpp): the split executor's pass (cuda/split_device.hpp) of one
// rank's layer on the GPU, forward then backward, against the host executor's bytes. The host executor runs the
// layer first, through the C ABI; its workspace and peer buffer (the schedule, the staged x and dOut) are copied
// to the device, where every ring row and home slot is then filled with bf16 NaN, and the device runs the split
// pass over them, each pass twice. So the stage checks the pass (dispatch, the grouped GEMMs, SwiGLU, combine,
// the shared expert, the home sums, a ring that turns within the pass, both kinds of weight gradient), not the
// schedule build or the staging, which the cuda executor's layer does on the device (the every_gpu and virtual_ranks
// stages). It runs four layers of one shape: a gated shared expert with the weight gradients added into fp32
// main_grad, an ungated one with bf16 weight gradients, one with expert biases and their gradients into fp32
// main_grad, and an MXFP8 one with a gated shared expert and fp32 main_grad (dispatch quantising x and dy, SwiGLU
// quantising h, dg and du; the forward's GEMMs and dgrad_h block-scaled on compute capability 10.x, every other GEMM
// over dequantised operands).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "api/layer_checks.hpp"
#include "core/platform.hpp"
#include "core/split_pass.hpp"
#include "core/split_shared.hpp"
#include "cuda/selftest.hpp"
#include "cuda/split_device.hpp"
#include "cuda/wait.hpp"

#if MOK_WITH_GROUPED_GEMM
#include "cuda/grouped_gemm.hpp"
#endif

namespace mok::cuda {

#if !MOK_WITH_GROUPED_GEMM
mokStatus_t selftest_one_rank(const SelftestSetup&, Text* text) {
  text->add("libmok was built without CUTLASS 4.2's headers, so it has no grouped GEMM (docs/gpu.md)");
  return mokNotCompiled;
}
#else
namespace {

using core::bf16_t;
using core::PassKind;

constexpr float kMainGradStart = 0.5f;  // main_grad holds something before the backward adds to it

// The stage's layers of one shape.
struct Variant {
  bool gated;           // the shared expert scaled by its router (Qwen2-MoE)
  bool bf16_gradients;  // bf16 weight gradients (the split pass's own fp32 sums), else added into fp32 main_grad
  bool mxfp8;           // MXFP8 precision
  bool biases;          // expert biases (gpt-oss's gate, up and down) and their gradients
  const char* name;
};
constexpr Variant kVariants[] = {{true, false, false, false, "gated shared expert, fp32 main_grad"},
                                 {false, true, false, false, "ungated shared expert, bf16 weight gradients"},
                                 {true, false, true, false, "MXFP8, gated shared expert, fp32 main_grad"},
                                 {false, false, false, true, "expert biases, ungated shared expert, fp32 main_grad"}};

// The weight gradients, in core::SplitTargets' order: the routed experts', the shared expert's, its router's; then
// the expert biases' gradients.
constexpr int kGradients = 10;
constexpr const char* kGradientNames[kGradients] = {
    "dW_gate",          "dW_up",   "dW_down", "dW_shared_gate", "dW_shared_up", "dW_shared_down",
    "dW_shared_router", "db_gate", "db_up",   "db_down"};
constexpr int kBiasGradients = 7;  // the first of the bias gradients

size_t gradient_values(const core::LayerShape& s, int i) {
  if (i < 3) return static_cast<size_t>(s.experts_per_rank) * s.hidden * s.intermediate;
  if (i < 6) return static_cast<size_t>(s.shared_intermediate) * s.hidden;
  if (i < kBiasGradients) return static_cast<size_t>(s.hidden);
  return static_cast<size_t>(s.experts_per_rank) * (i < kBiasGradients + 2 ? s.intermediate : s.hidden);
}

// Gradient i is one the layer has (the router's only when gated, the biases' only with biases).
bool has_gradient(const Variant& variant, int i) {
  return i < 6 || (i == 6 && variant.gated) || (i >= kBiasGradients && variant.biases);
}

// One rank, four experts (one hot, one with no rows), a ring of 256 rows that the ~1100 worst-case rows turn
// several times, a shared expert wider than I (Qwen2-MoE's), H, I and I_s multiples of the GEMMs' 16-byte rows.
mokLayerConfig_t stage_config(int timeout_ms) {
  mokLayerConfig_t c = MOK_LAYER_CONFIG_INIT;
  c.world = 1;
  c.rank = 0;
  c.experts_per_rank = 4;
  c.hidden = 512;
  c.intermediate = 256;
  c.shared_intermediate = 384;
  c.top_k = 2;
  c.max_tokens = 300;
  c.expert_padding = 128;
  c.minibatch = 128;
  c.macrobatch = 256;
  c.comm_workers = 1;
  c.compute_workers = 1;
  c.timeout_ms = timeout_ms;
  return c;
}

// The layer's inputs: routes to expert 0 half the time, 1 and 3 a quarter and an eighth, expert 2 never, -1 else.
struct Inputs {
  std::vector<int32_t> ids;
  std::vector<float> topk_weights;
  std::vector<bf16_t> x, dout, gate, up, down;
  std::vector<bf16_t> shared_gate, shared_up, shared_down, shared_router;
  std::vector<bf16_t> bias[3];  // gate's, up's [E, I] and down's [E, H]
  MxWeights mx;                 // gate, up and down quantised
};

Inputs draw(const core::LayerShape& s, std::mt19937_64& rng) {
  Inputs in;
  const int32_t pick[8] = {0, 0, 0, 0, 1, 1, 3, -1};
  size_t routes = static_cast<size_t>(s.max_tokens) * s.top_k, eih = gradient_values(s, 0), sih = gradient_values(s, 3);
  for (size_t i = 0; i < routes; ++i) in.ids.push_back(pick[rng() % 8]);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (size_t i = 0; i < routes; ++i) in.topk_weights.push_back(weight(rng));
  float by_h = 1.0f / std::sqrt(static_cast<float>(s.hidden));
  in.x = random_bf16(static_cast<size_t>(s.max_tokens) * s.hidden, 1.0f, rng);
  in.dout = random_bf16(static_cast<size_t>(s.max_tokens) * s.hidden, 1.0f, rng);
  in.gate = random_bf16(eih, by_h, rng);
  in.up = random_bf16(eih, by_h, rng);
  in.down = random_bf16(eih, 1.0f / std::sqrt(static_cast<float>(s.intermediate)), rng);
  in.shared_gate = random_bf16(sih, by_h, rng);
  in.shared_up = random_bf16(sih, by_h, rng);
  in.shared_down = random_bf16(sih, 1.0f / std::sqrt(static_cast<float>(s.shared_intermediate)), rng);
  in.shared_router = random_bf16(static_cast<size_t>(s.hidden), by_h, rng);
  // Of the order of the GEMMs' outputs (about 0.3 for g and u, 0.05 for y), so each moves every output visibly.
  for (int i = 0; i < 3; ++i)
    in.bias[i] = random_bf16(gradient_values(s, kBiasGradients + i), i < 2 ? 0.5f : 0.1f, rng);
  return in;
}

struct HostBlock {
  void* p = nullptr;
  explicit HostBlock(size_t bytes) : p(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64)) {}
  ~HostBlock() { std::free(p); }
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
};

// A pass's results: out (forward), or dx, dw and the weight gradients (fp32 main_grad, or bf16 values as floats).
struct Results {
  std::vector<bf16_t> out, dx;
  std::vector<float> dw;
  std::vector<float> gradients[kGradients];
};

// What the host executor computed, and the memory it left after each pass (what the device's pass starts from).
struct HostRun {
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  std::vector<char> forward_workspace, forward_peer, backward_workspace, backward_peer;
  Results forward, backward;
};

mokLayerWeights_t weights_of(const Inputs& in, const Variant& variant) {
  mokLayerWeights_t w = MOK_LAYER_WEIGHTS_INIT;
  if (variant.mxfp8) {
    w.gate_rowwise = in.mx.matrix(0), w.gate_colwise = in.mx.matrix(1);
    w.up_rowwise = in.mx.matrix(2), w.up_colwise = in.mx.matrix(3);
    w.down_rowwise = in.mx.matrix(4), w.down_colwise = in.mx.matrix(5);
  } else {
    w.gate = in.gate.data();
    w.up = in.up.data();
    w.down = in.down.data();
  }
  w.shared_gate = in.shared_gate.data();
  w.shared_up = in.shared_up.data();
  w.shared_down = in.shared_down.data();
  w.shared_router = variant.gated ? in.shared_router.data() : nullptr;
  if (variant.biases) w.gate_bias = in.bias[0].data(), w.up_bias = in.bias[1].data(), w.down_bias = in.bias[2].data();
  return w;
}

mokStatus_t run_host(const mokLayerConfig_t& c, const core::LayerShape& s, const Inputs& in, const Variant& variant,
                     HostRun* run, Text* text) {
  auto failed = [&](const char* call) {
    text->add("the host executor's %s failed: %s", call, mokGetLastError());
    return mokInternalError;
  };
  if (mokLayerGetSizes(&c, &run->sizes) != mokSuccess) return failed("mokLayerGetSizes");
  HostBlock workspace(run->sizes.workspace_bytes), peer(run->sizes.peer_bytes);
  void* bases[1] = {peer.p};
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  m.peer_bases = bases;
  m.workspace = workspace.p;
  m.workspace_bytes = run->sizes.workspace_bytes;
  mokLayer_t layer = nullptr;
  if (mokLayerCreate(&c, &m, &layer) != mokSuccess) return failed("mokLayerCreate");
  mokLayerWeights_t w = weights_of(in, variant);
  size_t th = static_cast<size_t>(c.max_tokens) * c.hidden;
  run->forward.out.assign(th, 0);
  run->backward.dx.assign(th, 0);
  run->backward.dw.assign(in.topk_weights.size(), 0.0f);
  std::vector<bf16_t> bf16[kGradients];
  void* into[kGradients] = {};
  for (int i = 0; i < kGradients; ++i) {
    if (!has_gradient(variant, i)) continue;
    if (variant.bf16_gradients) {
      bf16[i].assign(gradient_values(s, i), 0);
      into[i] = bf16[i].data();
    } else {
      run->backward.gradients[i].assign(gradient_values(s, i), kMainGradStart);
      into[i] = run->backward.gradients[i].data();
    }
  }
  mokLayerGrads_t g = MOK_LAYER_GRADS_INIT;
  g.dx = run->backward.dx.data();
  g.dtopk_weights = run->backward.dw.data();
  g.dgate = into[0], g.dup = into[1], g.ddown = into[2];
  g.dshared_gate = into[3], g.dshared_up = into[4], g.dshared_down = into[5], g.dshared_router = into[6];
  g.dgate_bias = into[7], g.dup_bias = into[8], g.ddown_bias = into[9];
  g.accumulate = variant.bf16_gradients ? 0 : 1;
  auto keep = [&](std::vector<char>* local, std::vector<char>* shared) {
    local->assign(static_cast<char*>(workspace.p), static_cast<char*>(workspace.p) + run->sizes.workspace_bytes);
    shared->assign(static_cast<char*>(peer.p), static_cast<char*>(peer.p) + run->sizes.peer_bytes);
  };
  mokStatus_t st = mokLayerBuildSchedule(layer, in.ids.data(), mokIndexInt32, c.max_tokens, nullptr);
  if (st == mokSuccess)
    st = mokLayerForward(layer, &w, in.x.data(), in.topk_weights.data(), run->forward.out.data(), nullptr);
  if (st == mokSuccess) keep(&run->forward_workspace, &run->forward_peer);
  if (st == mokSuccess) st = mokLayerBackward(layer, &w, in.topk_weights.data(), in.dout.data(), &g, nullptr);
  if (st == mokSuccess) keep(&run->backward_workspace, &run->backward_peer);
  for (int i = 0; variant.bf16_gradients && i < kGradients; ++i) run->backward.gradients[i] = as_floats(bf16[i]);
  mokStatus_t result = st == mokSuccess ? mokSuccess : failed("pass");
  mokLayerDestroy(layer);
  return result;
}

// The device's copy of everything a pass reads and writes.
struct Device {
  DeviceBuffers buffers;
  SplitDevice split{};
  char *workspace = nullptr, *peer = nullptr;
  char* host_peers[1] = {};                 // the peer table as the host reads it (the device's is `peers`)
  float* main_grad[kGradients] = {};        // fp32 main_grad
  float* sums[kGradients] = {};             // bf16 gradients: the split pass's own fp32 sums ...
  bf16_t* bf16_gradients[kGradients] = {};  // ... and the gradients it writes from them
  core::ErrorRecord* error = nullptr;
  char** peers = nullptr;
  bf16_t *gate = nullptr, *up = nullptr, *down = nullptr;
  uint8_t* mx_codes[6] = {};   // MXFP8: gate, up and down, each rowwise then colwise (MxWeights' order) ...
  uint8_t* mx_scales[6] = {};  // ... and their scales
  bf16_t *shared_gate = nullptr, *shared_up = nullptr, *shared_down = nullptr, *shared_router = nullptr;
  bf16_t* bias[3] = {};
  float* sigmoid_table = nullptr;
};

template <class T>
cudaError_t upload(DeviceBuffers& b, const std::vector<T>& host, T** device) {
  void* p = nullptr;
  cudaError_t e = b.alloc(host.size() * sizeof(T), &p);
  if (e == cudaSuccess) e = cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  *device = static_cast<T*>(p);
  return e;
}

template <class T>
cudaError_t allocate(DeviceBuffers& b, size_t count, T** device) {
  void* p = nullptr;
  cudaError_t e = b.alloc(count * sizeof(T), &p);
  *device = static_cast<T*>(p);
  return e;
}

// The CUTLASS workspace of the pass's GEMMs on the device (split_device.hpp), worded.
mokStatus_t gemm_workspace_bytes(const core::LayerShape& s, SplitDevice* sd, Text* text) {
  cudaError_t e = cudaSuccess;
  GemmStatus st =
      split_gemm_workspace_bytes(s, static_cast<GemmArchitecture>(sd->architecture), &sd->gemm_workspace_bytes, &e);
  if (st == GemmStatus::cuda_error) return cuda_failed(text, "sizing the grouped GEMMs' workspace", e);
  if (st == GemmStatus::ok) return mokSuccess;
  text->add("sizing the grouped GEMMs' workspace: %s", gemm_status_name(st));
  return mokInternalError;
}

// Every buffer of the variants' passes (s: MXFP8's shape where that variant runs, for its GEMMs' arguments and
// workspace; sizes: the largest of the variants' host layers).
mokStatus_t set_up(const core::LayerShape& s, const Inputs& in, const mokLayerSizes_t& sizes, Device* d, Text* text) {
  DeviceBuffers& b = d->buffers;
  SplitDevice& sd = d->split;
  size_t th = static_cast<size_t>(s.max_tokens) * s.hidden;
  std::vector<float> table(core::kSigmoidTableSize);
  core::fill_sigmoid_table(table.data());  // SwiGLU's sigmoids as the host looks them up: the host's bits
  int64_t ctas = core::max_tiles(s) < 1024 ? core::max_tiles(s) : 1024;
  sd.staging_values =
      static_cast<int64_t>(core::max_value(core::mx_staging_values(s), core::mx_swiglu_staging_values(s)));
  cudaError_t e = cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = allocate(b, sizes.workspace_bytes, &d->workspace);
  if (e == cudaSuccess) e = allocate(b, sizes.peer_bytes, &d->peer);
  if (e == cudaSuccess) e = upload(b, std::vector<char*>{d->peer}, &d->peers);
  if (e == cudaSuccess) e = allocate(b, 1, &d->error);
  if (e == cudaSuccess) e = upload(b, in.gate, &d->gate);
  if (e == cudaSuccess) e = upload(b, in.up, &d->up);
  if (e == cudaSuccess) e = upload(b, in.down, &d->down);
  for (int i = 0; i < 6 && s.mxfp8; ++i) {
    if (e == cudaSuccess) e = upload(b, in.mx.codes[i], &d->mx_codes[i]);
    if (e == cudaSuccess) e = upload(b, in.mx.scales[i], &d->mx_scales[i]);
  }
  if (e == cudaSuccess) e = allocate(b, core::dequantised_a_values(s), &sd.dequantised.a);
  if (e == cudaSuccess) e = allocate(b, core::dequantised_b_values(s), &sd.dequantised.b);
  if (e == cudaSuccess) e = upload(b, in.shared_gate, &d->shared_gate);
  if (e == cudaSuccess) e = upload(b, in.shared_up, &d->shared_up);
  if (e == cudaSuccess) e = upload(b, in.shared_down, &d->shared_down);
  if (e == cudaSuccess) e = upload(b, in.shared_router, &d->shared_router);
  for (int i = 0; i < 3; ++i)
    if (e == cudaSuccess) e = upload(b, in.bias[i], &d->bias[i]);
  if (e == cudaSuccess) e = allocate(b, static_cast<size_t>(s.macrobatch) * s.intermediate, &sd.targets.biased);
  if (e == cudaSuccess) e = upload(b, table, &d->sigmoid_table);
  if (e == cudaSuccess) e = upload(b, in.topk_weights, const_cast<float**>(&sd.topk_weights));
  if (e == cudaSuccess) e = upload(b, in.dout, const_cast<bf16_t**>(&sd.dout));
  if (e == cudaSuccess) e = allocate(b, th, &sd.out);
  if (e == cudaSuccess) e = allocate(b, th, &sd.dx);
  if (e == cudaSuccess) e = allocate(b, in.topk_weights.size(), &sd.dw);
  for (int i = 0; i < kGradients; ++i) {
    if (e == cudaSuccess) e = allocate(b, gradient_values(s, i), &d->main_grad[i]);
    if (e == cudaSuccess) e = allocate(b, gradient_values(s, i), &d->sums[i]);
    if (e == cudaSuccess) e = allocate(b, gradient_values(s, i), &d->bf16_gradients[i]);
  }
  size_t rows = static_cast<size_t>(core::shared_rows(s)), is = static_cast<size_t>(s.shared_intermediate);
  core::SplitShared& sh = sd.shared;
  for (bf16_t** rows_of_width_is : {&sh.g, &sh.u, &sh.h, &sh.dh})
    if (e == cudaSuccess) e = allocate(b, rows * is, rows_of_width_is);
  if (e == cudaSuccess) e = allocate(b, rows * s.hidden, &sh.scaled);
  if (e == cudaSuccess) e = allocate(b, rows, &sh.dlogit);
  if (e == cudaSuccess) e = allocate(b, rows * s.hidden, &sh.dx_partial);
  if (e == cudaSuccess) e = allocate(b, 2, &sh.schedule);
  if (e == cudaSuccess) e = allocate(b, static_cast<size_t>(core::out_ring_rows(s)) * s.hidden, &sd.targets.dx_partial);
  if (e == cudaSuccess) e = allocate(b, static_cast<size_t>(ctas * sd.staging_values) + 1, &sd.staging);
  if (e == cudaSuccess) e = b.alloc(split_gemm_argument_bytes(s), &sd.gemm_arguments);
  if (e != cudaSuccess) return cuda_failed(text, "allocating the layer's device memory", e);
  if (mokStatus_t st = gemm_workspace_bytes(s, &sd, text); st != mokSuccess) return st;
  if ((e = b.alloc(sd.gemm_workspace_bytes, &sd.gemm_workspace)) != cudaSuccess)
    return cuda_failed(text, "allocating the grouped GEMMs' workspace", e);
  sd.ctas = static_cast<int>(ctas);
  sd.stream = b.stream;
  return mokSuccess;
}

// The variant's weight-gradient targets: fp32 main_grad, or the pass's own sums and the bf16 gradients it writes; the
// bias gradients' sums are always the pass's own, written as bf16 or added into fp32.
void aim_gradients(const Variant& variant, Device* d) {
  float* const* t = variant.bf16_gradients ? d->sums : d->main_grad;
  core::SplitTargets& targets = d->split.targets;
  targets.wgrad_gate = t[0], targets.wgrad_up = t[1], targets.wgrad_down = t[2];
  targets.wgrad_shared_gate = t[3], targets.wgrad_shared_up = t[4], targets.wgrad_shared_down = t[5];
  targets.wgrad_shared_router = t[6];
  bf16_t* const* g = d->bf16_gradients;
  d->split.gradients = core::SplitGradients{};
  if (variant.bf16_gradients)
    d->split.gradients =
        core::SplitGradients{g[0], g[1], g[2], g[3], g[4], g[5], g[6], nullptr, nullptr, nullptr, false};
  targets.bias_gate = d->sums[kBiasGradients], targets.bias_up = d->sums[kBiasGradients + 1];
  targets.bias_down = d->sums[kBiasGradients + 2];
  void* const* bias = variant.bf16_gradients ? reinterpret_cast<void* const*>(d->bf16_gradients + kBiasGradients)
                                             : reinterpret_cast<void* const*>(d->main_grad + kBiasGradients);
  core::SplitGradients& gradients = d->split.gradients;
  if (variant.biases) gradients.gate_bias = bias[0], gradients.up_bias = bias[1], gradients.down_bias = bias[2];
  gradients.bias_accumulate = !variant.bf16_gradients;
}

// The pass's view over the device's copy of the host's memory; its rings, home slots, dx's fp32 partial, the shared
// expert's buffers and every output filled with NaN (bf16 or fp32: all bits set), so that what the pass reads or
// leaves it must have written; main_grad set to its start, or (bf16 gradients) the pass's own sums NaN too. All on
// the pass's stream: a non-blocking stream does not wait for the legacy stream's copies and fills.
mokStatus_t prepare(const core::LayerShape& s, const Variant& variant, PassKind kind,
                    const std::vector<char>& workspace, const std::vector<char>& peer, Device* d, Text* text) {
  core::PassView v =
      core::pass_view_at(s, kind, d->workspace, d->peers, reinterpret_cast<core::PeerHeader* const*>(d->peers), nullptr,
                         s.max_tokens, 0, 0, d->error);
  v.w.gate = d->gate;
  v.w.up = d->up;
  v.w.down = d->down;
  if (s.mxfp8) {  // the forward's rowwise forms, the backward's colwise ones
    core::MxWeight* forms[6] = {&v.w.gate_rowwise, &v.w.gate_colwise, &v.w.up_rowwise,
                                &v.w.up_colwise,   &v.w.down_rowwise, &v.w.down_colwise};
    for (int i = 0; i < 6; ++i) *forms[i] = core::MxWeight{d->mx_codes[i], d->mx_scales[i]};
  }
  v.w.shared_gate = d->shared_gate;
  v.w.shared_up = d->shared_up;
  v.w.shared_down = d->shared_down;
  v.w.shared_router = variant.gated ? d->shared_router : nullptr;
  if (variant.biases) v.w.gate_bias = d->bias[0], v.w.up_bias = d->bias[1], v.w.down_bias = d->bias[2];
  v.sigmoid_table = d->sigmoid_table;
  d->split.view = v;
  d->host_peers[0] = d->peer;
  d->split.host_peers = d->host_peers;
  aim_gradients(variant, d);
  // v's ring pointers lie in d->workspace, its slots in d->peer: the offsets are the host's.
  size_t ring = static_cast<size_t>(s.macrobatch), h = static_cast<size_t>(s.hidden),
         in = static_cast<size_t>(s.intermediate);
  size_t slots = core::is_backward(kind) ? v.peer.dx_slots : v.peer.y_slots;
  const core::SplitShared& sh = d->split.shared;
  size_t rows = static_cast<size_t>(core::shared_rows(s)), is = static_cast<size_t>(s.shared_intermediate);
  struct Fill {
    void* at;
    size_t bytes;
  };
  std::vector<Fill> fills = {{v.ring_g, ring * in * 2},
                             {v.ring_u, ring * in * 2},
                             {v.ring_h, ring * in * 2},
                             {v.ring_y, core::out_ring_rows(s) * h * 2},
                             {d->peer + slots, static_cast<size_t>(s.max_tokens) * s.top_k * h * 2},
                             {d->split.targets.dx_partial, core::out_ring_rows(s) * h * sizeof(float)},
                             {d->split.out, static_cast<size_t>(s.max_tokens) * h * 2},
                             {d->split.dx, static_cast<size_t>(s.max_tokens) * h * 2},
                             {d->split.dw, static_cast<size_t>(s.max_tokens) * s.top_k * sizeof(float)},
                             {v.shared_out, static_cast<size_t>(s.max_tokens) * h * 2},
                             {sh.g, rows * is * 2},
                             {sh.u, rows * is * 2},
                             {sh.h, rows * is * 2},
                             {sh.dh, rows * is * 2},
                             {sh.scaled, rows * h * 2},
                             {sh.dlogit, rows * sizeof(float)},
                             {sh.dx_partial, rows * h * sizeof(float)},
                             {sh.schedule, 2 * sizeof(int32_t)}};
  if (s.mxfp8) {  // x's and dy's codes both ways and every scale (g's, u's and h's codes are in their rings): NaN
    for (const core::MxRing* mx : {&v.mx_x, &v.mx_dy})
      fills.insert(fills.end(), {{mx->rows, ring * h},
                                 {mx->tokens, ring * h},
                                 {mx->row_scales, core::mx_row_scale_bytes(s, s.hidden)},
                                 {mx->token_scales, core::mx_token_scale_bytes(s, s.hidden)}});
    for (const core::MxRing* mx : {&v.mx_g, &v.mx_u, &v.mx_h})
      fills.insert(fills.end(), {{mx->row_scales, core::mx_row_scale_bytes(s, s.intermediate)},
                                 {mx->token_scales, core::mx_token_scale_bytes(s, s.intermediate)}});
    fills.insert(fills.end(), {{d->split.dequantised.a, core::dequantised_a_values(s) * 2},
                               {d->split.dequantised.b, core::dequantised_b_values(s) * 2}});
  } else {  // empty in MXFP8
    fills.insert(fills.end(), {{v.ring_x, ring * h * 2}, {v.ring_dy, ring * h * 2}});
  }
  for (int i = 0; i < kGradients; ++i) {  // the bias gradients' sums are the pass's own in either case
    if (variant.bf16_gradients || i >= kBiasGradients)
      fills.push_back({d->sums[i], gradient_values(s, i) * sizeof(float)});
    if (variant.bf16_gradients) fills.push_back({d->bf16_gradients[i], gradient_values(s, i) * 2});
  }
  if (variant.biases)
    fills.push_back({d->split.targets.biased, static_cast<size_t>(s.macrobatch) * in * sizeof(float)});
  // main_grad's start, as large as the largest of the weight gradients it stands for.
  std::vector<float> start(std::max(gradient_values(s, 0), gradient_values(s, 3)), kMainGradStart);
  cudaStream_t stream = d->buffers.stream;
  cudaError_t e = cudaMemcpyAsync(d->workspace, workspace.data(), workspace.size(), cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(d->peer, peer.data(), peer.size(), cudaMemcpyHostToDevice, stream);
  for (const Fill& f : fills)
    if (e == cudaSuccess) e = cudaMemsetAsync(f.at, 0xff, f.bytes, stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(d->error, 0, sizeof(core::ErrorRecord), stream);  // no failure yet
  for (int i = 0; !variant.bf16_gradients && i < kGradients; ++i)
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(d->main_grad[i], start.data(), gradient_values(s, i) * sizeof(float), cudaMemcpyHostToDevice,
                          stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);  // `start` lives until here; only copies and fills wait
  return e == cudaSuccess ? mokSuccess : cuda_failed(text, "copying the host executor's memory to the device", e);
}

// Waits, bounded, for what the stream holds; a wait that runs out keeps the buffers (freeing them would wait).
mokStatus_t wait_stream(const SelftestSetup& setup, Device* d, const char* name, Text* text) {
  uint64_t deadline = core::now_ns() + static_cast<uint64_t>(setup.timeout_ms) * 1000000ull;
  cudaError_t e = cudaEventRecord(d->buffers.done, d->buffers.stream);
  if (e == cudaSuccess) e = wait_event(d->buffers.done, deadline);
  if (e == cudaErrorNotReady) {
    d->buffers.keep = true;
    text->add("%s: the split pass did not finish within %d ms (options.timeout_ms)", name, setup.timeout_ms);
    return mokTimeout;
  }
  return e == cudaSuccess ? mokSuccess : cuda_failed(text, name, e);
}

mokStatus_t run_pass(const SelftestSetup& setup, Device* d, const char* name, Text* text) {
  SplitFailure f;
  bool enqueued = enqueue_split_pass(d->split, &f);
  // The launches enqueued before a refusal still run: wait for them too.
  if (mokStatus_t st = wait_stream(setup, d, name, text); st != mokSuccess || enqueued) {
    if (st != mokSuccess) return st;
    core::ErrorRecord record{};
    cudaError_t e = cudaMemcpy(&record, d->error, sizeof(record), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return cuda_failed(text, "reading the pass's error record", e);
    if (record.claimed == 0) return mokSuccess;
    text->add("%s: the pass recorded a failure (outcome %d, task %d)", name, record.outcome, record.task_kind);
    return mokInternalError;
  }
  text->add("%s: the split pass stopped at launch %lld (%s, GEMM %d): ", name, static_cast<long long>(f.launch),
            core::split_step_name(f.step), static_cast<int>(f.gemm));
  if (f.refusal == SplitRefusal::cuda_error) return cuda_failed(text, "its launch", f.error);
  text->add("%s", f.refusal == SplitRefusal::gemm_refused ? gemm_status_name(static_cast<GemmStatus>(f.gemm_status))
                                                          : split_refusal_name(f.refusal));
  if (f.missing) text->add(": no %s", f.missing);
  return mokInternalError;
}

template <class T>
mokStatus_t download(const T* device, size_t count, std::vector<T>* host, Text* text) {
  host->resize(count);
  cudaError_t e = cudaMemcpy(host->data(), device, count * sizeof(T), cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? mokSuccess : cuda_failed(text, "copying the pass's results back", e);
}

template <class T>
double relative_error(const std::vector<T>& got, const std::vector<T>& want, double start = 0) {
  return got.size() == want.size() ? core::normwise_difference(got.data(), want.data(), want.size(), start) : NAN;
}

// Each result within core::kSplitOrderTolerance of the host's, normwise.
bool within(const char* name, double error, Text* text) {
  text->add("%s %.2g, ", name, error);
  if (error <= core::kSplitOrderTolerance) return true;
  text->add("above the bound %g (core::kSplitOrderTolerance): the split pass's %s is wrong; ",
            core::kSplitOrderTolerance, name);
  return false;
}

// The pass's results on the device, as the host holds them.
mokStatus_t collect(const core::LayerShape& s, const Variant& variant, const Device& d, PassKind kind, Results* r,
                    Text* text) {
  size_t th = static_cast<size_t>(s.max_tokens) * s.hidden;
  if (kind == PassKind::forward) return download(d.split.out, th, &r->out, text);
  mokStatus_t st = download(d.split.dx, th, &r->dx, text);
  if (st == mokSuccess) st = download(d.split.dw, static_cast<size_t>(s.max_tokens) * s.top_k, &r->dw, text);
  for (int i = 0; i < kGradients && st == mokSuccess; ++i) {
    if (!has_gradient(variant, i)) continue;
    if (!variant.bf16_gradients) {
      st = download(d.main_grad[i], gradient_values(s, i), &r->gradients[i], text);
      continue;
    }
    std::vector<bf16_t> bf16;
    st = download(d.bf16_gradients[i], gradient_values(s, i), &bf16, text);
    r->gradients[i] = as_floats(bf16);
  }
  return st;
}

bool same_bits(const Results& a, const Results& b) {
  auto same = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
  };
  bool all = same(a.out, b.out) && same(a.dx, b.dx) && same(a.dw, b.dw);
  for (int i = 0; i < kGradients; ++i) all = all && same(a.gradients[i], b.gradients[i]);
  return all;
}

// One pass of `kind` on the device, twice from the same memory: both runs' results, which must be the same bits.
mokStatus_t run_twice(const SelftestSetup& setup, const core::LayerShape& s, const Variant& variant, PassKind kind,
                      const HostRun& host, Device* d, Results* r, Text* text) {
  bool forward = kind == PassKind::forward;
  const char* name = forward ? "forward" : "backward";
  Results again;
  for (Results* into : {r, &again}) {
    mokStatus_t st = prepare(s, variant, kind, forward ? host.forward_workspace : host.backward_workspace,
                             forward ? host.forward_peer : host.backward_peer, d, text);
    if (st == mokSuccess) st = run_pass(setup, d, name, text);
    if (st == mokSuccess) st = collect(s, variant, *d, kind, into, text);
    if (st != mokSuccess) return st;
  }
  if (same_bits(*r, again)) return mokSuccess;
  text->add("%s: two runs of the same pass gave different bits (the split pass must be deterministic)", name);
  return mokInternalError;
}

// The stage's layer in a variant's precision.
void in_precision(bool mxfp8, mokLayerConfig_t* c, core::LayerShape* s) {
  c->precision = mxfp8 ? mokPrecisionMXFP8 : mokPrecisionBF16;
  s->mxfp8 = mxfp8 ? 1 : 0;
}

// One variant: the host executor's passes, then the device's over their memory, each result within the bound.
mokStatus_t run_variant(const SelftestSetup& setup, mokLayerConfig_t c, core::LayerShape s, const Inputs& in,
                        const Variant& variant, Device* d, Text* text) {
  text->add("%s: ", variant.name);
  in_precision(variant.mxfp8, &c, &s);
  HostRun host;
  if (mokStatus_t st = run_host(c, s, in, variant, &host, text); st != mokSuccess) return st;
  Results fwd, bwd;
  if (mokStatus_t st = run_twice(setup, s, variant, PassKind::forward, host, d, &fwd, text); st != mokSuccess)
    return st;
  if (mokStatus_t st = run_twice(setup, s, variant, PassKind::backward, host, d, &bwd, text); st != mokSuccess)
    return st;
  double start = variant.bf16_gradients ? 0.0 : kMainGradStart;
  bool ok = within("out", relative_error(fwd.out, host.forward.out), text) &
            within("dx", relative_error(bwd.dx, host.backward.dx), text) &
            within("dw", relative_error(bwd.dw, host.backward.dw), text);
  for (int i = 0; i < kGradients; ++i)
    if (has_gradient(variant, i))
      ok &= within(kGradientNames[i], relative_error(bwd.gradients[i], host.backward.gradients[i], start), text);
  return ok ? mokSuccess : mokInternalError;
}

}  // namespace

mokStatus_t selftest_one_rank(const SelftestSetup& setup, Text* text) {
  int cc_major = 0;
  if (mokStatus_t s = open_gemm_device(setup, text, &cc_major); s != mokSuccess) return s;
  GemmArchitecture architecture = gemm_architecture(cc_major);
  text->add("seed %llu: ", static_cast<unsigned long long>(setup.seed));  // --seed repeats the inputs
  std::mt19937_64 rng(setup.seed);
  mokLayerConfig_t c = stage_config(setup.timeout_ms), copy;
  core::LayerShape s{};
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  if (api::check_config(&c, "mokSelftestRun", &copy, &s) != mokSuccess ||  // the shape as mokLayerCreate reads it
      mokLayerGetSizes(&c, &sizes) != mokSuccess) {
    text->add("the stage's own layer config is refused: %s", mokGetLastError());
    return mokInternalError;
  }
  Inputs in = draw(s, rng);
  // The MXFP8 variant's host layer's sizes count too.
  core::LayerShape gemm_shape = s;
  {
    mokLayerConfig_t mx_config = c;
    mokLayerSizes_t mx_sizes = MOK_LAYER_SIZES_INIT;
    in_precision(true, &mx_config, &gemm_shape);
    if (mokLayerGetSizes(&mx_config, &mx_sizes) != mokSuccess) {
      text->add("the stage's own MXFP8 layer config is refused: %s", mokGetLastError());
      return mokInternalError;
    }
    sizes.workspace_bytes = std::max(sizes.workspace_bytes, mx_sizes.workspace_bytes);
    sizes.peer_bytes = std::max(sizes.peer_bytes, mx_sizes.peer_bytes);
    const std::vector<bf16_t>* weights[3] = {&in.gate, &in.up, &in.down};
    in.mx = quantize_weights(s.experts_per_rank, s.hidden, s.intermediate, weights);
  }
  Device d;
  d.split.architecture = static_cast<int>(architecture);
  if (mokStatus_t st = set_up(gemm_shape, in, sizes, &d, text); st != mokSuccess) return st;
  text->add(
      "the split pass of one rank (%d experts, H %d, I %d, a shared expert of I_s %d, %d tokens, a %d-row ring in "
      "windows over up to %lld rows) against the host executor, normwise: ",
      s.experts_per_rank, s.hidden, s.intermediate, s.shared_intermediate, s.max_tokens, s.macrobatch,
      static_cast<long long>(core::max_recv_rows(s)));
  // Every variant runs (a failure of one still reports the others' figures); the first failure is the stage's.
  mokStatus_t result = mokSuccess;
  for (const Variant& variant : kVariants) {
    mokStatus_t st = run_variant(setup, c, s, in, variant, &d, text);
    if (d.buffers.keep) return mokTimeout;  // the device may still be running: nothing more on it
    if (result == mokSuccess) result = st;
    text->add("; ");
  }
  if (result == mokSuccess) text->add("each pass twice with the same bits");
  return result;
}
#endif

}  // namespace mok::cuda
