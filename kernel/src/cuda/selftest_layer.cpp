// The self-test's stages over the cuda executor's layer (mokExecutorCuda through the C ABI, every tensor in device
// memory, each rank's calls on its own stream: the schedule built on the device, the inputs staged, the split passes,
// the y slots): a group of ranks on one GPU and one rank on every GPU against the host executor, determinism across
// runs, and a benchmark line. A group's ranks are driven from one thread: no call of the cuda executor waits.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "core/numeric.hpp"
#include "core/platform.hpp"
#include "core/split_pass.hpp"
#include "cuda/selftest.hpp"
#include "cuda/wait.hpp"

#if MOK_WITH_GROUPED_GEMM
#include "cuda/grouped_gemm.hpp"
#endif

namespace mok::cuda {

#if !MOK_WITH_GROUPED_GEMM
namespace {
mokStatus_t no_gemm(Text* text) {
  text->add("libmok was built without CUTLASS 4.2's headers, so it has no grouped GEMM and no cuda executor");
  return mokNotCompiled;
}
}  // namespace
mokStatus_t selftest_virtual_ranks(const SelftestSetup&, Text* text) {
  return no_gemm(text);
}
mokStatus_t selftest_every_gpu(const SelftestSetup&, Text* text) {
  return no_gemm(text);
}
mokStatus_t selftest_determinism(const SelftestSetup&, Text* text) {
  return no_gemm(text);
}
mokStatus_t selftest_benchmark(const SelftestSetup&, Text* text) {
  return no_gemm(text);
}
#else
namespace {

using core::bf16_t;

// The routed experts' three, the shared expert's three, its router's; then, from kBiases, the expert biases' three.
constexpr int kGradients = 10;
constexpr int kBiases = 7;
constexpr float kMainGradStart = 0.5f;

// `world` ranks of four experts each (one hot, one never routed to), a gated shared expert wider than I, a ring the
// rows turn.
mokLayerConfig_t layer_config(int timeout_ms, int world = 1) {
  mokLayerConfig_t c = MOK_LAYER_CONFIG_INIT;
  c.world = world;
  c.experts_per_rank = 4, c.hidden = 512, c.intermediate = 256, c.shared_intermediate = 384, c.top_k = 2;
  c.max_tokens = 300, c.expert_padding = 128, c.minibatch = 128, c.macrobatch = 256;
  c.timeout_ms = timeout_ms;
  return c;
}

// A larger layer for the benchmark line, its ring holding every row (the backward reads the forward's g and u).
mokLayerConfig_t benchmark_config(int timeout_ms) {
  mokLayerConfig_t c = MOK_LAYER_CONFIG_INIT;
  c.experts_per_rank = 8, c.hidden = 2048, c.intermediate = 1024, c.shared_intermediate = 0, c.top_k = 4;
  c.max_tokens = 4096, c.expert_padding = 128, c.minibatch = 128, c.macrobatch = 4096 * 4 + 8 * 128;
  c.timeout_ms = timeout_ms;
  return c;
}

bool mxfp8(const mokLayerConfig_t& c) {
  return c.precision == mokPrecisionMXFP8;
}

size_t values(const mokLayerConfig_t& c, int gradient) {
  if (gradient < 3) return static_cast<size_t>(c.experts_per_rank) * c.intermediate * c.hidden;
  if (gradient < 6) return static_cast<size_t>(c.shared_intermediate) * c.hidden;
  if (gradient < kBiases) return static_cast<size_t>(c.hidden);
  return static_cast<size_t>(c.experts_per_rank) * (gradient < kBiases + 2 ? c.intermediate : c.hidden);
}

// A rank's inputs, host copies. Skewed: ids to a rank's expert 0 half the time, 1 and 3 less, 2 never, -1 else, the
// rank drawn uniformly; or uniform over every expert (the benchmark).
struct Inputs {
  int tokens = 0;
  std::vector<int32_t> ids;
  std::vector<float> topk_weights;
  std::vector<bf16_t> x, dout, weights[kGradients];  // weights in the gradients' order; no biases: theirs empty
  MxWeights mx;                                      // MXFP8: gate, up and down quantised
};

// Gradient i is one the layer has: the biases' only where they were drawn.
bool present(const Inputs& in, int i) {
  return i < kBiases || !in.weights[i].empty();
}

Inputs draw(const mokLayerConfig_t& c, uint64_t seed, bool skewed, int tokens, bool biased) {
  std::mt19937_64 rng(seed);
  Inputs in;
  in.tokens = tokens;
  const int32_t pick[8] = {0, 0, 0, 0, 1, 1, 3, -1};
  size_t routes = static_cast<size_t>(tokens) * c.top_k, th = static_cast<size_t>(tokens) * c.hidden;
  uint64_t experts = static_cast<uint64_t>(c.world) * c.experts_per_rank;
  for (size_t i = 0; i < routes; ++i) {
    int32_t home = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.world)) * c.experts_per_rank;
    int32_t local = pick[rng() % 8];
    in.ids.push_back(skewed ? (local < 0 ? -1 : home + local) : static_cast<int32_t>(rng() % experts));
  }
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (size_t i = 0; i < routes; ++i) in.topk_weights.push_back(weight(rng));
  in.x = random_bf16(th, 1.0f, rng);
  in.dout = random_bf16(th, 1.0f, rng);
  float by_h = 1.0f / std::sqrt(static_cast<float>(c.hidden));
  for (int i = 0; i < kBiases; ++i) in.weights[i] = random_bf16(values(c, i), by_h, rng);
  const std::vector<bf16_t>* routed[3] = {&in.weights[0], &in.weights[1], &in.weights[2]};
  if (mxfp8(c)) in.mx = quantize_weights(c.experts_per_rank, c.hidden, c.intermediate, routed);
  // gpt-oss's gate, up and down biases, of the order of the GEMMs' outputs (so each moves every output visibly).
  for (int i = kBiases; biased && i < kGradients; ++i)
    in.weights[i] = random_bf16(values(c, i), i < kBiases + 2 ? 0.5f : 0.1f, rng);
  return in;
}

