// The C ABI's bad-input catalogue: each case returns its status, a detail naming the argument, and
// writes nothing.
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>

#include "core/mxfp8.hpp"
#include "group.hpp"
#include "small_config.h"

using namespace mok_test;

namespace {

// The call returns `want` and its detail holds every part (the argument, its value, the rule).
void expect(mokStatus_t got, mokStatus_t want, std::initializer_list<const char*> parts, int line) {
  const char* detail = mokGetLastError();
  bool ok = got == want;
  for (const char* part : parts) ok = ok && std::strstr(detail, part) != nullptr;
  std::string wanted;
  for (const char* part : parts) wanted += std::string(" '") + part + "'";
  CHECK_MSG(ok, "line %d: got %s with '%s'; want %s naming%s", line, mokGetStatusString(got), detail,
            mokGetStatusString(want), wanted.c_str());
}
#define EXPECT(call, status, ...) expect((call), (status), {__VA_ARGS__}, __LINE__)

// Store any int in an enum field, as a C caller may (a C++ cast to an out-of-range enum is undefined).
template <class Enum>
void store_int(Enum* field, int value) {
  static_assert(sizeof(Enum) == sizeof(int), "a C enum of mok.h");
  std::memcpy(field, &value, sizeof(value));
}

// A one-rank context: its collective calls complete on this thread alone.
struct Solo {
  mokLayerConfig_t config = small_config();
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
void expect_config(Edit edit, std::initializer_list<const char*> parts, int line) {
  mokLayerConfig_t c = small_config();
  edit(c);
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  expect(mokLayerGetSizes(&c, &sizes), mokInvalidArgument, parts, line);
  CHECK(sizes.peer_bytes == 0 && sizes.workspace_bytes == 0);  // nothing written
}
#define EXPECT_CONFIG(edit, ...) expect_config([](mokLayerConfig_t& c) { edit; }, {__VA_ARGS__}, __LINE__)

// Accepted by mokLayerGetSizes (which only computes, so configs at the limits allocate nothing), with
// byte counts no smaller than the buffers they must hold: a wrapped size_t would show up here.
template <class Edit>
void accept_config(Edit edit, int line) {
  mokLayerConfig_t c = small_config();
  edit(c);
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  mokStatus_t got = mokLayerGetSizes(&c, &sizes);
  CHECK_MSG(got == mokSuccess, "line %d: got %s with '%s'", line, mokGetStatusString(got), mokGetLastError());
  using u128 = unsigned __int128;
  u128 slots = u128(c.max_tokens) * c.top_k * c.hidden * 2 * 2;                          // y_slots and dx_slots, bf16
  u128 ring = u128(c.macrobatch) * (2 * u128(c.hidden) + 3 * u128(c.intermediate)) * 2;  // bf16 rows
  CHECK_MSG(sizes.peer_bytes >= slots && sizes.workspace_bytes >= ring, "line %d: peer %zu, workspace %zu", line,
            sizes.peer_bytes, sizes.workspace_bytes);
}
#define ACCEPT_CONFIG(edit) accept_config([](mokLayerConfig_t& c) { edit; }, __LINE__)

}  // namespace

TEST(config_rules) {
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  EXPECT(mokLayerGetSizes(nullptr, &sizes), mokInvalidArgument, "'config'");
  mokLayerConfig_t c = small_config();
  EXPECT(mokLayerGetSizes(&c, nullptr), mokInvalidArgument, "'sizes'");
  EXPECT_CONFIG(c.size = 0, "MOK_LAYER_CONFIG_INIT");
  EXPECT_CONFIG(store_int(&c.precision, 7), "'config.precision' (7)", "mokPrecisionBF16 (0) or mokPrecisionMXFP8 (1)");
  EXPECT_CONFIG(store_int(&c.precision, -1), "'config.precision' (-1)");
  EXPECT_CONFIG(c.precision = mokPrecisionMXFP8, "config.expert_padding", "(8)", "multiple of 32");
  ACCEPT_CONFIG((c.precision = mokPrecisionMXFP8, c.expert_padding = 32, c.minibatch = 32));
  EXPECT_CONFIG(c.minibatch = 12, "config.minibatch", "(12)", "multiple of config.expert_padding");
  EXPECT_CONFIG(c.macrobatch = 8, "config.macrobatch", "(8)", "not be smaller than config.minibatch");
  EXPECT_CONFIG(c.macrobatch = 40, "config.macrobatch", "(40)", "multiple of config.minibatch");
  ACCEPT_CONFIG(c.macrobatch = c.minibatch);
  store_int(&c.executor, 9);
  EXPECT(mokLayerGetSizes(&c, &sizes), mokInvalidArgument, "'config.executor' (9)", "mokExecutorHost (0)");
  c = small_config();
  c.executor = mokExecutorPortable;
  EXPECT(mokLayerGetSizes(&c, &sizes), mokNotCompiled, "argument 'config.executor' (portable)", "runs no layer");
}

// The clamp: 0 (no clamp) and every positive value are accepted, the first negative one is not.
TEST(activation_and_alpha) {
  ACCEPT_CONFIG(c.activation = mokActivationSwigluOai);
  ACCEPT_CONFIG(c.swiglu_alpha = NAN);  // swiglu has no alpha
  ACCEPT_CONFIG(c.activation = mokActivationSwigluOai; c.swiglu_alpha = 1e-30f);
  EXPECT_CONFIG(c.activation = static_cast<mokActivation_t>(2), "config.activation", "(2)", "mokActivationSwigluOai");
  EXPECT_CONFIG(c.activation = static_cast<mokActivation_t>(-1), "config.activation", "(-1)");
  EXPECT_CONFIG(c.activation = mokActivationSwigluOai; c.swiglu_alpha = 0.0f, "config.swiglu_alpha", "must be finite");
  EXPECT_CONFIG(c.activation = mokActivationSwigluOai; c.swiglu_alpha = -1.0f, "config.swiglu_alpha", "(-1)");
  EXPECT_CONFIG(c.activation = mokActivationSwigluOai; c.swiglu_alpha = NAN, "config.swiglu_alpha", "(nan)");
  EXPECT_CONFIG(c.activation = mokActivationSwigluOai; c.swiglu_alpha = INFINITY, "config.swiglu_alpha", "(inf)");
}

TEST(swiglu_limit_boundary) {
  ACCEPT_CONFIG(c.swiglu_limit = 0.0f);
  ACCEPT_CONFIG(c.swiglu_limit = std::numeric_limits<float>::denorm_min());
  ACCEPT_CONFIG(c.swiglu_limit = INFINITY);
  EXPECT_CONFIG(c.swiglu_limit = -std::numeric_limits<float>::denorm_min(), "config.swiglu_limit", "must be > 0");
  EXPECT_CONFIG(c.swiglu_limit = -1.0f, "config.swiglu_limit", "(-1)", "must be > 0, or 0 for no clamp");
  EXPECT_CONFIG(c.swiglu_limit = NAN, "config.swiglu_limit", "(nan)");
}

// Each field at both ends of its range is accepted; one past either end is rejected with the field,
// its value and the range (the numbers docs/c-api.md and mok.h state).
TEST(config_field_limits) {
  ACCEPT_CONFIG(c.world = 1);
  ACCEPT_CONFIG(c.world = 72);
  EXPECT_CONFIG(c.world = 0, "'config.world' (0)", "[1, 72]");
  EXPECT_CONFIG(c.world = 73, "'config.world' (73)", "[1, 72]");
  ACCEPT_CONFIG((c.world = 72, c.rank = 71));
  EXPECT_CONFIG((c.world = 72, c.rank = 72), "'config.rank' (72)", "[0, 71]");
  EXPECT_CONFIG(c.rank = -1, "'config.rank' (-1)", "[0, 0]");
  ACCEPT_CONFIG(c.experts_per_rank = 1);
  ACCEPT_CONFIG(c.experts_per_rank = 1 << 20);
  EXPECT_CONFIG(c.experts_per_rank = 0, "'config.experts_per_rank' (0)", "[1, 1048576]");
  EXPECT_CONFIG(c.experts_per_rank = (1 << 20) + 1, "'config.experts_per_rank' (1048577)", "[1, 1048576]");
  ACCEPT_CONFIG(c.hidden = 1);
  ACCEPT_CONFIG(c.hidden = 1 << 20);
  EXPECT_CONFIG(c.hidden = 0, "'config.hidden' (0)", "[1, 1048576]");
  EXPECT_CONFIG(c.hidden = (1 << 20) + 1, "'config.hidden' (1048577)", "[1, 1048576]");
  ACCEPT_CONFIG(c.intermediate = 1);
  ACCEPT_CONFIG(c.intermediate = 1 << 20);
  EXPECT_CONFIG(c.intermediate = 0, "'config.intermediate' (0)", "[1, 1048576]");
  EXPECT_CONFIG(c.intermediate = (1 << 20) + 1, "'config.intermediate' (1048577)", "[1, 1048576]");
  ACCEPT_CONFIG(c.top_k = 1);
  ACCEPT_CONFIG(c.top_k = 1024);
  EXPECT_CONFIG(c.top_k = 0, "'config.top_k' (0)", "[1, 1024]");
  EXPECT_CONFIG(c.top_k = 1025, "'config.top_k' (1025)", "[1, 1024]");
  ACCEPT_CONFIG(c.max_tokens = 1);
  ACCEPT_CONFIG(c.max_tokens = 1 << 24);
  EXPECT_CONFIG(c.max_tokens = 0, "'config.max_tokens' (0)", "[1, 16777216]");
  EXPECT_CONFIG(c.max_tokens = (1 << 24) + 1, "'config.max_tokens' (16777217)", "[1, 16777216]");
  ACCEPT_CONFIG(c.shared_intermediate = 0);
  ACCEPT_CONFIG(c.shared_intermediate = 1 << 20);
  EXPECT_CONFIG(c.shared_intermediate = -1, "'config.shared_intermediate' (-1)", "[0, 1048576]");
  EXPECT_CONFIG(c.shared_intermediate = (1 << 20) + 1, "'config.shared_intermediate' (1048577)", "[0, 1048576]");
  ACCEPT_CONFIG((c.expert_padding = 1, c.minibatch = 1, c.macrobatch = 1));
  ACCEPT_CONFIG((c.expert_padding = 1 << 16, c.minibatch = 1 << 16, c.macrobatch = 1 << 16));
  EXPECT_CONFIG(c.expert_padding = 0, "'config.expert_padding' (0)", "[1, 65536]");
  EXPECT_CONFIG((c.expert_padding = (1 << 16) + 1, c.minibatch = c.macrobatch = (1 << 16) + 1),
                "'config.expert_padding' (65537)", "[1, 65536]");
  ACCEPT_CONFIG((c.minibatch = 1 << 24, c.macrobatch = 1 << 24));
  EXPECT_CONFIG(c.minibatch = 0, "'config.minibatch' (0)", "[1, 16777216]");
  EXPECT_CONFIG((c.minibatch = c.macrobatch = (1 << 24) + 8), "'config.minibatch' (16777224)", "[1, 16777216]");
  ACCEPT_CONFIG(c.macrobatch = 1 << 26);
  EXPECT_CONFIG(c.macrobatch = 0, "'config.macrobatch' (0)", "[1, 67108864]");
  EXPECT_CONFIG(c.macrobatch = (1 << 26) + 16, "'config.macrobatch' (67108880)", "[1, 67108864]");
  ACCEPT_CONFIG(c.comm_workers = 64);
  EXPECT_CONFIG(c.comm_workers = 0, "'config.comm_workers' (0)", "[1, 64]");
  EXPECT_CONFIG(c.comm_workers = 65, "'config.comm_workers' (65)", "[1, 64]");
  ACCEPT_CONFIG(c.compute_workers = 256);
  EXPECT_CONFIG(c.compute_workers = 0, "'config.compute_workers' (0)", "[1, 256]");
  EXPECT_CONFIG(c.compute_workers = 257, "'config.compute_workers' (257)", "[1, 256]");
  ACCEPT_CONFIG(c.backward_comm_workers = c.comm_workers + c.compute_workers - 1);
  EXPECT_CONFIG(c.backward_comm_workers = c.comm_workers + c.compute_workers, "'config.backward_comm_workers'",
                "leaves a compute worker");
  EXPECT_CONFIG(c.backward_comm_workers = -1, "'config.backward_comm_workers' (-1)", "must be 0");
  ACCEPT_CONFIG(c.timeout_ms = 1);
  ACCEPT_CONFIG(c.timeout_ms = 24 * 3600 * 1000);
  EXPECT_CONFIG(c.timeout_ms = 0, "'config.timeout_ms' (0)", "[1, 86400000]");
  EXPECT_CONFIG(c.timeout_ms = 24 * 3600 * 1000 + 1, "'config.timeout_ms' (86400001)", "[1, 86400000]");
}

// The products that size the buffers, in exact integers: at the limit accepted, just past it (the
// next product these factors reach) rejected with the product, its value and the limit.
TEST(config_product_limits) {
  // world x max_tokens x top_k + experts_per_rank x expert_padding = 23 x 89 x 2^20 + (2^20 - 1) x 1 = 2^31 - 1.
  ACCEPT_CONFIG(
      (c.world = 23, c.top_k = 89, c.max_tokens = 1 << 20, c.experts_per_rank = (1 << 20) - 1, c.expert_padding = 1));
  EXPECT_CONFIG(
      (c.world = 23, c.top_k = 89, c.max_tokens = 1 << 20, c.experts_per_rank = 1 << 20, c.expert_padding = 1),
      "'config'", "world x max_tokens x top_k + experts_per_rank x expert_padding = 2147483648", "at most 2147483647");
  // max_tokens x top_k x hidden (the y_slots tensor) = 2^14 x 64 x 2^20 = 2^40.
  ACCEPT_CONFIG((c.max_tokens = 1 << 14, c.top_k = 64, c.hidden = 1 << 20));
  EXPECT_CONFIG((c.max_tokens = (1 << 14) + 1, c.top_k = 64, c.hidden = 1 << 20),
                "max_tokens x top_k x hidden = 1099578736640", "at most 1099511627776");
  // experts_per_rank x intermediate x hidden = 2^20 x 2^10 x 2^10 = 2^40.
  ACCEPT_CONFIG((c.experts_per_rank = 1 << 20, c.intermediate = 1 << 10, c.hidden = 1 << 10));
  EXPECT_CONFIG((c.experts_per_rank = 1 << 20, c.intermediate = (1 << 10) + 1, c.hidden = 1 << 10),
                "experts_per_rank x intermediate x hidden = 1100585369600", "at most 1099511627776");
  // macrobatch x hidden and macrobatch x intermediate (the ring buffers) = 2^26 x 2^14 = 2^40.
  ACCEPT_CONFIG((c.macrobatch = 1 << 26, c.hidden = 1 << 14));
  EXPECT_CONFIG((c.macrobatch = 1 << 26, c.hidden = (1 << 14) + 1), "macrobatch x hidden = 1099578736640",
                "at most 1099511627776");
  ACCEPT_CONFIG((c.macrobatch = 1 << 26, c.intermediate = 1 << 14));
  EXPECT_CONFIG((c.macrobatch = 1 << 26, c.intermediate = (1 << 14) + 1), "macrobatch x intermediate = 1099578736640",
                "at most 1099511627776");
  // Three products at 2^40 together, MXFP8 and the widest shared expert:
  // the byte counts stay below the 2^47 that docs/c-api.md promises.
  mokLayerConfig_t big = small_config();
  big.precision = mokPrecisionMXFP8;
  big.experts_per_rank = 1 << 12;
  big.hidden = big.intermediate = 1 << 14;
  big.max_tokens = 1 << 24;
  big.top_k = 4;
  big.shared_intermediate = 1 << 20;
  big.expert_padding = big.minibatch = 32;
  big.macrobatch = 1 << 26;
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  CHECK_MSG(mokLayerGetSizes(&big, &sizes) == mokSuccess, "%s", mokGetLastError());
  CHECK_MSG(sizes.workspace_bytes > (size_t{1} << 43) && sizes.workspace_bytes < (size_t{1} << 47) &&
                sizes.peer_bytes < (size_t{1} << 47),
            "peer %zu, workspace %zu", sizes.peer_bytes, sizes.workspace_bytes);
  // Every field at its max: the products are far past their limits and still exact (no overflow).
  EXPECT_CONFIG(
      (c.world = 72, c.experts_per_rank = c.hidden = c.intermediate = c.shared_intermediate = 1 << 20, c.top_k = 1024,
       c.max_tokens = 1 << 24, c.expert_padding = 1 << 16, c.minibatch = 1 << 24, c.macrobatch = 1 << 26),
      "world x max_tokens x top_k + experts_per_rank x expert_padding = 1305670057984");
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
  std::string longest(200, 'n');  // passes the name rule: the next rule (no workspace) rejects it
  m.shm_name = longest.c_str();
  m.workspace = nullptr;
  EXPECT(mokLayerCreate(&s.config, &m, &out), mokInvalidArgument, "'memory.workspace'");
  std::string too_long(201, 'n');
  m.shm_name = too_long.c_str();
  EXPECT(mokLayerCreate(&s.config, &m, &out), mokInvalidArgument, "'memory.shm_name' (201 characters)", "1-200");
  m.shm_name = "";
  EXPECT(mokLayerCreate(&s.config, &m, &out), mokInvalidArgument, "'memory.shm_name' (0 characters)", "1-200");
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
  EXPECT(mokLayerBuildSchedule(nullptr, ids, mokIndexInt32, 4, nullptr), mokInvalidArgument, "'layer'");
  // An out-of-range index_type can only come from C (test_enum_args.c): a C++ cast to it is undefined.
  EXPECT(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, -1, nullptr), mokInvalidArgument, "'num_tokens' (-1)",
         "[0, config.max_tokens = 4]");
  EXPECT(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, 5, nullptr), mokInvalidArgument, "'num_tokens' (5)",
         "[0, config.max_tokens = 4]");
  EXPECT(mokLayerBuildSchedule(s.layer, nullptr, mokIndexInt32, 4, nullptr), mokInvalidArgument, "topk_ids");
  int64_t wide[8] = {0, 1, 1, 0, 0, 0, 1, 1};
  EXPECT(mokLayerBuildSchedule(s.layer, reinterpret_cast<char*>(wide) + 4, mokIndexInt64, 3, nullptr),
         mokInvalidArgument,
         "topk_ids");  // misaligned
  ids[5] = 2;          // world * experts_per_rank = 2
  EXPECT(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, 4, nullptr), mokInvalidArgument, "'topk_ids' [2][1] = 2",
         "-1 or in [0, 2)");
  ids[5] = -2;
  EXPECT(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, 4, nullptr), mokInvalidArgument, "'topk_ids' [2][1] = -2");
  ids[5] = 1;  // the largest expert id
  CHECK(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, 4, nullptr) == mokSuccess);
  ids[5] = -1;
  CHECK(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, 4, nullptr) == mokSuccess);
  CHECK(mokLayerBuildSchedule(s.layer, nullptr, mokIndexInt32, 0, nullptr) == mokSuccess);  // no tokens, no ids
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
  EXPECT(mokLayerForward(s.layer, &w, x.data(), tw, out.data(), nullptr), mokInvalidUsage, "mokLayerBuildSchedule");
  int32_t ids[8] = {0, 1, 1, 0, 0, -1, 1, 1};
  CHECK(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, 4, nullptr) == mokSuccess);
  std::vector<uint16_t> dx(4 * 16), dgate(gate.size()), dup(up.size()), ddown(down.size());
  std::vector<float> dw(8);
  mokLayerGrads_t g = MOK_LAYER_GRADS_INIT;
  g.dx = dx.data();
  g.dtopk_weights = dw.data();
  g.dgate = dgate.data();
  g.dup = dup.data();
  g.ddown = ddown.data();
  EXPECT(mokLayerBackward(s.layer, &w, tw, dout.data(), &g, nullptr), mokInvalidUsage, "mokLayerForward");
  EXPECT(mokLayerForward(s.layer, nullptr, x.data(), tw, out.data(), nullptr), mokInvalidArgument, "'weights'");
  mokLayerWeights_t bad = w;
  bad.size = 0;
  EXPECT(mokLayerForward(s.layer, &bad, x.data(), tw, out.data(), nullptr), mokInvalidArgument,
         "MOK_LAYER_WEIGHTS_INIT");
  bad = w;
  bad.down = nullptr;
  EXPECT(mokLayerForward(s.layer, &bad, x.data(), tw, out.data(), nullptr), mokInvalidArgument, "weights.down");
  bad.down = reinterpret_cast<const char*>(down.data()) + 1;
  EXPECT(mokLayerForward(s.layer, &bad, x.data(), tw, out.data(), nullptr), mokInvalidArgument, "weights.down");
  bad = w;
  bad.shared_gate = gate.data();  // a shared expert the config does not have
  EXPECT(mokLayerForward(s.layer, &bad, x.data(), tw, out.data(), nullptr), mokInvalidArgument, "weights.shared_gate");
  EXPECT(mokLayerForward(s.layer, &w, nullptr, tw, out.data(), nullptr), mokInvalidArgument, "'x'");
  EXPECT(mokLayerForward(s.layer, &w, reinterpret_cast<const char*>(x.data()) + 1, tw, out.data(), nullptr),
         mokInvalidArgument, "'x'");
  EXPECT(mokLayerForward(s.layer, &w, x.data(), nullptr, out.data(), nullptr), mokInvalidArgument, "topk_weights");
  EXPECT(mokLayerForward(s.layer, &w, x.data(), tw, nullptr, nullptr), mokInvalidArgument, "'out'");
  EXPECT(mokLayerRecompute(s.layer, &w, nullptr, nullptr), mokInvalidArgument, "'x'");
  for (uint16_t v : out) CHECK(v == 0xbeef);  // nothing written
  CHECK(mokLayerForward(s.layer, &w, x.data(), tw, out.data(), nullptr) == mokSuccess);
  EXPECT(mokLayerBackward(s.layer, &w, tw, dout.data(), nullptr, nullptr), mokInvalidArgument, "'grads'");
  mokLayerGrads_t bg = g;
  bg.accumulate = 2;
  EXPECT(mokLayerBackward(s.layer, &w, tw, dout.data(), &bg, nullptr), mokInvalidArgument, "'grads.accumulate' (2)",
         "0 or 1");
  bg.accumulate = -1;
  EXPECT(mokLayerBackward(s.layer, &w, tw, dout.data(), &bg, nullptr), mokInvalidArgument, "'grads.accumulate' (-1)");
  bg = g;
  bg.dx = nullptr;
  EXPECT(mokLayerBackward(s.layer, &w, tw, dout.data(), &bg, nullptr), mokInvalidArgument, "grads.dx");
  bg = g;
  bg.accumulate = 1;
  bg.ddown = reinterpret_cast<char*>(ddown.data()) + 2;  // fp32 main_grad must be 4-byte aligned
  EXPECT(mokLayerBackward(s.layer, &w, tw, dout.data(), &bg, nullptr), mokInvalidArgument, "grads.ddown");
  EXPECT(mokLayerBackward(s.layer, &w, tw, nullptr, &g, nullptr), mokInvalidArgument, "'dout'");
  // A bias needs its gradient; each bias is checked like the weights (bf16 alignment).
  mokLayerWeights_t biased = w;
  biased.down_bias = gate.data();  // E x H bf16 fits in gate's E x I x H
  EXPECT(mokLayerBackward(s.layer, &biased, tw, dout.data(), &g, nullptr), mokInvalidArgument, "'grads.ddown_bias'",
         "when weights.down_bias is given");
  biased.gate_bias = reinterpret_cast<const char*>(gate.data()) + 1;
  EXPECT(mokLayerBackward(s.layer, &biased, tw, dout.data(), &g, nullptr), mokInvalidArgument, "weights.gate_bias");
  for (uint16_t v : dx) CHECK(v == 0);  // nothing written
  CHECK_MSG(mokLayerBackward(s.layer, &w, tw, dout.data(), &g, nullptr) == mokSuccess, "%s", mokGetLastError());
}

