// The C ABI's bad-input catalogue: each case returns its status, a detail naming the argument, and
// writes nothing.
#include <cmath>

#include "group.hpp"

using namespace mok_test;

namespace {

void expect(mokStatus_t got, mokStatus_t want, const char* names, int line) {
  const char* detail = mokGetLastError();
  bool ok = got == want && std::strstr(detail, names) != nullptr;
  CHECK_MSG(ok, "line %d: got %s with '%s'; want %s naming '%s'", line, mokGetStatusString(got), detail,
            mokGetStatusString(want), names);
}
#define EXPECT(call, status, names) expect((call), (status), (names), __LINE__)

mokLayerConfig_t good_config() {
  mokLayerConfig_t c = MOK_LAYER_CONFIG_INIT;
  c.experts_per_rank = 2;
  c.hidden = 16;
  c.intermediate = 8;
  c.top_k = 2;
  c.max_tokens = 4;
  c.expert_padding = 8;
  c.minibatch = 16;
  c.macrobatch = 32;
  return c;
}

// A one-rank context: its collective calls complete on this thread alone.
struct Solo {
  mokLayerConfig_t config = good_config();
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  std::unique_ptr<AlignedBuffer> peer, work;
  void* bases[1];
  mokLayerMemory_t memory = MOK_LAYER_MEMORY_INIT;
  mokLayer_t layer = nullptr;

  explicit Solo(mokPrecision_t precision = mokPrecisionBF16) {
    config.precision = precision;
    if (precision == mokPrecisionMXFP8) config.expert_padding = config.minibatch = config.macrobatch = 32;
    CHECK(mokLayerGetSizes(&config, &sizes) == mokSuccess);
    peer.reset(new AlignedBuffer(sizes.peer_bytes));
    work.reset(new AlignedBuffer(sizes.workspace_bytes));
    bases[0] = peer->p;
    memory.peer_bases = bases;
    memory.workspace = work->p;
    memory.workspace_bytes = sizes.workspace_bytes;
  }
  ~Solo() { mokLayerDestroy(layer); }
  void create() { CHECK_MSG(mokLayerCreate(&config, &memory, &layer) == mokSuccess, "%s", mokGetLastError()); }
};

template <class Edit>
void expect_config(Edit edit, const char* names, int line) {
  mokLayerConfig_t c = good_config();
  edit(c);
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  expect(mokLayerGetSizes(&c, &sizes), mokInvalidArgument, names, line);
  CHECK(sizes.peer_bytes == 0 && sizes.workspace_bytes == 0);  // nothing written
}
#define EXPECT_CONFIG(edit, names) expect_config([](mokLayerConfig_t& c) { edit; }, (names), __LINE__)

}  // namespace

TEST(config_rules) {
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  EXPECT(mokLayerGetSizes(nullptr, &sizes), mokInvalidArgument, "'config'");
  mokLayerConfig_t c = good_config();
  EXPECT(mokLayerGetSizes(&c, nullptr), mokInvalidArgument, "'sizes'");
  EXPECT_CONFIG(c.size = 0, "MOK_LAYER_CONFIG_INIT");
  EXPECT_CONFIG(c.world = 0, "config.world");
  EXPECT_CONFIG(c.world = 73, "config.world");
  EXPECT_CONFIG(c.rank = 1, "config.rank");  // rank >= world
  EXPECT_CONFIG(c.rank = -1, "config.rank");
  EXPECT_CONFIG(c.experts_per_rank = 0, "config.experts_per_rank");
  EXPECT_CONFIG(c.hidden = 0, "config.hidden");
  EXPECT_CONFIG(c.intermediate = 0, "config.intermediate");
  EXPECT_CONFIG(c.top_k = 0, "config.top_k");
  EXPECT_CONFIG(c.max_tokens = 0, "config.max_tokens");
  EXPECT_CONFIG(c.shared_intermediate = -1, "config.shared_intermediate");
  EXPECT_CONFIG(c.precision = static_cast<mokPrecision_t>(7), "config.precision");
  EXPECT_CONFIG(c.swiglu_limit = -1.0f, "config.swiglu_limit");
  EXPECT_CONFIG(c.swiglu_limit = NAN, "config.swiglu_limit");
  EXPECT_CONFIG(c.expert_padding = 0, "config.expert_padding");
  EXPECT_CONFIG(c.precision = mokPrecisionMXFP8, "config.expert_padding");  // 8 is not a multiple of 32
  EXPECT_CONFIG(c.minibatch = 12, "config.minibatch");                      // not a multiple of padding 8
  EXPECT_CONFIG(c.macrobatch = 8, "config.macrobatch");                     // smaller than minibatch 16
  EXPECT_CONFIG(c.macrobatch = 40, "config.macrobatch");                    // not a multiple of minibatch
  EXPECT_CONFIG(c.comm_workers = 0, "config.comm_workers");
  EXPECT_CONFIG(c.compute_workers = 0, "config.compute_workers");
  EXPECT_CONFIG(c.timeout_ms = 0, "config.timeout_ms");
  EXPECT_CONFIG((c.world = 72, c.max_tokens = 1 << 24, c.top_k = 64), "'config'");  // not addressable
  EXPECT_CONFIG(c.executor = static_cast<mokExecutor_t>(9), "config.executor");
  c = good_config();
  c.executor = mokExecutorSm100;
  EXPECT(mokLayerGetSizes(&c, &sizes), mokUnsupported, "config.executor");
}