// What a run gave: out, the y slots, dx, dw, the weight gradients (fp32 main_grad), and the passes' times.
struct Results {
  std::vector<bf16_t> out, slots, dx;
  std::vector<float> dw, gradients[kGradients];
  float forward_ms = 0, backward_ms = 0;
};

// The bf16 weights `w` (the biases' NULL where there are none); in MXFP8 the routed experts' from `mx` instead:
// MxWeights' codes at [0, 6), scales at [6, 12).
mokLayerWeights_t weights_at(const mokLayerConfig_t& c, void* const* w, void* const* mx) {
  mokLayerWeights_t weights = MOK_LAYER_WEIGHTS_INIT;
  weights.gate = w[0], weights.up = w[1], weights.down = w[2];
  if (mxfp8(c)) {
    mokMxfp8Matrix_t* matrices[6] = {&weights.gate_rowwise, &weights.gate_colwise, &weights.up_rowwise,
                                     &weights.up_colwise,   &weights.down_rowwise, &weights.down_colwise};
    for (int i = 0; i < 6; ++i)
      *matrices[i] = mokMxfp8Matrix_t{static_cast<const uint8_t*>(mx[i]), static_cast<const uint8_t*>(mx[6 + i])};
    weights.gate = weights.up = weights.down = nullptr;
  }
  if (c.shared_intermediate > 0) {
    weights.shared_gate = w[3], weights.shared_up = w[4], weights.shared_down = w[5], weights.shared_router = w[6];
  }
  weights.gate_bias = w[kBiases], weights.up_bias = w[kBiases + 1], weights.down_bias = w[kBiases + 2];
  return weights;
}

// The weight and bias gradients (NULL where there are no biases) added into fp32 main_grad, or (bf16_gradients)
// written as bf16.
mokLayerGrads_t grads_at(const mokLayerConfig_t& c, void* dx, float* dw, void* const* g, bool bf16_gradients) {
  mokLayerGrads_t grads = MOK_LAYER_GRADS_INIT;
  grads.dx = dx, grads.dtopk_weights = dw, grads.accumulate = bf16_gradients ? 0 : 1;
  grads.dgate = g[0], grads.dup = g[1], grads.ddown = g[2];
  if (c.shared_intermediate > 0) {
    grads.dshared_gate = g[3], grads.dshared_up = g[4], grads.dshared_down = g[5], grads.dshared_router = g[6];
  }
  grads.dgate_bias = g[kBiases], grads.dup_bias = g[kBiases + 1], grads.ddown_bias = g[kBiases + 2];
  return grads;
}

mokStatus_t layer_failed(Text* text, const char* executor, const char* call) {
  text->add("the %s executor's %s failed: %s", executor, call, mokGetLastError());
  return mokInternalError;
}

