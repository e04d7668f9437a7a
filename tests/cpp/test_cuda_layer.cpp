// The cuda executor (mokExecutorCuda) and the fused one (mokExecutorSm100, its layer with core's whole pass as one
// kernel) through the C ABI. Without a GPU: its sizes (core's workspace without the workers' buffers and the split
// executor's own after it, a group's tables; the fused executor's core workspace without the host's GEMM scratch and
// only the tables after it), the layers it refuses and why, by field, and creation's refusals (shared memory, no
// GPU).
// On a GPU (skipped here, saying so): the self-test's stages over the layer (a group of three ranks on one GPU and
// one rank on every GPU against the host executor, the same bits across runs), host memory
// refused by name, and an MXFP8 layer created on 10.x and 9.0 alike, its backward refusing host colwise weights by
// name.
#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "check.hpp"
#include "core/split_workspace.hpp"
#include "group.hpp"
#include "mok/mok.h"
#include "small_config.h"

using namespace mok_test;
using mok::core::bf16_t;

namespace {

mokLayerConfig_t cuda_config() {
  mokLayerConfig_t c = small_config();
  c.executor = mokExecutorCuda;
  c.shared_intermediate = 24;
  return c;
}

void expect(mokStatus_t got, mokStatus_t want, const char* needle, const char* what) {
  CHECK_MSG(got == want && std::strstr(mokGetLastError(), needle) != nullptr, "%s: %s, '%s' (want %s naming '%s')",
            what, mokGetStatusString(got), mokGetLastError(), mokGetStatusString(want), needle);
}

// A workspace's bytes per worker, as mokLayerGetSizes gives them: its growth from 1 to 9 compute workers, over 8.
size_t bytes_per_worker(mokLayerConfig_t c) {
  mokLayerSizes_t one = MOK_LAYER_SIZES_INIT, nine = MOK_LAYER_SIZES_INIT;
  c.compute_workers = 1;
  CHECK_MSG(mokLayerGetSizes(&c, &one) == mokSuccess, "%s", mokGetLastError());
  c.compute_workers = 9;
  CHECK_MSG(mokLayerGetSizes(&c, &nine) == mokSuccess, "%s", mokGetLastError());
  return (nine.workspace_bytes - one.workspace_bytes) / 8;
}

bool have_gpu(const char* test) {
  int supported = 0;
  if (mokExecutorSupportsDevice(mokExecutorCuda, 0, &supported) == mokSuccess) return true;
  std::printf("  %s: skipped: device 0 runs no mokExecutorCuda layer: %s\n", test, mokGetLastError());
  return false;
}

}  // namespace

TEST(cuda_executor_is_compiled_and_sizes_core_then_its_own_buffers) {
  int compiled = 0;
  CHECK(mokExecutorCompiled(mokExecutorCuda, &compiled) == mokSuccess && compiled == 1);
  CHECK(std::strcmp(mokExecutorName(mokExecutorCuda), "cuda") == 0);
  mokLayerConfig_t cuda = cuda_config(), host = cuda;
  host.executor = mokExecutorHost;
  mokLayerSizes_t on_cuda = MOK_LAYER_SIZES_INIT, on_host = MOK_LAYER_SIZES_INIT;
  CHECK(mokLayerGetSizes(&cuda, &on_cuda) == mokSuccess);
  CHECK(mokLayerGetSizes(&host, &on_host) == mokSuccess);
  CHECK(on_cuda.peer_bytes == on_host.peer_bytes);
  // Its own buffers after core's: at least dx's fp32 first term, every weight gradient's fp32 sum, the shared
  // expert's buffers and the sigmoid table.
  mok::core::LayerShape s = shape_of(cuda);
  size_t sums = 0;
  for (int i = 0; i < mok::core::kGradientSums; ++i) sums += mok::core::gradient_sum_values(s, i);
  size_t rows = mok::core::shared_rows(s), own = (mok::core::out_ring_rows(s) * s.hidden + sums) * 4 +
                                                 rows * (4 * 24 + s.hidden) * 2 + rows * (1 + s.hidden) * 4 +
                                                 mok::core::kSigmoidTableSize * 4;
  size_t core = mok::core::local_layout(s).bytes;
  CHECK_MSG(on_cuda.workspace_bytes >= core + own, "cuda workspace %zu, core %zu + own %zu", on_cuda.workspace_bytes,
            core, own);
  // Its kernels run no core worker: core's part holds no worker's buffers, weight-gradient slots or accumulators,
  // so it is smaller than the host executor's and does not grow with the config's workers.
  CHECK_MSG(core < on_host.workspace_bytes, "core's part %zu, the host executor's workspace %zu", core,
            on_host.workspace_bytes);
  CHECK_MSG(bytes_per_worker(cuda) == 0 && bytes_per_worker(host) > 0, "per worker: cuda %zu, host %zu",
            bytes_per_worker(cuda), bytes_per_worker(host));
}

