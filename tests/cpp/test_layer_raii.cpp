// mok.hpp's C++ layer: mok::Layer owns one context (created once, destroyed exactly once, also across moves), its
// calls give what the C calls give, and every failure throws mok::Error with the C call's status and detail.
#include <cstdlib>
#include <cstring>
#include <mok/mok.hpp>
#include <random>
#include <set>
#include <type_traits>
#include <vector>

#include "check.hpp"
#include "worker_threads.hpp"

namespace {

static_assert(!std::is_copy_constructible_v<mok::Layer> && !std::is_copy_assignable_v<mok::Layer>,
              "a context has one owner");
static_assert(std::is_nothrow_move_constructible_v<mok::Layer> && std::is_nothrow_move_assignable_v<mok::Layer>,
              "a Layer moves into containers");

constexpr int E = 2, H = 32, I = 16, K = 2, T = 8, kWorkers = 3;

// A context runs comm_workers + compute_workers threads until it is destroyed: whether this process's worker
// threads come to `count` (worker_threads.hpp: a bounded wait for joined ones to leave /proc/self/task).
bool workers_reach(size_t count) {
  return mok_test::worker_threads_when([&](const std::set<std::string>& now) { return now.size() == count; }).size() ==
         count;
}

mokLayerConfig_t config() {
  mokLayerConfig_t c = MOK_LAYER_CONFIG_INIT;
  c.experts_per_rank = E, c.hidden = H, c.intermediate = I, c.top_k = K, c.max_tokens = T;
  c.expert_padding = 8, c.minibatch = 16, c.macrobatch = 32;
  c.comm_workers = 1, c.compute_workers = kWorkers - 1;
  return c;
}

// Caller memory for one world-1 context.
struct Memory {
  Memory() : sizes(mok::layer_sizes(config())) {
    peer = std::aligned_alloc(64, (sizes.peer_bytes + 63) / 64 * 64);
    workspace = std::aligned_alloc(64, (sizes.workspace_bytes + 63) / 64 * 64);
    m.peer_bases = &peer, m.peer_bytes = sizes.peer_bytes;
    m.workspace = workspace, m.workspace_bytes = sizes.workspace_bytes;
  }
  ~Memory() { std::free(peer), std::free(workspace); }
  mokLayerSizes_t sizes;
  void *peer, *workspace;
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
};

// The status and detail a call threw; mokSuccess when it did not throw.
template <class F>
mok::Error thrown(F f) {
  try {
    f();
  } catch (const mok::Error& e) {
    return e;
  }
  return mok::Error(mokSuccess, "");
}

}  // namespace

TEST(create_destroy_once_across_moves) {
  Memory mem;
  CHECK(workers_reach(0));
  {
    mok::Layer a(config(), mem.m);
    CHECK(a && workers_reach(kWorkers));
    mok::Layer b(std::move(a));
    CHECK(!a && b && workers_reach(kWorkers));  // moved, not recreated
    std::vector<mok::Layer> kept;
    kept.push_back(std::move(b));
    kept.reserve(8);  // moved again inside the vector
    CHECK(workers_reach(kWorkers));
    mok::Layer c;
    c = std::move(kept[0]);
    c = std::move(c);  // self-move keeps the context
    CHECK(c && workers_reach(kWorkers));
    Memory other;
    c = mok::Layer(config(), other.m);  // the old context is destroyed, the new one kept
    CHECK(c && workers_reach(kWorkers));
    c.reset();
    CHECK(!c && workers_reach(0));
    c = mok::Layer(config(), mem.m);  // the buffers of a destroyed context are reused as they are
  }
  CHECK_MSG(workers_reach(0), "%zu worker threads left", mok_test::worker_threads().size());
}