// One rank of the host executor's group over host memory (`bases`: every rank's peer buffer).
mokStatus_t run_host_rank(const mokLayerConfig_t& c, void* const* bases, const Inputs& in, bool bf16_gradients,
                          Results* r, Text* text) {
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  if (mokLayerGetSizes(&c, &sizes) != mokSuccess) return layer_failed(text, "host", "mokLayerGetSizes");
  std::vector<char> workspace(sizes.workspace_bytes + 64);
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  m.peer_bases = bases;
  m.workspace = workspace.data() + (64 - reinterpret_cast<uintptr_t>(workspace.data()) % 64);
  m.workspace_bytes = sizes.workspace_bytes;
  mokLayer_t layer = nullptr;
  if (mokLayerCreate(&c, &m, &layer) != mokSuccess) return layer_failed(text, "host", "mokLayerCreate");
  size_t th = in.x.size();
  r->out.resize(th), r->slots.resize(th * c.top_k), r->dx.resize(th), r->dw.resize(in.topk_weights.size());
  void *w[kGradients] = {}, *g[kGradients] = {};
  std::vector<bf16_t> bf16[kGradients];
  for (int i = 0; i < kGradients; ++i) {
    if (!present(in, i)) continue;
    w[i] = const_cast<bf16_t*>(in.weights[i].data());
    r->gradients[i].assign(values(c, i), kMainGradStart);
    bf16[i].resize(values(c, i));
    g[i] = bf16_gradients ? static_cast<void*>(bf16[i].data()) : r->gradients[i].data();
  }
  void* mx[12];
  for (int i = 0; i < 6; ++i)  // weights_at's array of the device's pointers, whose bytes the layer only reads
    mx[i] = const_cast<uint8_t*>(in.mx.codes[i].data()), mx[6 + i] = const_cast<uint8_t*>(in.mx.scales[i].data());
  mokLayerWeights_t weights = weights_at(c, w, mx);
  mokLayerGrads_t grads = grads_at(c, r->dx.data(), r->dw.data(), g, bf16_gradients);
  const char* call = "mokLayerBuildSchedule";
  mokStatus_t s = mokLayerBuildSchedule(layer, in.ids.data(), mokIndexInt32, in.tokens, nullptr);
  if (s == mokSuccess && (call = "mokLayerForward"))
    s = mokLayerForward(layer, &weights, in.x.data(), in.topk_weights.data(), r->out.data(), nullptr);
  if (s == mokSuccess && (call = "mokLayerGetSlots")) s = mokLayerGetSlots(layer, r->slots.data(), nullptr);
  if (s == mokSuccess && (call = "mokLayerBackward"))
    s = mokLayerBackward(layer, &weights, in.topk_weights.data(), in.dout.data(), &grads, nullptr);
  mokStatus_t result = s == mokSuccess ? mokSuccess : layer_failed(text, "host", call);
  for (int i = 0; bf16_gradients && i < kGradients; ++i) r->gradients[i] = as_floats(bf16[i]);
  mokLayerDestroy(layer);
  return result;
}

// The host executor's group over host memory, a thread per rank (each call waits for its peers): the reference.
mokStatus_t run_host(mokLayerConfig_t c, const std::vector<Inputs>& in, bool bf16_gradients, std::vector<Results>* r,
                     Text* text) {
  c.executor = mokExecutorHost;
  c.timeout_ms = 600000;  // its workers' waits on each other: options.timeout_ms bounds the GPU's
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  if (mokLayerGetSizes(&c, &sizes) != mokSuccess) return layer_failed(text, "host", "mokLayerGetSizes");
  size_t world = in.size();
  std::vector<std::vector<char> > peers(world, std::vector<char>(sizes.peer_bytes + 64));
  std::vector<void*> bases;
  for (std::vector<char>& p : peers) bases.push_back(p.data() + (64 - reinterpret_cast<uintptr_t>(p.data()) % 64));
  r->assign(world, Results{});
  std::vector<Text> why(world);
  std::vector<mokStatus_t> status(world, mokSuccess);
  std::vector<std::thread> ranks;
  for (size_t q = 0; q < world; ++q)
    ranks.emplace_back([&, q] {
      mokLayerConfig_t own = c;
      own.rank = static_cast<int>(q);
      status[q] = run_host_rank(own, bases.data(), in[q], bf16_gradients, &(*r)[q], &why[q]);
    });
  for (std::thread& t : ranks) t.join();
  for (size_t q = 0; q < world; ++q)
    if (status[q] != mokSuccess) {
      text->add("rank %zu: %s", q, why[q].text);
      return status[q];
    }
  return mokSuccess;
}

// On the layer's stream, which then orders every read after it (a pageable copy is staged before it returns).
template <class T>
cudaError_t upload(DeviceBuffers& b, const std::vector<T>& host, void** device) {
  cudaError_t e = b.alloc(host.size() * sizeof(T), device);
  return e == cudaSuccess
             ? cudaMemcpyAsync(*device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, b.stream)
             : e;
}

template <class T>
cudaError_t download(const void* device, size_t n, std::vector<T>* host) {
  host->resize(n);
  return cudaMemcpy(host->data(), device, n * sizeof(T), cudaMemcpyDeviceToHost);
}

// The layer's device memory, its inputs uploaded, its outputs allocated.
struct DeviceLayer {
  DeviceBuffers b;
  void *workspace = nullptr, *peer = nullptr, *ids = nullptr, *topk_weights = nullptr, *x = nullptr, *dout = nullptr;
  void *out = nullptr, *slots = nullptr, *dx = nullptr, *dw = nullptr;
  void *weights[kGradients] = {}, *gradients[kGradients] = {};  // the biases' and theirs NULL where there are none
  void* mx[12] = {};  // MXFP8: Inputs::mx on the device, as weights_at takes it
  size_t workspace_bytes = 0;
  mokLayer_t layer = nullptr;
  cudaEvent_t marks[4] = {};  // before the forward, after it, before the backward, after it
  ~DeviceLayer() {
    if (b.keep) return;  // a wait ran out: the device may still run the layer's kernels
    if (layer) mokLayerDestroy(layer);
    for (cudaEvent_t e : marks)
      if (e) cudaEventDestroy(e);
  }
};

