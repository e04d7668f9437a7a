// The kept-context backward (core::PassKind::backward_kept: the ring still holds the forward's x, g and u)
// against the plain one, over call sequences that could leave the ring stale: a second backward of the
// same context, a recompute, a forward with other x on the same schedule, a schedule rebuilt. Every
// backward of a context must give the same bits, kept or not (the ring fits every row, so the first
// backward after each forward or recompute is kept and the next is not).
#include <algorithm>
#include <cstring>

#include "group.hpp"

using namespace mok_test;

namespace {

// Every rank's peer buffer and workspace for p's layer, in this process (ranks as threads).
struct Buffers {
  mokLayerSizes_t sizes;
  std::vector<std::unique_ptr<AlignedBuffer>> peers, work;
  std::vector<void*> bases;

  Buffers(const ref::Problem& p, const Knobs& k) : sizes(sizes_for(p, k)) {
    for (int r = 0; r < p.world; ++r) {
      peers.emplace_back(new AlignedBuffer(sizes.peer_bytes));
      work.emplace_back(new AlignedBuffer(sizes.workspace_bytes));
      bases.push_back(peers.back()->p);
    }
  }
  mokStatus_t create(const ref::Problem& p, const Knobs& k, int r, mokLayer_t* layer) {
    mokLayerConfig_t c = config_for(p, k, r);
    mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
    m.peer_bases = bases.data();
    m.workspace = work[static_cast<size_t>(r)]->p;
    m.workspace_bytes = sizes.workspace_bytes;
    return mokLayerCreate(&c, &m, layer);
  }
};

// The layer both tests run: 2 ranks, a shared expert, small widths.
Spec two_ranks() {
  Spec spec;
  spec.world = 2;
  spec.hidden = 20;
  spec.inter = 12;
  spec.shared_inter = 8;
  spec.max_tokens = 13;
  return spec;
}

struct Run {
  std::vector<Bf16Grads> grads;  // every backward's outputs, in call order
};

// Bit for bit (dtopk_weights too: compared as floats, a NaN would never equal itself).
bool same(const Bf16Grads& a, const Bf16Grads& b) {
  bool dw = a.dw.size() == b.dw.size() && std::memcmp(a.dw.data(), b.dw.data(), a.dw.size() * sizeof(float)) == 0;
  return a.dx == b.dx && dw && a.dgate == b.dgate && a.dup == b.dup && a.ddown == b.ddown && a.dsgate == b.dsgate &&
         a.dsup == b.dsup && a.dsdown == b.dsdown;
}

TEST(every_backward_of_a_context_gives_the_same_bits_kept_or_not) {
  std::mt19937_64 rng(seed() + 71);
  Spec spec = two_ranks();
  ref::Problem p = make_problem(spec, rng);
  ref::Problem other = p;  // another x, as many tokens: another forward on the same schedule
  for (int r = 0; r < p.world; ++r) other.x[r] = random_bf16(p.x[r].size(), 1.0, rng);
  Knobs k;
  k.macrobatch = 256;  // every row of the schedule fits in the ring: the first backward is kept
  Buffers buffers(p, k);
  std::vector<Run> runs(static_cast<size_t>(p.world));
  std::vector<std::string> failures(static_cast<size_t>(p.world));
  each_rank(p.world, [&](int r) {
    auto ok = [&](mokStatus_t s, const char* call) {
      if (s != mokSuccess && failures[static_cast<size_t>(r)].empty())
        failures[static_cast<size_t>(r)] = std::string(call) + ": " + mokGetLastError();
      return s == mokSuccess;
    };
    mokLayer_t layer = nullptr;
    if (!ok(buffers.create(p, k, r, &layer), "create")) return;
    mokLayerWeights_t w = bf16_weights(p, r);
    int T = p.tokens[r];
    std::vector<int32_t> ids(p.ids[r].begin(), p.ids[r].end());
    std::vector<uint16_t> out(static_cast<size_t>(T) * p.hidden);
    Run& run = runs[static_cast<size_t>(r)];
    auto backward = [&] {
      run.grads.emplace_back(p, r, 0x7fc0, -1.0f);
      mokLayerGrads_t g = run.grads.back().grads();
      return ok(mokLayerBackward(layer, &w, p.topk_weights[r].data(), p.dout[r].data(), &g, nullptr), "backward");
    };
    auto schedule = [&] { return ok(mokLayerBuildSchedule(layer, ids.data(), mokIndexInt32, T, nullptr), "schedule"); };
    auto forward = [&](const ref::Problem& q) {
      return ok(mokLayerForward(layer, &w, q.x[r].data(), p.topk_weights[r].data(), out.data(), nullptr), "forward");
    };
    // 0 kept, 1 plain; recompute: 2 kept; other x: 3 kept, 4 plain; schedule rebuilt: 5 kept.
    bool go = schedule() && forward(p) && backward() && backward();
    go = go && ok(mokLayerRecompute(layer, &w, p.x[r].data(), nullptr), "recompute") && backward();
    go = go && forward(other) && backward() && backward();
    go = go && schedule() && forward(p) && backward();
    mokLayerDestroy(layer);
  });
  for (int r = 0; r < p.world; ++r) {
    const Run& run = runs[static_cast<size_t>(r)];
    CHECK_MSG(failures[static_cast<size_t>(r)].empty(), "rank %d: %s", r, failures[static_cast<size_t>(r)].c_str());
    if (run.grads.size() != 6) continue;
    CHECK_MSG(same(run.grads[0], run.grads[1]), "rank %d: the kept backward differs from the plain one", r);
    CHECK_MSG(same(run.grads[0], run.grads[2]), "rank %d: the backward after a recompute differs", r);
    CHECK_MSG(same(run.grads[3], run.grads[4]), "rank %d: other x: the kept backward differs from the plain one", r);
    CHECK_MSG(!same(run.grads[0], run.grads[3]), "rank %d: other x gave the same gradients (the check is blind)", r);
    CHECK_MSG(same(run.grads[0], run.grads[5]), "rank %d: the backward after a rebuilt schedule differs", r);
  }
}

// mokLayerRestoreContext: a forward's context kept by the caller (its x and slots) and put back after other
// forwards, other schedules among them, gives the backward that followed the forward directly, bit for bit. The
// ring fits every row, so a restore that trusted the ring would read the last forward's g and u.
TEST(a_restored_context_gives_the_backward_of_its_forward) {
  std::mt19937_64 rng(seed() + 72);
  Spec spec = two_ranks();
  ref::Problem p = make_problem(spec, rng);
  ref::Problem q = make_problem(spec, rng);  // another layer of the same shape: other ids, x and weights
  Knobs k;
  k.macrobatch = 256;
  // The layer is sized for the more tokens of the two (a rank's count is drawn per problem).
  auto most = [](const ref::Problem& of) { return *std::max_element(of.tokens.begin(), of.tokens.end()); };
  const ref::Problem& sizing = most(p) >= most(q) ? p : q;
  Buffers buffers(sizing, k);
  std::vector<Run> runs(static_cast<size_t>(p.world));
  std::vector<std::string> failures(static_cast<size_t>(p.world));
  std::vector<int> refusals(static_cast<size_t>(p.world), 0);
  each_rank(p.world, [&](int r) {
    auto ok = [&](mokStatus_t s, const char* call) {
      if (s != mokSuccess && failures[static_cast<size_t>(r)].empty())
        failures[static_cast<size_t>(r)] = std::string(call) + ": " + mokGetLastError();
      return s == mokSuccess;
    };
    mokLayer_t layer = nullptr;
    if (!ok(buffers.create(sizing, k, r, &layer), "create")) return;
    Run& run = runs[static_cast<size_t>(r)];
    size_t T = static_cast<size_t>(p.tokens[r]), TQ = static_cast<size_t>(q.tokens[r]);
    std::vector<uint16_t> out(std::max(T, TQ) * p.hidden), slots(T * p.top_k * p.hidden);
    std::vector<uint16_t> slots_q(TQ * q.top_k * q.hidden);
    auto schedule = [&](const ref::Problem& of) {
      std::vector<int32_t> ids(of.ids[r].begin(), of.ids[r].end());
      return ok(mokLayerBuildSchedule(layer, ids.data(), mokIndexInt32, of.tokens[r], nullptr), "schedule");
    };
    auto forward = [&](const ref::Problem& of, std::vector<uint16_t>& kept) {
      mokLayerWeights_t w = bf16_weights(of, r);
      return ok(mokLayerForward(layer, &w, of.x[r].data(), of.topk_weights[r].data(), out.data(), nullptr),
                "forward") &&
             ok(mokLayerGetSlots(layer, kept.data(), nullptr), "slots");
    };
    auto backward = [&](const ref::Problem& of) {
      mokLayerWeights_t w = bf16_weights(of, r);
      run.grads.emplace_back(of, r, 0x7fc0, -1.0f);
      mokLayerGrads_t g = run.grads.back().grads();
      return ok(mokLayerBackward(layer, &w, of.topk_weights[r].data(), of.dout[r].data(), &g, nullptr), "backward");
    };
    auto restore = [&](const void* x, const void* y, void* stream) {
      return mokLayerRestoreContext(layer, x, y, stream);
    };
    // Refused without a schedule, a NULL x or a stream; none of them stops the group.
    refusals[static_cast<size_t>(r)] += restore(p.x[r].data(), slots.data(), nullptr) == mokInvalidUsage;
    bool go = schedule(p);
    refusals[static_cast<size_t>(r)] +=
        restore(T ? nullptr : p.x[r].data(), slots.data(), nullptr) == (T ? mokInvalidArgument : mokSuccess);
    refusals[static_cast<size_t>(r)] += restore(p.x[r].data(), slots.data(), &run) == mokInvalidArgument;
    // 0: p's backward straight after its forward. 1: p's context restored after q's forward (q's schedule, q's
    // ring) and q's backward. 2: q's, restored after p's forward.
    go = go && forward(p, slots) && backward(p);
    go = go && schedule(p) && forward(p, slots) && schedule(q) && forward(q, slots_q) && backward(q);
    go = go && schedule(p) && ok(restore(p.x[r].data(), slots.data(), nullptr), "restore") && backward(p);
    go = go && schedule(q) && forward(q, slots_q) && backward(q);
    go = go && schedule(p) && forward(p, slots) && schedule(q) &&
         ok(restore(q.x[r].data(), slots_q.data(), nullptr), "restore") && backward(q);
    mokLayerDestroy(layer);
  });
  for (int r = 0; r < p.world; ++r) {
    const Run& run = runs[static_cast<size_t>(r)];
    CHECK_MSG(failures[static_cast<size_t>(r)].empty(), "rank %d: %s", r, failures[static_cast<size_t>(r)].c_str());
    CHECK_MSG(refusals[static_cast<size_t>(r)] == 3, "rank %d: %d of the 3 bad restores refused as they should be", r,
              refusals[static_cast<size_t>(r)]);
    if (run.grads.size() != 5) continue;
    CHECK_MSG(same(run.grads[0], run.grads[2]), "rank %d: a restored context's backward differs from its forward's", r);
    CHECK_MSG(same(run.grads[3], run.grads[4]), "rank %d: q's restored context's backward differs", r);
    CHECK_MSG(same(run.grads[1], run.grads[3]), "rank %d: q's backward differs between runs", r);
    CHECK_MSG(!same(run.grads[0], run.grads[1]), "rank %d: p and q gave the same gradients (the check is blind)", r);
  }
}

}  // namespace

MOK_TEST_MAIN