// A schedule call that fails leaves no schedule: a caller sizes its buffers by the token count it passed,
// so the context of the older schedule (4 tokens here) must not be read or written through them.
TEST(failed_schedule_leaves_no_context) {
  Solo s;
  s.config.shared_intermediate = 0;
  s.create();
  std::mt19937_64 rng(seed());
  auto gate = random_bf16(2 * 8 * 16, 0.25, rng), up = random_bf16(2 * 8 * 16, 0.25, rng),
       down = random_bf16(2 * 16 * 8, 0.25, rng), x = random_bf16(4 * 16, 1, rng);
  float tw[8] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  std::vector<uint16_t> out(4 * 16);
  mokLayerWeights_t w = MOK_LAYER_WEIGHTS_INIT;
  w.gate = gate.data();
  w.up = up.data();
  w.down = down.data();
  int32_t ids[8] = {0, 1, 1, 0, 0, -1, 1, 1}, bad_ids[2] = {0, 7};
  CHECK(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, 4, nullptr) == mokSuccess);
  CHECK(mokLayerForward(s.layer, &w, x.data(), tw, out.data(), nullptr) == mokSuccess);
  EXPECT(mokLayerBuildSchedule(s.layer, bad_ids, mokIndexInt32, 1, nullptr), mokInvalidArgument,
         "'topk_ids' [0][1] = 7");
  std::vector<uint16_t> slots(2 * 16, 0xbeef);  // [1 token, K, H]: what the failed call's caller allocated
  EXPECT(mokLayerGetSlots(s.layer, slots.data(), nullptr), mokInvalidUsage, "mokLayerForward or mokLayerRecompute");
  EXPECT(mokLayerForward(s.layer, &w, x.data(), tw, out.data(), nullptr), mokInvalidUsage,
         "mokLayerBuildSchedule first");
  for (uint16_t v : slots) CHECK(v == 0xbeef);
}

