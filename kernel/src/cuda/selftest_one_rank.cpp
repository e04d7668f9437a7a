// The self-test's one-rank stage (cuda/selftest.hpp): the split executor's pass (cuda/split_device.hpp) of one
// rank's layer on the GPU, forward then backward, against the host executor's bytes. The host executor runs the
// layer first, through the C ABI; its workspace and peer buffer (the schedule, the staged x and dOut) are copied
// to the device, where every ring row and home slot is then filled with bf16 NaN, and the device runs the split
// pass over them, each pass twice. So the stage checks the pass (dispatch, the grouped GEMMs, SwiGLU, combine,
// the gated shared expert, the home sums, a ring that turns within the pass), not the schedule build or the staging,
// which the split executor's layer (not written yet) will do on the device.
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

// One rank, four experts (one hot, one with no rows), a ring of 256 rows that the ~1100 worst-case rows turn
// several times, a gated shared expert wider than I (Qwen2-MoE's), H, I and I_s multiples of the GEMMs' 16-byte
// rows.
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

std::vector<bf16_t> random_bf16(size_t n, float scale, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<bf16_t> v(n);
  for (bf16_t& x : v) x = core::float_to_bf16(uniform(rng));
  return v;
}

// The layer's inputs: routes to expert 0 half the time, 1 and 3 a quarter and an eighth, expert 2 never, -1 else.
struct Inputs {
  std::vector<int32_t> ids;
  std::vector<float> topk_weights;
  std::vector<bf16_t> x, dout, gate, up, down;
  std::vector<bf16_t> shared_gate, shared_up, shared_down, shared_router;
};

Inputs draw(const core::LayerShape& s, std::mt19937_64& rng) {
  Inputs in;
  const int32_t pick[8] = {0, 0, 0, 0, 1, 1, 3, -1};
  size_t routes = static_cast<size_t>(s.max_tokens) * s.top_k,
         eih = static_cast<size_t>(s.experts_per_rank) * s.hidden * s.intermediate;
  for (size_t i = 0; i < routes; ++i) in.ids.push_back(pick[rng() % 8]);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (size_t i = 0; i < routes; ++i) in.topk_weights.push_back(weight(rng));
  in.x = random_bf16(static_cast<size_t>(s.max_tokens) * s.hidden, 1.0f, rng);
  in.dout = random_bf16(static_cast<size_t>(s.max_tokens) * s.hidden, 1.0f, rng);
  in.gate = random_bf16(eih, 1.0f / std::sqrt(static_cast<float>(s.hidden)), rng);
  in.up = random_bf16(eih, 1.0f / std::sqrt(static_cast<float>(s.hidden)), rng);
  in.down = random_bf16(eih, 1.0f / std::sqrt(static_cast<float>(s.intermediate)), rng);
  size_t sih = static_cast<size_t>(s.shared_intermediate) * s.hidden;
  in.shared_gate = random_bf16(sih, 1.0f / std::sqrt(static_cast<float>(s.hidden)), rng);
  in.shared_up = random_bf16(sih, 1.0f / std::sqrt(static_cast<float>(s.hidden)), rng);
  in.shared_down = random_bf16(sih, 1.0f / std::sqrt(static_cast<float>(s.shared_intermediate)), rng);
  in.shared_router = random_bf16(static_cast<size_t>(s.hidden), 1.0f / std::sqrt(static_cast<float>(s.hidden)), rng);
  return in;
}

struct HostBlock {
  void* p = nullptr;
  explicit HostBlock(size_t bytes) : p(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64)) {}
  ~HostBlock() { std::free(p); }
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
};

// What the host executor computed, and the memory it left after each pass (what the device's pass starts from).
struct HostRun {
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  std::vector<char> forward_workspace, forward_peer, backward_workspace, backward_peer;
  std::vector<bf16_t> out, dx;
  std::vector<float> dw, main_gate, main_up, main_down, main_shared_gate, main_shared_up, main_shared_down,
      main_shared_router;
};