// A rank's device memory and stream; its layer is created once every rank's peer buffer is there (create).
mokStatus_t allocate(const mokLayerConfig_t& c, const Inputs& in, DeviceLayer* d, Text* text) {
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  if (mokLayerGetSizes(&c, &sizes) != mokSuccess) return layer_failed(text, "cuda", "mokLayerGetSizes");
  DeviceBuffers& b = d->b;
  size_t th = in.x.size();
  cudaError_t e = cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming);
  for (cudaEvent_t& mark : d->marks)
    if (e == cudaSuccess) e = cudaEventCreate(&mark);
  if (e == cudaSuccess) e = b.alloc(sizes.workspace_bytes, &d->workspace);
  if (e == cudaSuccess) e = b.alloc(sizes.peer_bytes, &d->peer);
  if (e == cudaSuccess) e = upload(b, in.ids, &d->ids);
  if (e == cudaSuccess) e = upload(b, in.topk_weights, &d->topk_weights);
  if (e == cudaSuccess) e = upload(b, in.x, &d->x);
  if (e == cudaSuccess) e = upload(b, in.dout, &d->dout);
  if (e == cudaSuccess) e = b.alloc(th * sizeof(bf16_t), &d->out);
  if (e == cudaSuccess) e = b.alloc(th * c.top_k * sizeof(bf16_t), &d->slots);
  if (e == cudaSuccess) e = b.alloc(th * sizeof(bf16_t), &d->dx);
  if (e == cudaSuccess) e = b.alloc(in.topk_weights.size() * sizeof(float), &d->dw);
  for (int i = 0; i < kGradients; ++i) {
    if (!present(in, i)) continue;
    if (e == cudaSuccess) e = upload(b, in.weights[i], &d->weights[i]);
    if (e == cudaSuccess) e = upload(b, std::vector<float>(values(c, i), kMainGradStart), &d->gradients[i]);
  }
  for (int i = 0; i < 6 && mxfp8(c); ++i) {
    if (e == cudaSuccess) e = upload(b, in.mx.codes[i], &d->mx[i]);
    if (e == cudaSuccess) e = upload(b, in.mx.scales[i], &d->mx[6 + i]);
  }
  if (e != cudaSuccess) return cuda_failed(text, "setting up the layer's device memory", e);
  d->workspace_bytes = sizes.workspace_bytes;
  return mokSuccess;
}

mokStatus_t create(const mokLayerConfig_t& c, void* const* peers, DeviceLayer* d, Text* text) {
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  m.peer_bases = peers;
  m.workspace = d->workspace;
  m.workspace_bytes = d->workspace_bytes;
  if (mokLayerCreate(&c, &m, &d->layer) != mokSuccess) return layer_failed(text, "cuda", "mokLayerCreate");
  return mokSuccess;
}

// The calls of a run, in order; a group's ranks make each call before any makes the next.
enum class Call { schedule, forward, slots, backward, count };

// Call `call` of rank d enqueued on its stream (the schedule's after every output is NaN-filled, the passes between
// events).
mokStatus_t enqueue(const mokLayerConfig_t& c, bool bf16_gradients, const Inputs& in, Call call, DeviceLayer* d,
                    Text* text) {
  size_t th = in.x.size(), routes = in.topk_weights.size();
  cudaStream_t stream = d->b.stream;
  mokLayerWeights_t weights = weights_at(c, d->weights, d->mx);
  mokLayerGrads_t grads = grads_at(c, d->dx, static_cast<float*>(d->dw), d->gradients, bf16_gradients);
  const float* topk_weights = static_cast<const float*>(d->topk_weights);
  switch (call) {
    case Call::schedule: {
      // Every output NaN (all bits set) first: what the layer does not write cannot match the host or an earlier run.
      std::vector<std::pair<void*, size_t> > fills = {
          {d->out, th * 2}, {d->slots, th * c.top_k * 2}, {d->dx, th * 2}, {d->dw, routes * 4}};
      for (int i = 0; bf16_gradients && i < kGradients; ++i)
        if (present(in, i)) fills.push_back({d->gradients[i], values(c, i) * 2});
      for (const auto& [at, bytes] : fills)
        if (cudaError_t e = cudaMemsetAsync(at, 0xff, bytes, stream); e != cudaSuccess)
          return cuda_failed(text, "filling the outputs with NaN", e);
      if (mokLayerBuildSchedule(d->layer, d->ids, mokIndexInt32, in.tokens, stream) != mokSuccess)
        return layer_failed(text, "cuda", "mokLayerBuildSchedule");
      return mokSuccess;
    }
    case Call::forward:
      cudaEventRecord(d->marks[0], stream);
      if (mokLayerForward(d->layer, &weights, d->x, topk_weights, d->out, stream) != mokSuccess)
        return layer_failed(text, "cuda", "mokLayerForward");
      cudaEventRecord(d->marks[1], stream);
      return mokSuccess;
    case Call::slots:
      if (mokLayerGetSlots(d->layer, d->slots, stream) != mokSuccess)
        return layer_failed(text, "cuda", "mokLayerGetSlots");
      return mokSuccess;
    case Call::backward:
      cudaEventRecord(d->marks[2], stream);
      if (mokLayerBackward(d->layer, &weights, topk_weights, d->dout, &grads, stream) != mokSuccess)
        return layer_failed(text, "cuda", "mokLayerBackward");
      cudaEventRecord(d->marks[3], stream);
      return mokSuccess;
    case Call::count: break;
  }
  return mokSuccess;
}