TEST(layers_it_does_not_run_are_refused_by_field_when_sized) {
  struct Case {
    const char* field;
    void (*set)(mokLayerConfig_t*);
  } cases[] = {
      {"config.expert_padding",
       [](mokLayerConfig_t* c) {  // the host's MXFP8 rule (a multiple of 32) holds, the block-scaled GEMM's (128) not
         c->precision = mokPrecisionMXFP8, c->hidden = 32, c->intermediate = 32;
         c->expert_padding = 64, c->minibatch = 64, c->macrobatch = 128;
       }},
      {"config.hidden",
       [](mokLayerConfig_t* c) {  // 16-byte rows, not whole 32-code blocks
         c->precision = mokPrecisionMXFP8, c->hidden = 48, c->intermediate = 32;
         c->expert_padding = 128, c->minibatch = 128, c->macrobatch = 256;
       }},
      {"config.intermediate",
       [](mokLayerConfig_t* c) {
         c->precision = mokPrecisionMXFP8, c->hidden = 32, c->intermediate = 48;
         c->expert_padding = 128, c->minibatch = 128, c->macrobatch = 256;
       }},
      {"config.hidden", [](mokLayerConfig_t* c) { c->hidden = 20; }},
      {"config.intermediate", [](mokLayerConfig_t* c) { c->intermediate = 12; }},
      {"config.shared_intermediate", [](mokLayerConfig_t* c) { c->shared_intermediate = 28; }},
  };
  for (const Case& k : cases) {
    mokLayerConfig_t c = cuda_config();
    k.set(&c);
    mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
    expect(mokLayerGetSizes(&c, &sizes), mokUnsupported, k.field, k.field);
    c.executor = mokExecutorHost;  // the host executor runs each of them
    CHECK_MSG(mokLayerGetSizes(&c, &sizes) == mokSuccess, "%s on the host: '%s'", k.field, mokGetLastError());
  }
}

// An MXFP8 layer of 128-row tiles and whole 32-code blocks is one it runs (docs/gpu.md), sized with its own buffers
// after core's MXFP8 layout: the staging where dispatch and SwiGLU quantise, and the dequantised operands' scratch.
TEST(an_mxfp8_layer_of_128_row_tiles_is_sized) {
  mokLayerConfig_t mx = cuda_config(), host = mx;
  mx.precision = mokPrecisionMXFP8, mx.hidden = 64, mx.intermediate = 32;
  mx.expert_padding = 128, mx.minibatch = 128, mx.macrobatch = 256;
  host = mx;
  host.executor = mokExecutorHost;
  mokLayerSizes_t on_cuda = MOK_LAYER_SIZES_INIT, on_host = MOK_LAYER_SIZES_INIT;
  CHECK_MSG(mokLayerGetSizes(&mx, &on_cuda) == mokSuccess, "MXFP8: '%s'", mokGetLastError());
  CHECK(mokLayerGetSizes(&host, &on_host) == mokSuccess);
  mok::core::SplitLayout own = mok::core::split_layout(shape_of(mx), 64);
  CHECK(own.staging_values > 0);
  mok::core::LayerShape s = shape_of(mx);
  size_t a = mok::core::dequantised_a_values(s), b = mok::core::dequantised_b_values(s);
  size_t weights = static_cast<size_t>(mx.experts_per_rank) * 64 * 32;  // B's largest: the experts' weights or a ring
  CHECK_MSG(a == 256u * 64 && b == (weights > a ? weights : a) && own.dequantised_b >= own.dequantised_a + 2 * a &&
                own.bytes >= own.dequantised_b + 2 * b,
            "dequantised scratch of %zu and %zu values at %zu and %zu", a, b, own.dequantised_a, own.dequantised_b);
  size_t core = mok::core::local_layout(s).bytes;
  CHECK_MSG(on_cuda.peer_bytes == on_host.peer_bytes && on_cuda.workspace_bytes >= core + own.bytes,
            "cuda %zu / %zu, host's peer %zu, core %zu, own %zu", on_cuda.workspace_bytes, on_cuda.peer_bytes,
            on_host.peer_bytes, core, own.bytes);
}