TEST(failures_throw_status_and_detail) {
  mokLayerConfig_t bad = config();
  bad.world = 0;
  mok::Error e = thrown([&] { mok::layer_sizes(bad); });
  CHECK(e.status() == mokInvalidArgument && e.detail().find("'config.world' (0)") != std::string::npos);
  CHECK(std::strstr(e.what(), "mokInvalidArgument") && std::strstr(e.what(), e.detail().c_str()));

  Memory mem;
  mokLayerMemory_t small = mem.m;
  small.peer_bytes = mem.sizes.peer_bytes - 64;
  e = thrown([&] { mok::Layer l(config(), small); });
  CHECK(e.status() == mokInvalidArgument && e.detail().find("memory.peer_bytes") != std::string::npos);

  mok::Layer layer(config(), mem.m);
  std::vector<uint16_t> x(T * H), out(T * H);
  std::vector<float> w(T * K);
  mokLayerWeights_t weights = MOK_LAYER_WEIGHTS_INIT;
  std::vector<uint16_t> gate(E * I * H), up(E * I * H), down(E * H * I);
  weights.gate = gate.data(), weights.up = up.data(), weights.down = down.data();
  e = thrown([&] { layer.forward(weights, x.data(), w.data(), out.data()); });
  CHECK_MSG(e.status() == mokInvalidUsage && e.detail().find("mokLayerBuildSchedule first") != std::string::npos, "%s",
            e.what());
  CHECK(layer.error().status == mokSuccess);  // a refused call in a group of one leaves the context usable

  mok::Layer moved(std::move(layer));
  e = thrown([&] { layer.build_schedule(static_cast<const int32_t*>(nullptr), 0); });
  CHECK(e.status() == mokInvalidArgument && e.detail().find("argument 'layer'") != std::string::npos);
  e = thrown([&] { layer.error(); });
  CHECK(e.status() == mokInvalidArgument);
}

// The stream parameter (last, nullptr by default) and mokLayerAbort's reason through the wrapper: a stream on the
// host executor throws mokInvalidArgument naming 'stream'; the reason, the pass and the rank reach error().
TEST(streams_and_abort_reason) {
  Memory mem;
  mok::Layer layer(config(), mem.m);
  std::vector<int32_t> ids(T * K, 1);
  int not_a_stream = 0;
  mok::Error e = thrown([&] { layer.build_schedule(ids.data(), T, &not_a_stream); });
  CHECK_MSG(e.status() == mokInvalidArgument && e.detail().find("argument 'stream'") != std::string::npos, "%s",
            e.what());
  layer.build_schedule(ids.data(), T);  // the default: no stream
  CHECK(layer.error().status == mokSuccess && layer.error().pass == 2);
  layer.abort("the trainer stops");
  mokLayerError_t record = layer.error();
  CHECK_MSG(record.status == mokPeerAbort && record.abort_rank == 0 && record.pass == 2 &&
                std::string(record.detail) == "rank 0 aborted the group: the trainer stops",
            "status %d abort_rank %d pass %llu detail '%s'", record.status, record.abort_rank,
            static_cast<unsigned long long>(record.pass), record.detail);
}

// Random bf16 bits of values in (-scale, scale).
std::vector<uint16_t> random_bf16(std::mt19937_64& rng, size_t n, float scale) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (uint16_t& b : v) {
    float f = u(rng) * scale;
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    b = static_cast<uint16_t>(bits >> 16);
  }
  return v;
}

// recompute with topk_weights (mokLayerRecomputeWeighted) on an input-scaled layer rebuilds the forward's slots
// bitwise; recompute without them throws, naming topk_weights.
TEST(weighted_recompute_rebuilds_the_slots) {
  std::mt19937_64 rng(mok_test::seed() + 7);
  mokLayerConfig_t scaled = config();
  scaled.routing_scale = mokRoutingScaleInput;
  Memory mem;
  CHECK(mok::layer_sizes(scaled).peer_bytes <= mem.sizes.peer_bytes &&
        mok::layer_sizes(scaled).workspace_bytes <= mem.sizes.workspace_bytes);
  mok::Layer layer(scaled, mem.m);
  std::vector<uint16_t> gate = random_bf16(rng, E * I * H, 0.3f), up = random_bf16(rng, E * I * H, 0.3f),
                        down = random_bf16(rng, E * H * I, 0.3f), x = random_bf16(rng, T * H, 2.0f);
  mokLayerWeights_t weights = MOK_LAYER_WEIGHTS_INIT;
  weights.gate = gate.data(), weights.up = up.data(), weights.down = down.data();
  std::vector<float> w(T * K);
  std::vector<int32_t> ids(T * K);
  for (int i = 0; i < T * K; ++i)
    w[i] = 0.25f + static_cast<float>(rng() % 8) / 8, ids[i] = static_cast<int32_t>(rng() % E);
  std::vector<uint16_t> out(T * H), forward_slots(T * K * H), recomputed(T * K * H, 1);
  layer.build_schedule(ids.data(), T);
  layer.forward(weights, x.data(), w.data(), out.data());
  layer.slots(forward_slots.data());
  mok::Error e = thrown([&] { layer.recompute(weights, x.data()); });
  CHECK_MSG(e.status() == mokInvalidArgument && e.detail().find("topk_weights") != std::string::npos, "%s", e.what());
  layer.recompute(weights, x.data(), w.data());
  layer.slots(recomputed.data());
  CHECK(recomputed == forward_slots);
  bool nonzero = false;
  for (uint16_t v : recomputed) nonzero = nonzero || (v & 0x7fff) != 0;
  CHECK(nonzero);
}