// Waits, bounded, for the stream; then (`check`) the layer's error record must be empty.
mokStatus_t finish(const SelftestSetup& setup, DeviceLayer* d, bool check, Text* text) {
  uint64_t deadline = core::now_ns() + static_cast<uint64_t>(setup.timeout_ms) * 1000000ull;
  cudaError_t e = cudaEventRecord(d->b.done, d->b.stream);
  if (e == cudaSuccess) e = wait_event(d->b.done, deadline);
  if (e == cudaErrorNotReady) {
    d->b.keep = true;
    text->add("the layer did not finish within %d ms (options.timeout_ms)", setup.timeout_ms);
    return mokTimeout;
  }
  if (e != cudaSuccess) return cuda_failed(text, "running the layer", e);
  if (!check) return mokSuccess;
  mokLayerError_t error = MOK_LAYER_ERROR_INIT;
  if (mokLayerGetError(d->layer, &error) != mokSuccess || error.status != mokSuccess) {
    text->add("the layer's error record holds %s: %s", mokGetStatusString(error.status), error.detail);
    return mokInternalError;
  }
  return mokSuccess;
}

// The forward's and the backward's times, from the events around them.
mokStatus_t times(const DeviceLayer& d, Results* r, Text* text) {
  cudaError_t e = cudaEventElapsedTime(&r->forward_ms, d.marks[0], d.marks[1]);
  if (e == cudaSuccess) e = cudaEventElapsedTime(&r->backward_ms, d.marks[2], d.marks[3]);
  return e == cudaSuccess ? mokSuccess : cuda_failed(text, "reading the passes' times", e);
}

mokStatus_t collect(const mokLayerConfig_t& c, bool bf16_gradients, const DeviceLayer& d, size_t th, size_t routes,
                    Results* r, Text* text) {
  cudaError_t e = download(d.out, th, &r->out);
  if (e == cudaSuccess) e = download(d.slots, th * c.top_k, &r->slots);
  if (e == cudaSuccess) e = download(d.dx, th, &r->dx);
  if (e == cudaSuccess) e = download(d.dw, routes, &r->dw);
  for (int i = 0; i < kGradients && e == cudaSuccess; ++i) {
    if (!d.gradients[i]) continue;  // a gradient the layer has not
    if (!bf16_gradients) {
      e = download(d.gradients[i], values(c, i), &r->gradients[i]);
      continue;
    }
    std::vector<bf16_t> bf16;
    e = download(d.gradients[i], values(c, i), &bf16);
    r->gradients[i] = as_floats(bf16);
  }
  if (e != cudaSuccess) return cuda_failed(text, "reading the layer's results", e);
  return times(d, r, text);
}

// A group of `executor`'s layers (mokExecutorCuda, or mokExecutorSm100) on the current device (a rank per Inputs, peers
// as device pointers, each on its own stream), `runs` times on one context (schedule, forward, slots, backward,
// main_grad from its start each time): results[rank][run] (with `outputs`; else only the times). Every rank's calls are
// enqueued before any is waited for; a rank whose call failed is still waited for, bounded, with the rest.
mokStatus_t run_cuda(const SelftestSetup& setup, mokLayerConfig_t c, const std::vector<Inputs>& in, bool bf16_gradients,
                     int runs, bool outputs, std::vector<std::vector<Results> >* results, Text* text,
                     mokExecutor_t executor = mokExecutorCuda) {
  c.executor = executor;
  size_t world = in.size();
  std::vector<DeviceLayer> ranks(world);
  std::vector<void*> peers;
  for (size_t q = 0; q < world; ++q) {
    if (mokStatus_t s = allocate(c, in[q], &ranks[q], text); s != mokSuccess) return s;
    peers.push_back(ranks[q].peer);
  }
  for (size_t q = 0; q < world; ++q) {
    mokLayerConfig_t own = c;
    own.rank = static_cast<int>(q);
    if (mokStatus_t s = create(own, peers.data(), &ranks[q], text); s != mokSuccess) return s;
  }
  results->assign(world, std::vector<Results>(static_cast<size_t>(runs)));
  std::vector<float> start(std::max(values(c, 0), values(c, 3)), kMainGradStart);  // the largest main_grad's
  for (int run = 0; run < runs; ++run) {
    for (DeviceLayer& d : ranks)
      for (int i = 0; !bf16_gradients && i < kGradients; ++i)  // main_grad back to its start
        if (cudaError_t e = d.gradients[i] ? cudaMemcpyAsync(d.gradients[i], start.data(), values(c, i) * 4,
                                                             cudaMemcpyHostToDevice, d.b.stream)
                                           : cudaSuccess;
            e != cudaSuccess)
          return cuda_failed(text, "resetting main_grad", e);
    mokStatus_t enqueued = mokSuccess;
    for (int call = 0; call < static_cast<int>(Call::count) && enqueued == mokSuccess; ++call)
      for (size_t q = 0; q < world && enqueued == mokSuccess; ++q)
        if ((enqueued = enqueue(c, bf16_gradients, in[q], static_cast<Call>(call), &ranks[q], text)) != mokSuccess)
          text->add(" (rank %zu); ", q);
    // Even after a call that failed midway, what was enqueued before it runs: wait for every rank, bounded.
    mokStatus_t finished = mokSuccess;
    bool timed_out = false;
    for (size_t q = 0; q < world; ++q) {
      mokStatus_t s = finish(setup, &ranks[q], enqueued == mokSuccess, text);
      timed_out = timed_out || s == mokTimeout;
      if (s != mokSuccess && finished == mokSuccess) {
        text->add(" (rank %zu); ", q);
        finished = s;
      }
    }
    for (DeviceLayer& d : ranks)  // a rank still running reads and writes every peer's buffer: free none
      d.b.keep = d.b.keep || timed_out;
    if (enqueued != mokSuccess) return enqueued;
    if (finished != mokSuccess) return finished;
    for (size_t q = 0; q < world; ++q) {
      Results& r = (*results)[q][static_cast<size_t>(run)];
      mokStatus_t s = outputs
                          ? collect(c, bf16_gradients, ranks[q], in[q].x.size(), in[q].topk_weights.size(), &r, text)
                          : times(ranks[q], &r, text);
      if (s != mokSuccess) return s;
    }
  }
  return mokSuccess;
}