// A group: every rank's peer pointer and token count in the device's tables, the group's state after them; the
// peer buffer is core's, as the host executor's.
TEST(a_group_is_sized_with_its_tables) {
  mokLayerConfig_t one = cuda_config(), group = one, host = one;
  group.world = 3, group.rank = 2;
  host.world = 3, host.executor = mokExecutorHost;
  mokLayerSizes_t a = MOK_LAYER_SIZES_INIT, b = MOK_LAYER_SIZES_INIT, h = MOK_LAYER_SIZES_INIT;
  CHECK_MSG(mokLayerGetSizes(&group, &b) == mokSuccess, "world 3: '%s'", mokGetLastError());
  CHECK(mokLayerGetSizes(&one, &a) == mokSuccess && mokLayerGetSizes(&host, &h) == mokSuccess);
  CHECK_MSG(b.peer_bytes == h.peer_bytes, "peer %zu, host's %zu", b.peer_bytes, h.peer_bytes);
  mok::core::LayerShape s = shape_of(group);
  mok::core::SplitLayout l = mok::core::split_layout(s, 64);
  // The tables hold world entries each, and the group's state follows them, before the GEMMs' argument block.
  CHECK(l.headers >= l.peers + 3 * sizeof(char*) && l.routing_ids >= l.headers + 3 * sizeof(void*));
  CHECK(l.routing_tokens >= l.routing_ids + 3 * sizeof(void*) && l.group >= l.routing_tokens + 3 * sizeof(int32_t));
  CHECK(l.group % alignof(mok::core::GroupState) == 0 && l.gemm_arguments >= l.group + sizeof(mok::core::GroupState));
  size_t core = mok::core::local_layout(s).bytes;
  CHECK_MSG(b.workspace_bytes >= core + l.bytes, "cuda %zu, core %zu + own %zu", b.workspace_bytes, core, l.bytes);
}

TEST(creation_wants_peer_pointers_and_a_device_that_runs_it) {
  mokLayerConfig_t c = cuda_config();
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  CHECK(mokLayerGetSizes(&c, &sizes) == mokSuccess);
  std::vector<char> workspace(sizes.workspace_bytes + 64), peer(sizes.peer_bytes + 64);
  void* base = peer.data() + (64 - reinterpret_cast<uintptr_t>(peer.data()) % 64);
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  m.shm_name = "mok-test-cuda";
  m.workspace = workspace.data() + (64 - reinterpret_cast<uintptr_t>(workspace.data()) % 64);
  m.workspace_bytes = sizes.workspace_bytes;
  mokLayer_t layer = nullptr;
  expect(mokLayerCreate(&c, &m, &layer), mokInvalidArgument, "memory.shm_name", "shared memory");
  m.shm_name = nullptr;
  m.peer_bases = &base;
  int supported = 0;
  mokStatus_t query = mokExecutorSupportsDevice(mokExecutorCuda, 0, &supported);
  // Host memory: without a GPU the device is refused first, as the query refuses it; with one, the memory.
  if (query == mokSuccess)
    expect(mokLayerCreate(&c, &m, &layer), mokInvalidArgument, "memory.workspace", "host memory");
  else
    expect(mokLayerCreate(&c, &m, &layer), query, "argument 'config.executor' (cuda)", "no usable device");
  CHECK(layer == nullptr);
}