TEST(memory_rules) {
  Solo s;
  mokLayer_t untouched = reinterpret_cast<mokLayer_t>(0x1);
  mokLayer_t out = untouched;
  EXPECT(mokLayerCreate(&s.config, nullptr, &out), mokInvalidArgument, "'memory'");
  EXPECT(mokLayerCreate(&s.config, &s.memory, nullptr), mokInvalidArgument, "'layer'");
  mokLayerMemory_t m = s.memory;
  m.shm_name = "both";
  EXPECT(mokLayerCreate(&s.config, &m, &out), mokInvalidArgument, "memory.shm_name");
  m = s.memory;
  m.peer_bases = nullptr;
  EXPECT(mokLayerCreate(&s.config, &m, &out), mokInvalidArgument, "memory.peer_bases");
  m = s.memory;
  m.peer_bases = nullptr;
  m.shm_name = "no/slashes";
  EXPECT(mokLayerCreate(&s.config, &m, &out), mokInvalidArgument, "memory.shm_name");
  void* null_base[1] = {nullptr};
  m = s.memory;
  m.peer_bases = null_base;
  EXPECT(mokLayerCreate(&s.config, &m, &out), mokInvalidArgument, "memory.peer_bases[0]");
  void* odd_base[1] = {static_cast<char*>(s.peer->p) + 8};
  m.peer_bases = odd_base;
  EXPECT(mokLayerCreate(&s.config, &m, &out), mokInvalidArgument, "memory.peer_bases[0]");
  m = s.memory;
  m.workspace = nullptr;
  EXPECT(mokLayerCreate(&s.config, &m, &out), mokInvalidArgument, "memory.workspace");
  m.workspace = static_cast<char*>(s.work->p) + 4;
  EXPECT(mokLayerCreate(&s.config, &m, &out), mokInvalidArgument, "memory.workspace");
  m = s.memory;
  m.workspace_bytes = s.sizes.workspace_bytes - 1;
  EXPECT(mokLayerCreate(&s.config, &m, &out), mokInvalidArgument, "memory.workspace_bytes");
  m = s.memory;
  m.size = 0;
  EXPECT(mokLayerCreate(&s.config, &m, &out), mokInvalidArgument, "MOK_LAYER_MEMORY_INIT");
  CHECK(out == untouched);  // nothing written
}

TEST(schedule_rules) {
  Solo s;
  s.create();
  int32_t ids[8] = {0, 1, 1, 0, 0, 0, 1, 1};
  EXPECT(mokLayerBuildSchedule(nullptr, ids, mokIndexInt32, 4), mokInvalidArgument, "'layer'");
  EXPECT(mokLayerBuildSchedule(s.layer, ids, static_cast<mokIndexType_t>(5), 4), mokInvalidArgument, "index_type");
  EXPECT(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, -1), mokInvalidArgument, "num_tokens");
  EXPECT(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, 5), mokInvalidArgument, "num_tokens");  // > max_tokens
  EXPECT(mokLayerBuildSchedule(s.layer, nullptr, mokIndexInt32, 4), mokInvalidArgument, "topk_ids");
  int64_t wide[8] = {0, 1, 1, 0, 0, 0, 1, 1};
  EXPECT(mokLayerBuildSchedule(s.layer, reinterpret_cast<char*>(wide) + 4, mokIndexInt64, 3), mokInvalidArgument,
         "topk_ids");  // misaligned
  ids[5] = 2;          // world * experts_per_rank = 2
  EXPECT(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, 4), mokInvalidArgument, "topk_ids");
  ids[5] = -2;
  EXPECT(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, 4), mokInvalidArgument, "topk_ids");
  ids[5] = -1;
  CHECK(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, 4) == mokSuccess);
  CHECK(mokLayerBuildSchedule(s.layer, nullptr, mokIndexInt32, 0) == mokSuccess);  // no tokens, no ids
}