template <class T>
bool within(const char* name, const std::vector<T>& got, const std::vector<T>& want, double start, Text* text) {
  double error =
      got.size() == want.size() ? core::normwise_difference(got.data(), want.data(), want.size(), start) : NAN;
  if (error <= core::kSplitOrderTolerance) return true;
  text->add("%s %.3g above the bound %g (core::kSplitOrderTolerance); ", name, error, core::kSplitOrderTolerance);
  return false;
}

// Each result within core::kSplitOrderTolerance of the host executor's, normwise: out, the y slots, dx, dw and every
// gradient of the layer of `in`.
bool near_host(const Inputs& in, const Results& got, const Results& host, bool bf16_gradients, Text* text) {
  const char* names[kGradients] = {"dW_gate",      "dW_up",          "dW_down",          "dW_shared_gate",
                                   "dW_shared_up", "dW_shared_down", "dW_shared_router", "db_gate",
                                   "db_up",        "db_down"};
  bool ok = within("out", got.out, host.out, 0, text) & within("y slots", got.slots, host.slots, 0, text);
  ok &= within("dx", got.dx, host.dx, 0, text) & within("dw", got.dw, host.dw, 0, text);
  double start = bf16_gradients ? 0.0 : kMainGradStart;  // main_grad's start is no part of the gradient
  for (int i = 0; i < kGradients; ++i)
    if (present(in, i)) ok &= within(names[i], got.gradients[i], host.gradients[i], start, text);
  return ok;
}

bool same_bits(const Results& a, const Results& b) {
  auto same = [](const auto& x, const auto& y) {  // (a gradient the layer has not: empty on both)
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
  };
  bool all = same(a.out, b.out) && same(a.slots, b.slots) && same(a.dx, b.dx) && same(a.dw, b.dw);
  for (int i = 0; i < kGradients; ++i) all = all && same(a.gradients[i], b.gradients[i]);
  return all;
}

}  // namespace

