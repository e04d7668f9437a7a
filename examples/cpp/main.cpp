// What a C++ trainer writes to use libmok, through the C++ wrapper (mok/mok.hpp): check the version, list the
// executors, then run one training step of an MoE layer on two expert-parallel ranks (threads of this process,
// host executor): routing, forward, backward. Every rank's output, input gradient, router-weight gradient and
// expert-weight gradients are compared with a float64 reference computed here, and the figures are printed.
// Exit status 0 when every result is within its tolerance.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mok/mok.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kWorld = 2, kExpertsPerRank = 2, kHidden = 64, kIntermediate = 32, kTopK = 2, kTokens = 24;
constexpr int kExperts = kWorld * kExpertsPerRank;

using bf16 = uint16_t;  // raw bfloat16 words, as libmok takes them

bf16 to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<bf16>(u >> 16);
}
double to_double(bf16 b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// 64-byte aligned memory, as libmok wants for the peer buffers and the workspace.
struct Aligned {
  explicit Aligned(size_t bytes) : p(std::aligned_alloc(64, (bytes + 63) / 64 * 64)) {}
  ~Aligned() { std::free(p); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  void* p;
};

// Every expert's weights (all ranks'), bf16: gate and up [E, I, H], down [E, H, I]. Rank r owns experts
// r * kExpertsPerRank ... and passes its slice.
struct Weights {
  std::vector<bf16> gate, up, down;
};

// One rank's tensors: its tokens' inputs, and what libmok writes.
struct Rank {
  std::vector<int32_t> ids;  // [T, K], global expert ids, -1 = no route
  std::vector<float> topk_weights;
  std::vector<bf16> x, dout;            // [T, H]
  std::vector<bf16> out, dx;            // [T, H], written by libmok
  std::vector<float> dtopk_weights;     // [T, K]
  std::vector<bf16> dgate, dup, ddown;  // this rank's experts' gradients
  double forward_ms = 0, backward_ms = 0;
  std::string failure;  // mok::Error's what(), if a call threw
};

std::vector<bf16> random_bf16(std::mt19937& rng, size_t n, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<bf16> v(n);
  for (bf16& b : v) b = to_bf16(u(rng));
  return v;
}

// One rank's training step through mok::Layer; a libmok failure is kept in rank.failure.
void run_rank(int r, const mokLayerConfig_t& base, void* const* peer_bases, const Weights& w, Rank& rank) {
  try {
    mokLayerConfig_t config = base;
    config.rank = r;
    mokLayerSizes_t sizes = mok::layer_sizes(config);
    Aligned workspace(sizes.workspace_bytes);
    mokLayerMemory_t memory = MOK_LAYER_MEMORY_INIT;
    memory.peer_bases = peer_bases;
    memory.peer_bytes = sizes.peer_bytes;
    memory.workspace = workspace.p;
    memory.workspace_bytes = sizes.workspace_bytes;
    mok::Layer layer(config, memory);

    size_t expert = static_cast<size_t>(kIntermediate) * kHidden, first = static_cast<size_t>(r) * kExpertsPerRank;
    mokLayerWeights_t weights = MOK_LAYER_WEIGHTS_INIT;
    weights.gate = w.gate.data() + first * expert;
    weights.up = w.up.data() + first * expert;
    weights.down = w.down.data() + first * expert;
    size_t th = static_cast<size_t>(kTokens) * kHidden, local = kExpertsPerRank * expert;
    rank.out.assign(th, 0), rank.dx.assign(th, 0), rank.dtopk_weights.assign(kTokens * kTopK, 0.0f);
    rank.dgate.assign(local, 0), rank.dup.assign(local, 0), rank.ddown.assign(local, 0);
    mokLayerGrads_t grads = MOK_LAYER_GRADS_INIT;
    grads.dx = rank.dx.data();
    grads.dtopk_weights = rank.dtopk_weights.data();
    grads.dgate = rank.dgate.data(), grads.dup = rank.dup.data(), grads.ddown = rank.ddown.data();

    // Each pass call's last argument is its stream: nullptr, as the host executor requires (it runs every call
    // on this thread, and each returns when its pass is done); a device executor would take a cudaStream_t.
    auto t0 = std::chrono::steady_clock::now();
    layer.build_schedule(rank.ids.data(), kTokens, nullptr);
    layer.forward(weights, rank.x.data(), rank.topk_weights.data(), rank.out.data(), nullptr);
    auto t1 = std::chrono::steady_clock::now();
    layer.backward(weights, rank.topk_weights.data(), rank.dout.data(), grads, nullptr);
    auto t2 = std::chrono::steady_clock::now();
    rank.forward_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    rank.backward_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  } catch (const mok::Error& e) {
    rank.failure = e.what();
  }
}

// The layer in float64 (docs/semantics.md without the bf16 roundings): every rank's out, dx and dtopk_weights,
// and every expert's weight gradients, summed over all ranks' routes.
struct Reference {
  std::vector<double> out[kWorld], dx[kWorld], dtopk[kWorld];
  std::vector<double> dgate, dup, ddown;  // [kExperts, ...]
};

double silu(double a) {
  return a / (1.0 + std::exp(-a));
}

Reference reference(const Weights& w, const Rank* ranks) {
  const int H = kHidden, I = kIntermediate;
  Reference ref;
  size_t expert = static_cast<size_t>(I) * H;
  ref.dgate.assign(kExperts * expert, 0.0), ref.dup.assign(kExperts * expert, 0.0);
  ref.ddown.assign(kExperts * expert, 0.0);
  std::vector<double> g(I), u(I), h(I), y(H), dh(I), dg(I), du(I);
  for (int r = 0; r < kWorld; ++r) {
    const Rank& rank = ranks[r];
    ref.out[r].assign(kTokens * H, 0.0), ref.dx[r].assign(kTokens * H, 0.0), ref.dtopk[r].assign(kTokens * kTopK, 0);
    for (int t = 0; t < kTokens; ++t) {
      const bf16 *x = &rank.x[t * H], *dout = &rank.dout[t * H];
      for (int k = 0; k < kTopK; ++k) {
        int e = rank.ids[t * kTopK + k];
        if (e < 0) continue;
        const bf16 *wg = &w.gate[e * expert], *wu = &w.up[e * expert], *wd = &w.down[e * expert];
        double wk = rank.topk_weights[t * kTopK + k], dw = 0.0;
        for (int i = 0; i < I; ++i) {
          g[i] = u[i] = 0.0;
          for (int j = 0; j < H; ++j) g[i] += to_double(x[j]) * to_double(wg[i * H + j]);
          for (int j = 0; j < H; ++j) u[i] += to_double(x[j]) * to_double(wu[i * H + j]);
          h[i] = silu(g[i]) * u[i];
        }
        for (int j = 0; j < H; ++j) {
          y[j] = 0.0;
          for (int i = 0; i < I; ++i) y[j] += h[i] * to_double(wd[j * I + i]);
          ref.out[r][t * H + j] += wk * y[j];
          dw += to_double(dout[j]) * y[j];
        }
        ref.dtopk[r][t * kTopK + k] = dw;
        for (int i = 0; i < I; ++i) {
          dh[i] = 0.0;
          for (int j = 0; j < H; ++j) dh[i] += wk * to_double(dout[j]) * to_double(wd[j * I + i]);
          double s = 1.0 / (1.0 + std::exp(-g[i]));
          dg[i] = dh[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
          du[i] = dh[i] * silu(g[i]);
        }
        for (int j = 0; j < H; ++j)
          for (int i = 0; i < I; ++i) {
            ref.dx[r][t * H + j] += dg[i] * to_double(wg[i * H + j]) + du[i] * to_double(wu[i * H + j]);
            ref.ddown[e * expert + j * I + i] += wk * to_double(dout[j]) * h[i];
            ref.dgate[e * expert + i * H + j] += dg[i] * to_double(x[j]);
            ref.dup[e * expert + i * H + j] += du[i] * to_double(x[j]);
          }
      }
    }
  }
  return ref;
}

// The largest difference between libmok's result and the reference, relative to the reference's largest magnitude.
template <class T, class Read>
double relative_error(const std::vector<T>& got, const double* want, size_t n, Read read) {
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(read(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return scale > 0.0 ? err / scale : err;
}

}  // namespace

int main() {
  mok::Version v = mok::version();
  std::printf("libmok %d.%d.%d (header %s)\n", v.major, v.minor, v.patch, MOK_VERSION_STRING);
  if (MOK_VERSION_CODE(v.major, v.minor, v.patch) != MOK_VERSION) {
    std::fprintf(stderr, "header and library versions differ\n");
    return 1;
  }
  std::printf("CUDA architectures: %s\n", mokCudaArchitectures()[0] ? mokCudaArchitectures() : "(none)");
  for (const mok::ExecutorStatus& e : mok::executors()) {
    std::printf("executor %-8s compiled=%d usable=%d%s%s\n", e.name.c_str(), e.compiled, e.supported,
                e.reason.empty() ? "" : "  ", e.reason.c_str());
  }

  // The group's config: the same on both ranks but for `rank`.
  mokLayerConfig_t config = MOK_LAYER_CONFIG_INIT;
  config.world = kWorld;
  config.experts_per_rank = kExpertsPerRank;
  config.hidden = kHidden;
  config.intermediate = kIntermediate;
  config.top_k = kTopK;
  config.max_tokens = kTokens;
  config.comm_workers = 1;
  config.compute_workers = 2;
  config.timeout_ms = 10000;  // a rank that fails makes the other fail within this, never hang
  config.executor = mokExecutorHost;

  std::mt19937 rng(std::random_device{}());
  // Scales that keep every intermediate (g, u, h, y) of order 1, where bf16's relative rounding is what it is.
  float scale = 1.0f / std::sqrt(static_cast<float>(kHidden));
  size_t all = static_cast<size_t>(kExperts) * kIntermediate * kHidden;
  Weights w{random_bf16(rng, all, 2.0f * scale), random_bf16(rng, all, 2.0f * scale), random_bf16(rng, all, 0.5f)};
  Rank ranks[kWorld];
  std::uniform_int_distribution<int> pick(-1, kExperts - 1);  // -1: a dropped route
  std::uniform_real_distribution<float> gate(0.0f, 1.0f);
  for (Rank& rank : ranks) {
    for (int i = 0; i < kTokens * kTopK; ++i) rank.ids.push_back(pick(rng)), rank.topk_weights.push_back(gate(rng));
    rank.x = random_bf16(rng, static_cast<size_t>(kTokens) * kHidden, 2.0f);
    rank.dout = random_bf16(rng, static_cast<size_t>(kTokens) * kHidden, 1.0f);
  }

  // Every rank's peer buffer, visible to both (ranks as threads share the address space).
  mokLayerSizes_t sizes;
  try {
    sizes = mok::layer_sizes(config);
  } catch (const mok::Error& e) {
    std::fprintf(stderr, "mok::layer_sizes: %s\n", e.what());
    return 1;
  }
  std::vector<std::unique_ptr<Aligned>> peers;
  void* peer_bases[kWorld];
  for (int r = 0; r < kWorld; ++r) {
    peers.push_back(std::make_unique<Aligned>(sizes.peer_bytes));
    peer_bases[r] = peers.back()->p;
  }
  std::printf("layer: world %d, %d experts per rank, H %d, I %d, top-%d, %d tokens per rank; peer buffer %zu bytes\n",
              kWorld, kExpertsPerRank, kHidden, kIntermediate, kTopK, kTokens, sizes.peer_bytes);

  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r)
    threads.emplace_back(run_rank, r, std::cref(config), peer_bases, std::cref(w), std::ref(ranks[r]));
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r)
    if (!ranks[r].failure.empty()) {
      std::fprintf(stderr, "rank %d: %s\n", r, ranks[r].failure.c_str());
      return 1;
    }

  // Tolerance: libmok rounds g, u, h, y_k and the output to bf16 (2^-9 relative each) and the gradients' chain
  // (dy, dh, dg, du, dx) likewise; 3e-2 of the largest magnitude covers their sum over the H- and I-long dot
  // products with a wide margin, and a wrong route, weight or transpose misses it by far (errors of order 1).
  const double tolerance = 3e-2;
  Reference ref = reference(w, ranks);
  auto read_bf16 = [](bf16 b) { return to_double(b); };
  auto read_float = [](float f) { return static_cast<double>(f); };
  bool ok = true;
  size_t expert = static_cast<size_t>(kIntermediate) * kHidden, local = kExpertsPerRank * expert;
  for (int r = 0; r < kWorld; ++r) {
    const Rank& rank = ranks[r];
    size_t th = static_cast<size_t>(kTokens) * kHidden, first = r * local;
    double errors[] = {
        relative_error(rank.out, ref.out[r].data(), th, read_bf16),
        relative_error(rank.dx, ref.dx[r].data(), th, read_bf16),
        relative_error(rank.dtopk_weights, ref.dtopk[r].data(), rank.dtopk_weights.size(), read_float),
        relative_error(rank.dgate, ref.dgate.data() + first, local, read_bf16),
        relative_error(rank.dup, ref.dup.data() + first, local, read_bf16),
        relative_error(rank.ddown, ref.ddown.data() + first, local, read_bf16),
    };
    const char* names[] = {"out", "dx", "dtopk_weights", "dgate", "dup", "ddown"};
    std::printf("rank %d: forward %.2f ms, backward %.2f ms; max error / max |reference|:", r, rank.forward_ms,
                rank.backward_ms);
    for (int i = 0; i < 6; ++i) {
      std::printf(" %s %.2e", names[i], errors[i]);
      ok = ok && errors[i] <= tolerance;
    }
    std::printf("\n");
  }
  std::printf("%s the float64 reference (tolerance %.0e)\n", ok ? "every result matches" : "MISMATCH with", tolerance);
  return ok ? 0 : 1;
}