TEST(pass_rules) {
  Solo s;
  s.config.shared_intermediate = 0;
  s.create();
  std::mt19937_64 rng(seed());
  auto gate = random_bf16(2 * 8 * 16, 0.25, rng), up = random_bf16(2 * 8 * 16, 0.25, rng),
       down = random_bf16(2 * 16 * 8, 0.25, rng), x = random_bf16(4 * 16, 1, rng), dout = random_bf16(4 * 16, 1, rng);
  float tw[8] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  std::vector<uint16_t> out(4 * 16, 0xbeef);
  mokLayerWeights_t w = MOK_LAYER_WEIGHTS_INIT;
  w.gate = gate.data();
  w.up = up.data();
  w.down = down.data();
  EXPECT(mokLayerForward(s.layer, &w, x.data(), tw, out.data()), mokInvalidUsage, "mokLayerBuildSchedule");
  int32_t ids[8] = {0, 1, 1, 0, 0, -1, 1, 1};
  CHECK(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, 4) == mokSuccess);
  std::vector<uint16_t> dx(4 * 16), dgate(gate.size()), dup(up.size()), ddown(down.size());
  std::vector<float> dw(8);
  mokLayerGrads_t g = MOK_LAYER_GRADS_INIT;
  g.dx = dx.data();
  g.dtopk_weights = dw.data();
  g.dgate = dgate.data();
  g.dup = dup.data();
  g.ddown = ddown.data();
  EXPECT(mokLayerBackward(s.layer, &w, tw, dout.data(), &g), mokInvalidUsage, "mokLayerForward");
  EXPECT(mokLayerForward(s.layer, nullptr, x.data(), tw, out.data()), mokInvalidArgument, "'weights'");
  mokLayerWeights_t bad = w;
  bad.size = 0;
  EXPECT(mokLayerForward(s.layer, &bad, x.data(), tw, out.data()), mokInvalidArgument, "MOK_LAYER_WEIGHTS_INIT");
  bad = w;
  bad.down = nullptr;
  EXPECT(mokLayerForward(s.layer, &bad, x.data(), tw, out.data()), mokInvalidArgument, "weights.down");
  bad.down = reinterpret_cast<const char*>(down.data()) + 1;
  EXPECT(mokLayerForward(s.layer, &bad, x.data(), tw, out.data()), mokInvalidArgument, "weights.down");
  bad = w;
  bad.shared_gate = gate.data();  // a shared expert the config does not have
  EXPECT(mokLayerForward(s.layer, &bad, x.data(), tw, out.data()), mokInvalidArgument, "weights.shared_gate");
  EXPECT(mokLayerForward(s.layer, &w, nullptr, tw, out.data()), mokInvalidArgument, "'x'");
  EXPECT(mokLayerForward(s.layer, &w, reinterpret_cast<const char*>(x.data()) + 1, tw, out.data()), mokInvalidArgument,
         "'x'");
  EXPECT(mokLayerForward(s.layer, &w, x.data(), nullptr, out.data()), mokInvalidArgument, "topk_weights");
  EXPECT(mokLayerForward(s.layer, &w, x.data(), tw, nullptr), mokInvalidArgument, "'out'");
  EXPECT(mokLayerRecompute(s.layer, &w, nullptr), mokInvalidArgument, "'x'");
  for (uint16_t v : out) CHECK(v == 0xbeef);  // nothing written
  CHECK(mokLayerForward(s.layer, &w, x.data(), tw, out.data()) == mokSuccess);
  EXPECT(mokLayerBackward(s.layer, &w, tw, dout.data(), nullptr), mokInvalidArgument, "'grads'");
  mokLayerGrads_t bg = g;
  bg.accumulate = 2;
  EXPECT(mokLayerBackward(s.layer, &w, tw, dout.data(), &bg), mokInvalidArgument, "grads.accumulate");
  bg = g;
  bg.dx = nullptr;
  EXPECT(mokLayerBackward(s.layer, &w, tw, dout.data(), &bg), mokInvalidArgument, "grads.dx");
  bg = g;
  bg.accumulate = 1;
  bg.ddown = reinterpret_cast<char*>(ddown.data()) + 2;  // fp32 main_grad must be 4-byte aligned
  EXPECT(mokLayerBackward(s.layer, &w, tw, dout.data(), &bg), mokInvalidArgument, "grads.ddown");
  EXPECT(mokLayerBackward(s.layer, &w, tw, nullptr, &g), mokInvalidArgument, "'dout'");
  for (uint16_t v : dx) CHECK(v == 0);  // nothing written
  CHECK_MSG(mokLayerBackward(s.layer, &w, tw, dout.data(), &g) == mokSuccess, "%s", mokGetLastError());
}