namespace {

// The group's layer of `executor` on setup.device against the host executor's group, rank by rank, with fp32 main_grad
// and with bf16 weight gradients. `in`: a rank's inputs each. Each rank within core::kSplitOrderTolerance (the GEMMs'
// fp32 sums in the tensor cores' order); the fused executor's run twice, with the same bits both times.
mokStatus_t check_group(const SelftestSetup& setup, const mokLayerConfig_t& c, const std::vector<Inputs>& in,
                        Text* text, mokExecutor_t executor = mokExecutorCuda) {
  int runs = executor == mokExecutorSm100 ? 2 : 1;
  for (bool bf16_gradients : {false, true}) {
    std::vector<Results> host;
    if (mokStatus_t s = run_host(c, in, bf16_gradients, &host, text); s != mokSuccess) return s;
    std::vector<std::vector<Results> > got;
    if (mokStatus_t s = run_cuda(setup, c, in, bf16_gradients, runs, true, &got, text, executor); s != mokSuccess)
      return s;
    for (size_t q = 0; q < in.size(); ++q) {
      bool near = near_host(in[q], got[q][0], host[q], bf16_gradients, text);
      bool steady = runs == 1 || same_bits(got[q][0], got[q][1]);
      if (!near || !steady) {
        text->add("rank %zu of %zu of executor '%s' is wrong (%s%s%s%s)", q, in.size(), mokExecutorName(executor),
                  steady ? "" : "other bits on its second run, ", mxfp8(c) ? "MXFP8, " : "",
                  present(in[q], kBiases) ? "expert biases, " : "",
                  bf16_gradients ? "bf16 weight gradients" : "fp32 main_grad");
        return mokInternalError;
      }
    }
  }
  return mokSuccess;
}

// Rank q's inputs from the seed: a token count of its own (the first rank max_tokens); expert biases or not.
std::vector<Inputs> draw_group(const mokLayerConfig_t& c, uint64_t seed, bool skewed, bool biased = false) {
  std::vector<Inputs> in;
  for (int q = 0; q < c.world; ++q) {
    int tokens = c.max_tokens - q * (c.max_tokens / (2 * c.world));
    in.push_back(draw(c, seed + static_cast<uint64_t>(q), skewed, tokens, biased));
  }
  return in;
}

// The fused executor's group (mokExecutorSm100) on setup.device, BF16 and MXFP8, against the host executor's group
// (check_group). Where the device runs no fused layer, said and not run.
mokStatus_t check_fused_group(const SelftestSetup& setup, const mokLayerConfig_t& c, Text* text) {
  int supported = 0;
  if (mokExecutorSupportsDevice(mokExecutorSm100, setup.device, &supported) != mokSuccess) {
    text->add("the fused executor not run: %s", mokGetLastError());
    return mokSuccess;
  }
  mokLayerConfig_t mx = c;
  mx.precision = mokPrecisionMXFP8;
  for (const mokLayerConfig_t& layer : {c, mx})
    if (mokStatus_t s = check_group(setup, layer, draw_group(layer, setup.seed, true), text, mokExecutorSm100);
        s != mokSuccess)
      return s;
  text->add("the fused executor's group (BF16 and MXFP8) within the bound, the same bits on each of two runs");
  return mokSuccess;
}

}  // namespace

// Three ranks on one GPU, each rank's buffers its own device memory and its peers' as device pointers, each on its
// own stream: the group's barriers, the dispatch's pulls and the combine's pushes between ranks.
mokStatus_t selftest_virtual_ranks(const SelftestSetup& setup, Text* text) {
  // The ranks' barrier kernels wait for each other, so their streams must run side by side: one hardware queue, or
  // launches that wait, would leave the first barrier waiting for kernels queued behind it.
  for (const char* serial : {"CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_LAUNCH_BLOCKING"}) {
    const char* value = std::getenv(serial);
    if (value && std::strcmp(value, "1") == 0) {
      text->add("%s=1 runs one stream at a time; several ranks on one GPU need their streams side by side", serial);
      return mokUnsupported;
    }
  }
  if (mokStatus_t s = open_gemm_device(setup, text); s != mokSuccess) return s;
  mokLayerConfig_t c = layer_config(setup.timeout_ms, 3);
  std::vector<Inputs> in = draw_group(c, setup.seed, true);
  text->add("seed %llu, a group of %d ranks of the cuda executor on device %d against the host executor's group: ",
            static_cast<unsigned long long>(setup.seed), c.world, setup.device);
  if (mokStatus_t s = check_group(setup, c, in, text); s != mokSuccess) return s;
  text->add("every rank within the bound (fp32 main_grad and bf16 weight gradients); ");
  return check_fused_group(setup, c, text);
}

mokStatus_t selftest_every_gpu(const SelftestSetup& setup, Text* text) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    text->add("cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? mokNoDevice : mokCudaError;
  }
  mokLayerConfig_t c = layer_config(setup.timeout_ms), mx = c;
  mx.precision = mokPrecisionMXFP8;
  // Expert biases in BF16: a biased MXFP8 forward would dequantise, and the block-scaled GEMMs would go unchecked.
  std::vector<Inputs> in = draw_group(c, setup.seed, true, true), mx_in = draw_group(mx, setup.seed, true);
  text->add(
      "seed %llu, the cuda executor's layer against the host executor's on each GPU (fp32 main_grad and bf16 "
      "weight gradients, BF16 with expert biases and MXFP8): ",
      static_cast<unsigned long long>(setup.seed));
  int ran = 0;
  for (int device = 0; device < count; ++device) {
    Text why;
    SelftestSetup on{device, setup.timeout_ms, setup.seed};
    int cc_major = 0;
    if (mokStatus_t s = open_gemm_device(on, &why, &cc_major); s == mokUnsupported) {
      text->add("device %d not run: %s; ", device, why.text);
      continue;
    } else if (s != mokSuccess) {
      text->add("device %d: %s", device, why.text);
      return s;
    }
    mokStatus_t s = check_group(on, c, in, text);
    if (s == mokSuccess) s = check_group(on, mx, mx_in, text);
    if (s != mokSuccess) {
      text->add(" on device %d", device);
      return s;
    }
    text->add("device %d within the bound; ", device);
    ++ran;
  }
  if (ran > 0) return mokSuccess;
  text->add("no GPU here runs the cuda executor (compute capability 10.x or 9.0 with this build's grouped GEMMs)");
  return mokUnsupported;
}