mokStatus_t run_host(const mokLayerConfig_t& c, const Inputs& in, HostRun* run, Text* text) {
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
  mokLayerWeights_t w = MOK_LAYER_WEIGHTS_INIT;
  w.gate = in.gate.data();
  w.up = in.up.data();
  w.down = in.down.data();
  w.shared_gate = in.shared_gate.data();
  w.shared_up = in.shared_up.data();
  w.shared_down = in.shared_down.data();
  w.shared_router = in.shared_router.data();
  size_t th = static_cast<size_t>(c.max_tokens) * c.hidden, eih = in.gate.size(), sih = in.shared_gate.size();
  run->out.assign(th, 0);
  run->dx.assign(th, 0);
  run->dw.assign(in.topk_weights.size(), 0.0f);
  for (auto* v : {&run->main_gate, &run->main_up, &run->main_down}) v->assign(eih, kMainGradStart);
  for (auto* v : {&run->main_shared_gate, &run->main_shared_up, &run->main_shared_down}) v->assign(sih, kMainGradStart);
  run->main_shared_router.assign(in.shared_router.size(), kMainGradStart);
  mokLayerGrads_t g = MOK_LAYER_GRADS_INIT;
  g.dx = run->dx.data();
  g.dtopk_weights = run->dw.data();
  g.dgate = run->main_gate.data();
  g.dup = run->main_up.data();
  g.ddown = run->main_down.data();
  g.dshared_gate = run->main_shared_gate.data();
  g.dshared_up = run->main_shared_up.data();
  g.dshared_down = run->main_shared_down.data();
  g.dshared_router = run->main_shared_router.data();
  g.accumulate = 1;
  auto keep = [&](std::vector<char>* local, std::vector<char>* shared) {
    local->assign(static_cast<char*>(workspace.p), static_cast<char*>(workspace.p) + run->sizes.workspace_bytes);
    shared->assign(static_cast<char*>(peer.p), static_cast<char*>(peer.p) + run->sizes.peer_bytes);
  };
  mokStatus_t s = mokLayerBuildSchedule(layer, in.ids.data(), mokIndexInt32, c.max_tokens, nullptr);
  if (s == mokSuccess) s = mokLayerForward(layer, &w, in.x.data(), in.topk_weights.data(), run->out.data(), nullptr);
  if (s == mokSuccess) keep(&run->forward_workspace, &run->forward_peer);
  if (s == mokSuccess) s = mokLayerBackward(layer, &w, in.topk_weights.data(), in.dout.data(), &g, nullptr);
  if (s == mokSuccess) keep(&run->backward_workspace, &run->backward_peer);
  mokStatus_t result = s == mokSuccess ? mokSuccess : failed("pass");
  mokLayerDestroy(layer);
  return result;
}