// The fused executor's workspace holds what its pass uses: core's buffers without the host's tile-GEMM scratch (its
// tiles live in shared and tensor memory; a worker keeps MXFP8's staging, a compute worker the shared expert's
// chunk and a weight-gradient task's sums), then of the split executor's only the device's tables, and a worker's
// tensor maps for its TMA loads (core::kPanelMaps of 128 bytes). Its peer buffer is
// the cuda executor's, and its query and creation refuse a machine without a usable GPU as the cuda executor's do,
// naming it.
TEST(fused_executor_is_sized_for_its_pass_and_refused_as_the_cuda_executor) {
  int compiled = 0;
  CHECK(mokExecutorCompiled(mokExecutorSm100, &compiled) == mokSuccess);
  if (!compiled) {  // a build without a Blackwell target
    std::printf("  skipped: this libmok has no fused executor\n");
    return;
  }
  mokLayerConfig_t bf16 = cuda_config(), mx = bf16;
  mx.precision = mokPrecisionMXFP8, mx.hidden = 64, mx.intermediate = 32;
  mx.expert_padding = 128, mx.minibatch = 128, mx.macrobatch = 256;
  for (mokLayerConfig_t cuda : {bf16, mx}) {
    mokLayerConfig_t fused = cuda, host = cuda;
    fused.executor = mokExecutorSm100, host.executor = mokExecutorHost;
    mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT, on_cuda = MOK_LAYER_SIZES_INIT;
    CHECK_MSG(mokLayerGetSizes(&fused, &sizes) == mokSuccess, "%s", mokGetLastError());
    CHECK(mokLayerGetSizes(&cuda, &on_cuda) == mokSuccess);
    CHECK(sizes.peer_bytes == on_cuda.peer_bytes);
    mok::core::LayerShape s = shape_of(fused);
    mok::core::LocalLayout core = mok::core::local_layout(s);
    size_t maps = mok::core::kPanelMaps * mok::core::kTensorMapBytes;  // a worker's
    size_t tables = mok::core::kSigmoidTableSize * 4 + static_cast<size_t>(s.world) * (3 * sizeof(void*) + 4) +
                    sizeof(mok::core::GroupState) + sizeof(mok::core::TaskGraph) + 7 * mok::core::kGemmArgumentAlign +
                    static_cast<size_t>(s.comm_workers + s.compute_workers) * maps + mok::core::kTensorMapBytes;
    CHECK_MSG(sizes.workspace_bytes <= core.bytes + mok::core::kGemmArgumentAlign + tables,
              "%s: fused workspace %zu, core's %zu + the tables' %zu",
              cuda.precision == mokPrecisionMXFP8 ? "MXFP8" : "BF16", sizes.workspace_bytes, core.bytes, tables);
    size_t staging = cuda.precision == mokPrecisionMXFP8
                         ? 2 * std::max(mok::core::mx_staging_values(s), mok::core::mx_swiglu_staging_values(s))
                         : 0;
    size_t worker = staging + core.chunk_values * 2 + core.sums_floats * 4;
    size_t gemm = 4 * mok::core::gemm_scratch_floats(s.expert_padding, s.hidden, s.hidden, true);
    CHECK_MSG(
        core.scratch_floats * 4 >= staging && bytes_per_worker(fused) <= worker + maps + 3 * mok::core::kAlign &&
            bytes_per_worker(host) >= worker - staging + gemm,  // the host's scratch holds either
        "per worker: fused %zu (its staging %zu, chunk and sums %zu, maps %zu), host %zu (a tile's GEMM scratch %zu)",
        bytes_per_worker(fused), staging, worker - staging, maps, bytes_per_worker(host), gemm);
  }
  mokLayerConfig_t fused = bf16;
  fused.executor = mokExecutorSm100;
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  CHECK(mokLayerGetSizes(&fused, &sizes) == mokSuccess);
  int supported = 0;
  mokStatus_t query = mokExecutorSupportsDevice(mokExecutorSm100, 0, &supported);
  if (query == mokSuccess) return;  // a Blackwell GPU: the tests on a GPU run its layer
  CHECK_MSG(supported == 0, "the fused executor refuses device 0 (%s), yet says it supports it", mokGetLastError());
  std::vector<char> workspace(sizes.workspace_bytes + 64), peer(sizes.peer_bytes + 64);
  void* base = peer.data() + (64 - reinterpret_cast<uintptr_t>(peer.data()) % 64);
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  m.peer_bases = &base;
  m.workspace = workspace.data() + (64 - reinterpret_cast<uintptr_t>(workspace.data()) % 64);
  m.workspace_bytes = sizes.workspace_bytes;
  mokLayer_t layer = nullptr;
  expect(mokLayerCreate(&fused, &m, &layer), query, "argument 'config.executor' (sm100)", "no device that runs it");
  CHECK(layer == nullptr);
}