namespace {

// `runs` runs of one rank's layer of `c` on setup.device with `executor`, fp32 main_grad, inputs drawn from the seed.
mokStatus_t run_here(const SelftestSetup& setup, const mokLayerConfig_t& c, bool skewed, int runs, bool outputs,
                     Inputs* in, std::vector<Results>* results, Text* text, mokExecutor_t executor = mokExecutorCuda) {
  if (mokStatus_t s = open_gemm_device(setup, text); s != mokSuccess) return s;
  std::vector<Inputs> one = draw_group(c, setup.seed, skewed);
  std::vector<std::vector<Results> > ranks;
  mokStatus_t s = run_cuda(setup, c, one, false, runs, outputs, &ranks, text, executor);
  *in = one[0];
  if (s == mokSuccess) *results = ranks[0];
  return s;
}

// The median forward and backward times of `runs` runs (the first warms up and is not counted).
void median_times(const std::vector<Results>& runs, float* forward_ms, float* backward_ms) {
  std::vector<float> forward, backward;
  for (size_t i = 1; i < runs.size(); ++i) {
    forward.push_back(runs[i].forward_ms);
    backward.push_back(runs[i].backward_ms);
  }
  std::sort(forward.begin(), forward.end());
  std::sort(backward.begin(), backward.end());
  *forward_ms = forward[forward.size() / 2];
  *backward_ms = backward[backward.size() / 2];
}

// The fused executor's line after the split executor's (forward f, backward b ms), on a device that runs it: its
// workers one CTA per SM (8 of them comm workers), its times and their ratios to the split executor's.
mokStatus_t fused_benchmark(const SelftestSetup& setup, mokLayerConfig_t c, float f, float b, Text* text) {
  int supported = 0, sms = 0;
  if (mokExecutorSupportsDevice(mokExecutorSm100, setup.device, &supported) != mokSuccess) {
    text->add("; the fused executor not run: %s", mokGetLastError());
    return mokSuccess;
  }
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, setup.device); e != cudaSuccess)
    return cuda_failed(text, "reading the SM count", e);
  c.comm_workers = 8;
  c.compute_workers = std::max(1, std::min(256, sms - c.comm_workers));  // libmok's limit: 256
  Inputs in;
  std::vector<Results> runs;
  if (mokStatus_t s = run_here(setup, c, false, 3, false, &in, &runs, text, mokExecutorSm100); s != mokSuccess)
    return s;
  float ff = 0, fb = 0;
  median_times(runs, &ff, &fb);
  text->add(
      "; the fused executor (one kernel per pass, 1-CTA tcgen05 tiles over TMA-loaded panels, row jobs over the CTA, "
      "unchanged rows in bulk copies; %d comm and %d compute CTAs): forward %.3f ms (%.2fx the split executor's time), "
      "backward %.3f ms (%.2fx), the median of %zu runs",
      c.comm_workers, c.compute_workers, static_cast<double>(ff), static_cast<double>(ff / f), static_cast<double>(fb),
      static_cast<double>(fb / b), runs.size() - 1);
  return mokSuccess;
}

}  // namespace

mokStatus_t selftest_determinism(const SelftestSetup& setup, Text* text) {
  Inputs in;
  std::vector<Results> runs;
  if (mokStatus_t s = run_here(setup, layer_config(setup.timeout_ms), true, 3, true, &in, &runs, text); s != mokSuccess)
    return s;
  text->add("seed %llu: the cuda executor's layer three times on one context: ",
            static_cast<unsigned long long>(setup.seed));
  for (size_t i = 1; i < runs.size(); ++i)
    if (!same_bits(runs[0], runs[i])) {
      text->add("run %zu gave other bits than run 0 (the layer must be bitwise deterministic)", i);
      return mokInternalError;
    }
  text->add("out, the y slots, dx, dw and every weight gradient the same bits each time");
  return mokSuccess;
}

mokStatus_t selftest_benchmark(const SelftestSetup& setup, Text* text) {
  mokLayerConfig_t c = benchmark_config(setup.timeout_ms);
  Inputs in;
  std::vector<Results> runs;
  if (mokStatus_t s = run_here(setup, c, false, 5, false, &in, &runs, text); s != mokSuccess) return s;
  float f = 0, b = 0;
  median_times(runs, &f, &b);
  int64_t routed = std::count_if(in.ids.begin(), in.ids.end(), [](int32_t id) { return id >= 0; });
  double flops = 6.0 * static_cast<double>(routed) * c.hidden * c.intermediate;  // gate, up, down: 2 flops a MAC
  text->add(
      "the cuda executor (split passes, the first GPU path) at %d tokens, top-%d, %d experts, H %d, I %d, BF16: "
      "forward %.3f ms (%.1f TFLOP/s), backward %.3f ms (%.1f TFLOP/s at twice the forward's FLOPs), the median of "
      "%zu runs by CUDA events",
      c.max_tokens, c.top_k, c.experts_per_rank, c.hidden, c.intermediate, static_cast<double>(f), flops / (f * 1e9),
      static_cast<double>(b), 2 * flops / (b * 1e9), runs.size() - 1);
  return fused_benchmark(setup, c, f, b, text);
}
#endif

}  // namespace mok::cuda