TEST(mxfp8_weights_required) {
  Solo s(mokPrecisionMXFP8);
  s.create();
  int32_t ids[8] = {0, 1, 1, 0, 0, 1, 1, 0};
  CHECK(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, 4) == mokSuccess);
  std::mt19937_64 rng(seed());
  auto gate = random_bf16(2 * 8 * 16, 0.25, rng), x = random_bf16(4 * 16, 1, rng);
  float tw[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  std::vector<uint16_t> out(4 * 16);
  mokLayerWeights_t w = MOK_LAYER_WEIGHTS_INIT;
  w.gate = w.up = w.down = gate.data();  // bf16 weights where MXFP8 forms are needed
  EXPECT(mokLayerForward(s.layer, &w, x.data(), tw, out.data()), mokInvalidArgument, "weights.gate_rowwise");
}

TEST(quantize_rules) {
  float v[64];
  for (int i = 0; i < 64; ++i) v[i] = static_cast<float>(i) - 30.5f;
  uint8_t d[64], sc[2], dc[64], scc[2];
  std::memset(d, 0x5a, sizeof(d));
  EXPECT(mokMxfp8Quantize(nullptr, mokDataFloat32, 1, 2, 32, d, sc, nullptr, nullptr), mokInvalidArgument, "'src'");
  EXPECT(mokMxfp8Quantize(v, static_cast<mokDataType_t>(9), 1, 2, 32, d, sc, nullptr, nullptr), mokInvalidArgument,
         "'dtype'");
  EXPECT(mokMxfp8Quantize(v, mokDataFloat32, 1, 0, 32, d, sc, nullptr, nullptr), mokInvalidArgument, "'rows'");
  EXPECT(mokMxfp8Quantize(v, mokDataFloat32, 1, 2, 32, d, nullptr, nullptr, nullptr), mokInvalidArgument, "_scales");
  EXPECT(mokMxfp8Quantize(v, mokDataFloat32, 1, 2, 32, nullptr, nullptr, nullptr, nullptr), mokInvalidArgument,
         "rowwise_data");
  v[40] = NAN;
  EXPECT(mokMxfp8Quantize(v, mokDataFloat32, 1, 2, 32, d, sc, dc, scc), mokInvalidArgument, "'src'");
  v[40] = INFINITY;
  EXPECT(mokMxfp8Quantize(v, mokDataFloat32, 1, 2, 32, d, sc, dc, scc), mokInvalidArgument, "element 40");
  for (uint8_t b : d) CHECK(b == 0x5a);  // nothing written
}

TEST(error_query_rules) {
  Solo s;
  s.create();
  EXPECT(mokLayerGetError(s.layer, nullptr), mokInvalidArgument, "'error'");
  mokLayerError_t e = MOK_LAYER_ERROR_INIT;
  e.size = 0;
  EXPECT(mokLayerGetError(s.layer, &e), mokInvalidArgument, "MOK_LAYER_ERROR_INIT");
  e = mokLayerError_t MOK_LAYER_ERROR_INIT;
  CHECK(mokLayerGetError(s.layer, &e) == mokSuccess && e.status == mokSuccess);
  EXPECT(mokLayerAbort(nullptr), mokInvalidArgument, "'layer'");
}

// Ranks whose configs disagree on a group-wide field: every rank fails the schedule build, naming
// the field, before anything is read through the (differently laid out) peer buffers.
TEST(group_config_mismatch) {
  std::mt19937_64 rng(seed());
  Spec spec;
  spec.world = 3;
  ref::Problem p = make_problem(spec, rng);
  Knobs k;
  k.edit_config = [](int r, mokLayerConfig_t& c) {
    if (r == 2) c.hidden /= 2;  // smaller: its buffers still fit in the ones sized for the others
  };
  Outputs o = run_layer(p, k);
  for (int r = 0; r < 3; ++r)
    CHECK_MSG(o.status[r] == mokInvalidArgument && o.detail[r].find("config.hidden") != std::string::npos,
              "rank %d: %s: %s", r, mokGetStatusString(o.status[r]), o.detail[r].c_str());
}

MOK_TEST_MAIN