// ---- on a GPU ----

namespace {

struct DeviceBlock {
  void* p = nullptr;
  explicit DeviceBlock(size_t bytes) { CHECK(cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess); }
  ~DeviceBlock() { cudaFree(p); }
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
};

mokLayerSizes_t sizes_of(const mokLayerConfig_t& c) {
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  CHECK_MSG(mokLayerGetSizes(&c, &sizes) == mokSuccess, "sizes: %s", mokGetLastError());
  return sizes;
}

// A one-rank layer's device memory, as mokLayerCreate takes it.
struct LayerMemory {
  explicit LayerMemory(const mokLayerConfig_t& c)
      : sizes(sizes_of(c)), workspace(sizes.workspace_bytes), peer(sizes.peer_bytes) {
    memory.peer_bases = &peer.p;
    memory.workspace = workspace.p;
    memory.workspace_bytes = sizes.workspace_bytes;
  }
  mokLayerSizes_t sizes;
  DeviceBlock workspace, peer;
  mokLayerMemory_t memory = MOK_LAYER_MEMORY_INIT;
};

// Every route of every token to expert 0, in a schedule built on the device.
void build_schedule(mokLayer_t layer, const mokLayerConfig_t& c) {
  std::vector<int32_t> ids(static_cast<size_t>(c.max_tokens) * c.top_k, 0);
  DeviceBlock device_ids(ids.size() * 4);
  CHECK(cudaMemcpy(device_ids.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(mokLayerBuildSchedule(layer, device_ids.p, mokIndexInt32, c.max_tokens, nullptr) == mokSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);  // before device_ids is freed
}

void stage_passes(mokSelftestStage_t stage, const char* says) {
  mokSelftestOptions_t options = MOK_SELFTEST_OPTIONS_INIT;
  options.seed = seed();
  mokSelftestReport_t report = MOK_SELFTEST_REPORT_INIT;
  mokStatus_t status = mokSelftestRun(stage, &options, &report);
  CHECK_MSG(status == mokSuccess && std::strstr(report.message, says) != nullptr, "%s: %s: %s",
            mokSelftestStageName(stage), mokGetStatusString(status), report.message);
}

}  // namespace

// The layer against the host executor, a group of three ranks on one GPU and one rank on every GPU (fp32 main_grad and
// bf16 gradients, the y slots), and three runs with the same bits: the self-test's stages (cuda/selftest_layer.cpp),
// which a user runs first.
TEST(layer_on_the_gpu_matches_the_host_executor_and_itself) {
  if (!have_gpu("layer_on_the_gpu_matches_the_host_executor_and_itself")) return;
  stage_passes(mokSelftestVirtualRanks, "every rank within the bound");
  int fused = 0;  // on 10.x the same stage runs the fused executor's group too, twice with the same bits
  if (mokExecutorSupportsDevice(mokExecutorSm100, 0, &fused) == mokSuccess)
    stage_passes(mokSelftestVirtualRanks,
                 "the fused executor's group (BF16 and MXFP8) within the bound, the same bits");
  stage_passes(mokSelftestEveryGpu, "within the bound");
  stage_passes(mokSelftestDeterminism, "the same bits each time");
}

// A host tensor is refused by name, before anything is enqueued: x, and an expert bias in host memory.
TEST(host_tensors_are_refused_on_the_gpu) {
  if (!have_gpu("host_tensors_are_refused_on_the_gpu")) return;
  mokLayerConfig_t c = cuda_config();
  c.shared_intermediate = 0;  // the routed experts' weights are all this layer needs
  LayerMemory m(c);
  mokLayer_t layer = nullptr;
  CHECK_MSG(mokLayerCreate(&c, &m.memory, &layer) == mokSuccess, "create: %s", mokGetLastError());
  size_t th = static_cast<size_t>(c.max_tokens) * c.hidden, eih = static_cast<size_t>(c.experts_per_rank) * 8 * 16;
  size_t routes = static_cast<size_t>(c.max_tokens) * c.top_k;
  DeviceBlock x(th * 2), out(th * 2), tw(routes * 4), w(eih * 2);
  build_schedule(layer, c);
  mokLayerWeights_t weights = MOK_LAYER_WEIGHTS_INIT;
  weights.gate = weights.up = weights.down = w.p;
  std::vector<bf16_t> host_x(th);
  expect(mokLayerForward(layer, &weights, host_x.data(), static_cast<float*>(tw.p), out.p, nullptr), mokInvalidArgument,
         "argument 'x'", "host x");
  std::vector<bf16_t> host_bias(eih);
  weights.gate_bias = host_bias.data();
  expect(mokLayerForward(layer, &weights, x.p, static_cast<float*>(tw.p), out.p, nullptr), mokInvalidArgument,
         "weights.gate_bias", "a host expert bias");
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  mokLayerDestroy(layer);
}

// An MXFP8 layer: created on compute capability 10.x and 9.0 alike (the forward's GEMMs and dgrad_h block-scaled on
// 10.x, every other over dequantised operands); a backward whose colwise weights are host memory, or whose down
// colwise form is off TMA's 16 bytes, is refused by name before anything is enqueued.
TEST(an_mxfp8_layer_is_created_and_refuses_host_colwise_weights) {
  if (!have_gpu("an_mxfp8_layer_is_created_and_refuses_host_colwise_weights")) return;
  mokLayerConfig_t c = cuda_config();
  c.shared_intermediate = 0;
  c.precision = mokPrecisionMXFP8, c.hidden = 32, c.intermediate = 32;
  c.expert_padding = 128, c.minibatch = 128, c.macrobatch = 256;
  LayerMemory m(c);
  mokLayer_t layer = nullptr;
  CHECK_MSG(mokLayerCreate(&c, &m.memory, &layer) == mokSuccess, "create: %s", mokGetLastError());
  if (!layer) return;
  // Arguments the C ABI's checks pass (their bytes are never read): a schedule, every weight and gradient.
  size_t th = static_cast<size_t>(c.max_tokens) * c.hidden, eih = static_cast<size_t>(c.experts_per_rank) * 32 * 32;
  size_t routes = static_cast<size_t>(c.max_tokens) * c.top_k;
  DeviceBlock dout(th * 2), dx(th * 2), tw(routes * 4), dw(routes * 4), w(eih * 4);
  std::vector<uint8_t> host(eih * 4);
  build_schedule(layer, c);
  const auto* bytes = static_cast<const uint8_t*>(w.p);
  mokLayerWeights_t weights = MOK_LAYER_WEIGHTS_INIT;
  for (mokMxfp8Matrix_t* matrix :
       {&weights.gate_rowwise, &weights.up_rowwise, &weights.down_rowwise, &weights.up_colwise, &weights.down_colwise})
    *matrix = mokMxfp8Matrix_t{bytes, bytes};
  weights.gate_colwise = mokMxfp8Matrix_t{host.data(), bytes};
  mokLayerGrads_t grads = MOK_LAYER_GRADS_INIT;
  grads.dx = dx.p;
  grads.dtopk_weights = static_cast<float*>(dw.p);
  grads.dgate = grads.dup = grads.ddown = w.p;
  expect(mokLayerBackward(layer, &weights, static_cast<float*>(tw.p), dout.p, &grads, nullptr), mokInvalidArgument,
         "weights.gate_colwise.data", "a host colwise weight");
  weights.gate_colwise = mokMxfp8Matrix_t{bytes, bytes};
  weights.down_colwise = mokMxfp8Matrix_t{bytes + 8, bytes};  // dgrad_h's B, which TMA loads on 10.x
  expect(mokLayerBackward(layer, &weights, static_cast<float*>(tw.p), dout.p, &grads, nullptr), mokInvalidArgument,
         "weights.down_colwise.data", "down's colwise codes off 16 bytes");
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  mokLayerDestroy(layer);
}

int main(int argc, char** argv) {
  return run_all(argc, argv);
}