TEST(mxfp8_weights_required) {
  Solo s(mokPrecisionMXFP8);
  s.create();
  int32_t ids[8] = {0, 1, 1, 0, 0, 1, 1, 0};
  CHECK(mokLayerBuildSchedule(s.layer, ids, mokIndexInt32, 4, nullptr) == mokSuccess);
  std::mt19937_64 rng(seed());
  auto gate = random_bf16(2 * 8 * 16, 0.25, rng), x = random_bf16(4 * 16, 1, rng);
  float tw[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  std::vector<uint16_t> out(4 * 16);
  mokLayerWeights_t w = MOK_LAYER_WEIGHTS_INIT;
  w.gate = w.up = w.down = gate.data();  // bf16 weights where MXFP8 forms are needed
  EXPECT(mokLayerForward(s.layer, &w, x.data(), tw, out.data(), nullptr), mokInvalidArgument, "weights.gate_rowwise");
}

TEST(quantize_rules) {
  std::mt19937_64 rng(seed());
  std::uniform_real_distribution<float> value(-30.0f, 30.0f);
  float v[64];
  for (float& x : v) x = value(rng);
  uint8_t d[64], sc[512], dc[64], scc[512];  // [2, 32]: one 128 x 4 scale tile each way
  std::memset(d, 0x5a, sizeof(d));
  EXPECT(mokMxfp8Quantize(nullptr, mokDataFloat32, 1, 2, 32, d, sc, nullptr, nullptr, nullptr), mokInvalidArgument,
         "'src'");
  // An out-of-range dtype can only come from C (test_enum_args.c): a C++ cast to it is undefined.
  EXPECT(mokMxfp8Quantize(v, mokDataFloat32, 0, 2, 32, d, sc, nullptr, nullptr, nullptr), mokInvalidArgument,
         "'batch' (0)", ">= 1");
  EXPECT(mokMxfp8Quantize(v, mokDataFloat32, 1, 0, 32, d, sc, nullptr, nullptr, nullptr), mokInvalidArgument,
         "'rows' (0)", ">= 1");
  EXPECT(mokMxfp8Quantize(v, mokDataFloat32, 1, 2, -1, d, sc, nullptr, nullptr, nullptr), mokInvalidArgument,
         "'cols' (-1)", ">= 1");
  EXPECT(mokMxfp8Quantize(v, mokDataFloat32, 1, 2, 32, d, nullptr, nullptr, nullptr, nullptr), mokInvalidArgument,
         "_scales");
  EXPECT(mokMxfp8Quantize(v, mokDataFloat32, 1, 2, 32, nullptr, nullptr, nullptr, nullptr, nullptr), mokInvalidArgument,
         "rowwise_data");
  v[40] = NAN;
  EXPECT(mokMxfp8Quantize(v, mokDataFloat32, 1, 2, 32, d, sc, dc, scc, nullptr), mokInvalidArgument, "'src'");
  v[40] = INFINITY;
  EXPECT(mokMxfp8Quantize(v, mokDataFloat32, 1, 2, 32, d, sc, dc, scc, nullptr), mokInvalidArgument, "element 40");
  for (uint8_t b : d) CHECK(b == 0x5a);  // nothing written
  v[40] = value(rng);
  CHECK(mokMxfp8Quantize(v, mokDataFloat32, 1, 2, 32, d, sc, nullptr, nullptr, nullptr) == mokSuccess);
  uint8_t want[64];            // valid arguments: each row is one block, as core's block quantiser writes it
  for (int r = 0; r < 2; ++r)  // row r's first scale at 16 r in the SM100 layout
    CHECK(sc[16 * r] == mok::core::mx_quantize_block(v + 32 * r, 32, 1, want + 32 * r, 1));
  CHECK(std::memcmp(d, want, sizeof(want)) == 0);
}

// batch x rows x cols at most 2^40: exactly 2^40 passes the size rule (src = NULL then fails the
// next rule, so nothing is read), 2^40 + 1 = 257 x 4278255361 x 1 does not; no product overflows.
TEST(quantize_size_limit) {
  uint8_t d[64], sc[2];
  EXPECT(mokMxfp8Quantize(nullptr, mokDataBF16, 1, 1 << 20, 1 << 20, d, sc, nullptr, nullptr, nullptr),
         mokInvalidArgument, "'src' must not be NULL");
  EXPECT(mokMxfp8Quantize(nullptr, mokDataBF16, 1 << 10, 1 << 20, 1 << 10, d, sc, nullptr, nullptr, nullptr),
         mokInvalidArgument, "'src' must not be NULL");
  EXPECT(mokMxfp8Quantize(nullptr, mokDataBF16, 257, 4278255361ll, 1, d, sc, nullptr, nullptr, nullptr),
         mokInvalidArgument, "'batch' x 'rows' x 'cols' (257 x 4278255361 x 1)", "at most 2^40 = 1099511627776");
  EXPECT(mokMxfp8Quantize(nullptr, mokDataBF16, 1, 1 << 20, (1 << 20) + 1, d, sc, nullptr, nullptr, nullptr),
         mokInvalidArgument, "(1 x 1048576 x 1048577)");
  int64_t huge = std::numeric_limits<int64_t>::max();
  EXPECT(mokMxfp8Quantize(nullptr, mokDataBF16, huge, huge, huge, d, sc, nullptr, nullptr, nullptr), mokInvalidArgument,
         "at most 2^40");
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
  EXPECT(mokLayerAbort(nullptr, nullptr), mokInvalidArgument, "'layer'");
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