// The device's copy of everything a pass reads and writes.
struct Device {
  DeviceBuffers buffers;
  SplitDevice split{};
  char *workspace = nullptr, *peer = nullptr;
  float *main_gate = nullptr, *main_up = nullptr, *main_down = nullptr;
  float *main_shared_gate = nullptr, *main_shared_up = nullptr, *main_shared_down = nullptr,
        *main_shared_router = nullptr;
  core::ErrorRecord* error = nullptr;
  char** peers = nullptr;
  bf16_t *gate = nullptr, *up = nullptr, *down = nullptr;
  bf16_t *shared_gate = nullptr, *shared_up = nullptr, *shared_down = nullptr, *shared_router = nullptr;
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

// The CUTLASS workspace the largest of the pass's GEMM kinds asks for, the routed experts' and the shared one's.
mokStatus_t gemm_workspace_bytes(const core::LayerShape& s, size_t* bytes, Text* text) {
  *bytes = 0;
  for (int k = 0; k < 2 * static_cast<int>(core::GroupedGemm::count); ++k) {
    GroupedGemmBf16 g{};
    g.shape = k % 2 ? core::shared_expert_shape(s) : s;
    g.kind = static_cast<core::GroupedGemm>(k / 2);
    size_t need = 0;
    cudaError_t e = cudaSuccess;
    GemmStatus st = grouped_gemm_bf16_workspace_bytes(g, &need, &e);
    if (st == GemmStatus::cuda_error) return cuda_failed(text, "sizing the grouped GEMMs' workspace", e);
    if (st != GemmStatus::ok) {
      text->add("sizing the grouped GEMMs' workspace: %s", gemm_status_name(st));
      return mokInternalError;
    }
    *bytes = need > *bytes ? need : *bytes;
  }
  return mokSuccess;
}

mokStatus_t set_up(const core::LayerShape& s, const Inputs& in, const HostRun& host, Device* d, Text* text) {
  DeviceBuffers& b = d->buffers;
  SplitDevice& sd = d->split;
  size_t th = static_cast<size_t>(s.max_tokens) * s.hidden, eih = in.gate.size();
  std::vector<float> table(core::kSigmoidTableSize);
  core::fill_sigmoid_table(table.data());  // SwiGLU's sigmoids as the host looks them up: the host's bits
  int64_t ctas = core::max_tiles(s) < 1024 ? core::max_tiles(s) : 1024;
  sd.staging_values =
      static_cast<int64_t>(core::max_value(core::mx_staging_values(s), core::mx_swiglu_staging_values(s)));
  cudaError_t e = cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = allocate(b, host.sizes.workspace_bytes, &d->workspace);
  if (e == cudaSuccess) e = allocate(b, host.sizes.peer_bytes, &d->peer);
  if (e == cudaSuccess) e = upload(b, std::vector<char*>{d->peer}, &d->peers);
  if (e == cudaSuccess) e = allocate(b, 1, &d->error);
  if (e == cudaSuccess) e = upload(b, in.gate, &d->gate);
  if (e == cudaSuccess) e = upload(b, in.up, &d->up);
  if (e == cudaSuccess) e = upload(b, in.down, &d->down);
  if (e == cudaSuccess) e = upload(b, in.shared_gate, &d->shared_gate);
  if (e == cudaSuccess) e = upload(b, in.shared_up, &d->shared_up);
  if (e == cudaSuccess) e = upload(b, in.shared_down, &d->shared_down);
  if (e == cudaSuccess) e = upload(b, in.shared_router, &d->shared_router);
  if (e == cudaSuccess) e = upload(b, table, &d->sigmoid_table);
  if (e == cudaSuccess) e = upload(b, in.topk_weights, const_cast<float**>(&sd.topk_weights));
  if (e == cudaSuccess) e = upload(b, in.dout, const_cast<bf16_t**>(&sd.dout));
  if (e == cudaSuccess) e = allocate(b, th, &sd.out);
  if (e == cudaSuccess) e = allocate(b, th, &sd.dx);
  if (e == cudaSuccess) e = allocate(b, in.topk_weights.size(), &sd.dw);
  if (e == cudaSuccess) e = allocate(b, eih, &d->main_gate);
  if (e == cudaSuccess) e = allocate(b, eih, &d->main_up);
  if (e == cudaSuccess) e = allocate(b, eih, &d->main_down);
  size_t sih = in.shared_gate.size(), rows = static_cast<size_t>(core::shared_rows(s)),
         is = static_cast<size_t>(s.shared_intermediate);
  if (e == cudaSuccess) e = allocate(b, sih, &d->main_shared_gate);
  if (e == cudaSuccess) e = allocate(b, sih, &d->main_shared_up);
  if (e == cudaSuccess) e = allocate(b, sih, &d->main_shared_down);
  if (e == cudaSuccess) e = allocate(b, in.shared_router.size(), &d->main_shared_router);
  core::SplitShared& sh = sd.shared;
  for (bf16_t** rows_of_width_is : {&sh.g, &sh.u, &sh.h, &sh.dh})
    if (e == cudaSuccess) e = allocate(b, rows * is, rows_of_width_is);
  if (e == cudaSuccess) e = allocate(b, rows * s.hidden, &sh.scaled);
  if (e == cudaSuccess) e = allocate(b, rows, &sh.dlogit);
  if (e == cudaSuccess) e = allocate(b, rows * s.hidden, &sh.dx_partial);
  if (e == cudaSuccess) e = allocate(b, 2, &sh.schedule);
  if (e == cudaSuccess) e = allocate(b, static_cast<size_t>(core::out_ring_rows(s)) * s.hidden, &sd.targets.dx_partial);
  if (e == cudaSuccess) e = allocate(b, static_cast<size_t>(ctas * sd.staging_values) + 1, &sd.staging);
  if (e == cudaSuccess) e = b.alloc(grouped_gemm_bf16_argument_bytes(s.experts_per_rank), &sd.gemm_arguments);
  if (e != cudaSuccess) return cuda_failed(text, "allocating the layer's device memory", e);
  if (mokStatus_t st = gemm_workspace_bytes(s, &sd.gemm_workspace_bytes, text); st != mokSuccess) return st;
  if ((e = b.alloc(sd.gemm_workspace_bytes, &sd.gemm_workspace)) != cudaSuccess)
    return cuda_failed(text, "allocating the grouped GEMMs' workspace", e);
  sd.targets.wgrad_gate = d->main_gate;
  sd.targets.wgrad_up = d->main_up;
  sd.targets.wgrad_down = d->main_down;
  sd.targets.wgrad_shared_gate = d->main_shared_gate;
  sd.targets.wgrad_shared_up = d->main_shared_up;
  sd.targets.wgrad_shared_down = d->main_shared_down;
  sd.targets.wgrad_shared_router = d->main_shared_router;
  sd.ctas = static_cast<int>(ctas);
  sd.stream = b.stream;
  return mokSuccess;
}

// The pass's view over the device's copy of the host's memory; its rings, home slots, dx's fp32 partial and every
// output filled with NaN (bf16 or fp32: all bits set), so that what the pass reads or leaves it must have written.
// All on the pass's stream: a non-blocking stream does not wait for the legacy stream's copies and fills.
mokStatus_t prepare(const core::LayerShape& s, PassKind kind, const std::vector<char>& workspace,
                    const std::vector<char>& peer, Device* d, Text* text) {
  core::PassView v =
      core::pass_view_at(s, kind, d->workspace, d->peers, reinterpret_cast<core::PeerHeader* const*>(d->peers), nullptr,
                         s.max_tokens, 0, 0, d->error);
  v.w.gate = d->gate;
  v.w.up = d->up;
  v.w.down = d->down;
  v.w.shared_gate = d->shared_gate;
  v.w.shared_up = d->shared_up;
  v.w.shared_down = d->shared_down;
  v.w.shared_router = d->shared_router;
  v.sigmoid_table = d->sigmoid_table;
  d->split.view = v;
  // v's ring pointers lie in d->workspace, its slots in d->peer: the offsets are the host's.
  size_t ring = static_cast<size_t>(s.macrobatch), h = static_cast<size_t>(s.hidden),
         in = static_cast<size_t>(s.intermediate);
  size_t slots = core::is_backward(kind) ? v.peer.dx_slots : v.peer.y_slots;
  const core::SplitShared& sh = d->split.shared;
  size_t rows = static_cast<size_t>(core::shared_rows(s)), is = static_cast<size_t>(s.shared_intermediate);
  struct Fill {
    void* at;
    size_t bytes;
  } fills[] = {{v.ring_x, ring * h * 2},
               {v.ring_dy, ring * h * 2},
               {v.ring_g, ring * in * 2},
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
  // main_grad's start, as large as the largest of the weight gradients it stands for.
  std::vector<float> start(std::max(static_cast<size_t>(s.experts_per_rank) * in, is) * h, kMainGradStart);
  cudaStream_t stream = d->buffers.stream;
  cudaError_t e = cudaMemcpyAsync(d->workspace, workspace.data(), workspace.size(), cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(d->peer, peer.data(), peer.size(), cudaMemcpyHostToDevice, stream);
  for (const Fill& f : fills)
    if (e == cudaSuccess) e = cudaMemsetAsync(f.at, 0xff, f.bytes, stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(d->error, 0, sizeof(core::ErrorRecord), stream);  // no failure yet
  struct Start {
    float* at;
    size_t count;
  } starts[] = {{d->main_gate, s.experts_per_rank * h * in},
                {d->main_up, s.experts_per_rank * h * in},
                {d->main_down, s.experts_per_rank * h * in},
                {d->main_shared_gate, is * h},
                {d->main_shared_up, is * h},
                {d->main_shared_down, is * h},
                {d->main_shared_router, h}};
  for (const Start& m : starts)
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(m.at, start.data(), m.count * sizeof(float), cudaMemcpyHostToDevice, stream);
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
  bool enqueued = enqueue_split_pass(d->split, false, &f);
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

struct DeviceResults {
  std::vector<bf16_t> out, dx;
  std::vector<float> dw, main_gate, main_up, main_down, main_shared_gate, main_shared_up, main_shared_down,
      main_shared_router;
};

mokStatus_t collect(const core::LayerShape& s, const Device& d, PassKind kind, DeviceResults* r, Text* text) {
  size_t th = static_cast<size_t>(s.max_tokens) * s.hidden,
         eih = static_cast<size_t>(s.experts_per_rank) * s.hidden * s.intermediate;
  if (kind == PassKind::forward) return download(d.split.out, th, &r->out, text);
  mokStatus_t st = download(d.split.dx, th, &r->dx, text);
  if (st == mokSuccess) st = download(d.split.dw, static_cast<size_t>(s.max_tokens) * s.top_k, &r->dw, text);
  if (st == mokSuccess) st = download(d.main_gate, eih, &r->main_gate, text);
  if (st == mokSuccess) st = download(d.main_up, eih, &r->main_up, text);
  if (st == mokSuccess) st = download(d.main_down, eih, &r->main_down, text);
  size_t sih = static_cast<size_t>(s.shared_intermediate) * s.hidden;
  if (st == mokSuccess) st = download(d.main_shared_gate, sih, &r->main_shared_gate, text);
  if (st == mokSuccess) st = download(d.main_shared_up, sih, &r->main_shared_up, text);
  if (st == mokSuccess) st = download(d.main_shared_down, sih, &r->main_shared_down, text);
  if (st == mokSuccess)
    st = download(d.main_shared_router, static_cast<size_t>(s.hidden), &r->main_shared_router, text);
  return st;
}

bool same_bits(const DeviceResults& a, const DeviceResults& b) {
  auto same = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
  };
  return same(a.out, b.out) && same(a.dx, b.dx) && same(a.dw, b.dw) && same(a.main_gate, b.main_gate) &&
         same(a.main_up, b.main_up) && same(a.main_down, b.main_down) && same(a.main_shared_gate, b.main_shared_gate) &&
         same(a.main_shared_up, b.main_shared_up) && same(a.main_shared_down, b.main_shared_down) &&
         same(a.main_shared_router, b.main_shared_router);
}

// One pass of `kind` on the device, twice from the same memory: both runs' results, which must be the same bits.
mokStatus_t run_twice(const SelftestSetup& setup, const core::LayerShape& s, PassKind kind, const HostRun& host,
                      Device* d, DeviceResults* r, Text* text) {
  bool forward = kind == PassKind::forward;
  const char* name = forward ? "forward" : "backward";
  DeviceResults again;
  for (DeviceResults* into : {r, &again}) {
    mokStatus_t st = prepare(s, kind, forward ? host.forward_workspace : host.backward_workspace,
                             forward ? host.forward_peer : host.backward_peer, d, text);
    if (st == mokSuccess) st = run_pass(setup, d, name, text);
    if (st == mokSuccess) st = collect(s, *d, kind, into, text);
    if (st != mokSuccess) return st;
  }
  if (same_bits(*r, again)) return mokSuccess;
  text->add("%s: two runs of the same pass gave different bits (the split pass must be deterministic)", name);
  return mokInternalError;
}

}  // namespace

mokStatus_t selftest_one_rank(const SelftestSetup& setup, Text* text) {
  if (mokStatus_t s = open_sm100(setup, text); s != mokSuccess) return s;
  text->add("seed %llu: ", static_cast<unsigned long long>(setup.seed));  // --seed repeats the inputs
  std::mt19937_64 rng(setup.seed);
  mokLayerConfig_t c = stage_config(setup.timeout_ms), copy;
  core::LayerShape s{};
  if (api::check_config(&c, "mokSelftestRun", &copy, &s) != mokSuccess) {  // the shape as mokLayerCreate reads it
    text->add("the stage's own layer config is refused: %s", mokGetLastError());
    return mokInternalError;
  }
  Inputs in = draw(s, rng);
  HostRun host;
  if (mokStatus_t st = run_host(c, in, &host, text); st != mokSuccess) return st;
  Device d;
  if (mokStatus_t st = set_up(s, in, host, &d, text); st != mokSuccess) return st;
  DeviceResults fwd, bwd;
  if (mokStatus_t st = run_twice(setup, s, PassKind::forward, host, &d, &fwd, text); st != mokSuccess) return st;
  if (mokStatus_t st = run_twice(setup, s, PassKind::backward, host, &d, &bwd, text); st != mokSuccess) return st;
  if (d.buffers.keep) return mokTimeout;
  text->add(
      "the split pass of one rank (%d experts, H %d, I %d, a gated shared expert of I_s %d, %d tokens, a %d-row ring "
      "in windows over up to %lld rows) against the host executor, normwise: ",
      s.experts_per_rank, s.hidden, s.intermediate, s.shared_intermediate, s.max_tokens, s.macrobatch,
      static_cast<long long>(core::max_recv_rows(s)));
  bool ok =
      within("out", relative_error(fwd.out, host.out), text) & within("dx", relative_error(bwd.dx, host.dx), text) &
      within("dw", relative_error(bwd.dw, host.dw), text) &
      within("dW_gate", relative_error(bwd.main_gate, host.main_gate, kMainGradStart), text) &
      within("dW_up", relative_error(bwd.main_up, host.main_up, kMainGradStart), text) &
      within("dW_down", relative_error(bwd.main_down, host.main_down, kMainGradStart), text) &
      within("dW_shared_gate", relative_error(bwd.main_shared_gate, host.main_shared_gate, kMainGradStart), text) &
      within("dW_shared_up", relative_error(bwd.main_shared_up, host.main_shared_up, kMainGradStart), text) &
      within("dW_shared_down", relative_error(bwd.main_shared_down, host.main_shared_down, kMainGradStart), text) &
      within("dW_shared_router", relative_error(bwd.main_shared_router, host.main_shared_router, kMainGradStart), text);
  if (!ok) return mokInternalError;
  text->add("each pass twice with the same bits");
  return mokSuccess;
}
#endif

}  // namespace mok::cuda