// The wrapper's forward, slots and backward against the same calls made through the C ABI: bitwise equal.
TEST(calls_match_the_c_abi) {
  std::mt19937_64 rng(mok_test::seed());
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto bf16 = [&](size_t n, float scale) { return random_bf16(rng, n, scale); };
  std::vector<uint16_t> gate = bf16(E * I * H, 0.3f), up = bf16(E * I * H, 0.3f), down = bf16(E * H * I, 0.3f);
  std::vector<uint16_t> x = bf16(T * H, 2.0f), dout = bf16(T * H, 1.0f);
  std::vector<float> w(T * K);
  std::vector<int64_t> ids(T * K);
  for (int i = 0; i < T * K; ++i) w[i] = u(rng), ids[i] = static_cast<int64_t>(rng() % (E + 1)) - 1;
  mokLayerWeights_t weights = MOK_LAYER_WEIGHTS_INIT;
  weights.gate = gate.data(), weights.up = up.data(), weights.down = down.data();
  struct Result {
    std::vector<uint16_t> out, slots, dx, dgate, dup, ddown;
    std::vector<float> dw;
  };
  auto grads_into = [](Result& r) {
    r.out.assign(T * H, 0), r.slots.assign(T * K * H, 0), r.dx.assign(T * H, 0), r.dw.assign(T * K, 0.0f);
    r.dgate.assign(E * I * H, 0), r.dup.assign(E * I * H, 0), r.ddown.assign(E * H * I, 0);
    mokLayerGrads_t g = MOK_LAYER_GRADS_INIT;
    g.dx = r.dx.data(), g.dtopk_weights = r.dw.data();
    g.dgate = r.dgate.data(), g.dup = r.dup.data(), g.ddown = r.ddown.data();
    return g;
  };
  Memory mem;
  Result cpp, c;
  {
    mok::Layer layer(config(), mem.m);
    mokLayerGrads_t g = grads_into(cpp);
    layer.build_schedule(ids.data(), T);
    layer.forward(weights, x.data(), w.data(), cpp.out.data());
    layer.slots(cpp.slots.data());
    layer.backward(weights, w.data(), dout.data(), g);
  }
  mokLayer_t layer = nullptr;
  mokLayerConfig_t cfg = config();
  CHECK(mokLayerCreate(&cfg, &mem.m, &layer) == mokSuccess);
  mokLayerGrads_t g = grads_into(c);
  CHECK(mokLayerBuildSchedule(layer, ids.data(), mokIndexInt64, T, nullptr) == mokSuccess);
  CHECK(mokLayerForward(layer, &weights, x.data(), w.data(), c.out.data(), nullptr) == mokSuccess);
  CHECK(mokLayerGetSlots(layer, c.slots.data(), nullptr) == mokSuccess);
  CHECK(mokLayerBackward(layer, &weights, w.data(), dout.data(), &g, nullptr) == mokSuccess);
  mokLayerDestroy(layer);
  CHECK(cpp.out == c.out && cpp.slots == c.slots && cpp.dx == c.dx && cpp.dw == c.dw);
  CHECK(cpp.dgate == c.dgate && cpp.dup == c.dup && cpp.ddown == c.ddown);
  bool nonzero = false;
  for (uint16_t v : c.out) nonzero = nonzero || (v & 0x7fff) != 0;
  CHECK(nonzero);  // the comparison saw a real result
}

MOK_TEST_MAIN
