// The self-test's GEMM stage (cuda/selftest.hpp): the split executor's grouped GEMM (SM100 or SM90, the device's),
// on the GPU, against core's host GEMM (core/gemm.hpp reference_gemm, whose bits the host executor's micro-kernels
// give) of the same bytes. The routing leaves one expert without rows (an M = 0 problem) and gives another more rows
// than one 256-row tile, so the problems are ragged as a real schedule's are.
#include <cuda_runtime_api.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/gemm.hpp"
#include "core/grouped_problems.hpp"
#include "core/platform.hpp"
#include "core/split_pass.hpp"
#include "cuda/selftest.hpp"
#include "cuda/wait.hpp"

#if MOK_WITH_GROUPED_GEMM
#include "cuda/grouped_gemm.hpp"
#endif

namespace mok::cuda {

#if !MOK_WITH_GROUPED_GEMM
mokStatus_t selftest_gemm_tile(const SelftestSetup&, Text* text) {
  text->add("libmok was built without CUTLASS 4.2's headers, so it has no grouped GEMM (docs/gpu.md)");
  return mokNotCompiled;
}
#else
namespace {

using core::bf16_t;

// The layer's shape for the stage: one rank, four local experts, H and I multiples of the GEMM's tiles.
core::LayerShape stage_shape() {
  core::LayerShape s{};
  s.world = 1;
  s.rank = 0;
  s.experts_per_rank = 4;
  s.hidden = 512;
  s.intermediate = 256;
  s.top_k = 2;
  s.max_tokens = 300;
  s.expert_padding = 128;
  s.minibatch = 128;
  s.macrobatch = 128;
  s.comm_workers = s.compute_workers = 1;
  return s;
}

// Routes: expert 0 half of them (more than a 256-row tile), 1 a quarter, 3 an eighth, expert 2 none, -1 the rest.
std::vector<int32_t> stage_routing(const core::LayerShape& s, std::mt19937_64& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(s.max_tokens) * s.top_k);
  const int32_t pick[8] = {0, 0, 0, 0, 1, 1, 3, -1};
  for (int32_t& id : ids) id = pick[rng() % 8];
  return ids;
}

constexpr bf16_t kSentinel = 0x7fbf;  // a NaN no GEMM of finite inputs writes: rows in no problem must keep it

struct Worst {
  double error = 0, ratio = 0;  // the largest |device - host| and the largest error / tolerance
  int64_t bad = 0, checked = 0;
  int64_t bad_index = -1;
  float bad_device = 0, bad_host = 0, bad_tolerance = 0;
};

// One kind's GEMM on the GPU and on the host, compared. The tolerance of element (i, j): the host sums the K
// products in order (reference_gemm), the tensor cores in their own order. Each product of two bf16 is exact in
// fp32; each fp32 sum of K of them is within K * 2^-24 * S of the exact sum (S = sum_k |a_ik b_jk|), and within
// K * 2^-23 * S if the tensor core's adder truncates instead of rounding: so the two sums differ by at most
// K * 2^-22 * S. Each is then rounded to bf16, which moves it by at most 2^-8 of its magnitude. A wrong row,
// column, expert or stride gives errors of the order of the values themselves, far above this.
struct KindRun {
  core::GroupedGemm kind;
  const char* name;
  int64_t a_rows, a_cols, d_cols;  // A [a_rows, a_cols] (the ring), D [a_rows, d_cols]
};

mokStatus_t run_kind(const SelftestSetup& setup, const core::LayerShape& s, const core::Schedule& host_sched,
                     const int32_t* device_experts, GemmArchitecture architecture, const KindRun& k,
                     std::mt19937_64& rng, Worst* worst, Text* text) {
  int64_t period = host_sched.total_rows;
  core::RowPeriods periods{period, period};
  core::RowWindow window{0, period};
  core::GroupedBuffers sizes = core::grouped_buffers(s, k.kind, periods);
  std::vector<bf16_t> a = random_bf16(static_cast<size_t>(sizes.a), 1.0f, rng), b = random_bf16(sizes.b, 1.0f, rng);
  std::vector<bf16_t> d(static_cast<size_t>(sizes.c), kSentinel);
  DeviceBuffers dev;
  void *da = nullptr, *db = nullptr, *dd = nullptr, *args = nullptr, *workspace = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&dev.stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&dev.done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = dev.alloc(a.size() * 2, &da);
  if (e == cudaSuccess) e = dev.alloc(b.size() * 2, &db);
  if (e == cudaSuccess) e = dev.alloc(d.size() * 2, &dd);
  if (e == cudaSuccess) e = dev.alloc(grouped_gemm_bf16_argument_bytes(s.experts_per_rank), &args);
  if (e == cudaSuccess) e = cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(dd, d.data(), d.size() * 2, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) return cuda_failed(text, "setting up the GEMM's buffers", e);
  core::Schedule device_sched{const_cast<int32_t*>(device_experts), nullptr, host_sched.total_rows};
  GroupedGemmBf16 gemm{s,
                       device_sched,
                       k.kind,
                       periods,
                       window,
                       static_cast<const bf16_t*>(da),
                       static_cast<const bf16_t*>(db),
                       static_cast<bf16_t*>(dd),
                       args,
                       nullptr,
                       nullptr,
                       architecture};
  size_t workspace_bytes = 0;
  GemmStatus gs = grouped_gemm_bf16_workspace_bytes(gemm, &workspace_bytes, &e);
  if (gs == GemmStatus::ok && (e = dev.alloc(workspace_bytes, &workspace)) != cudaSuccess) gs = GemmStatus::cuda_error;
  uint64_t deadline = core::now_ns() + static_cast<uint64_t>(setup.timeout_ms) * 1000000ull;
  if (gs == GemmStatus::ok) gs = grouped_gemm_bf16(gemm, workspace, workspace_bytes, dev.stream, &e);
  if (gs == GemmStatus::cuda_error) return cuda_failed(text, k.name, e);
  if (gs != GemmStatus::ok) {
    text->add("%s: the grouped GEMM refused the stage's problems: %s", k.name, gemm_status_name(gs));
    return mokInternalError;
  }
  if ((e = cudaEventRecord(dev.done, dev.stream)) != cudaSuccess) return cuda_failed(text, k.name, e);
  e = wait_event(dev.done, deadline);
  if (e == cudaErrorNotReady) {
    dev.keep = true;
    text->add("%s: the grouped GEMM did not finish within %d ms (options.timeout_ms)", k.name, setup.timeout_ms);
    return mokTimeout;
  }
  if (e == cudaSuccess) e = cudaMemcpy(d.data(), dd, d.size() * 2, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return cuda_failed(text, k.name, e);

  // The host's bytes: reference_gemm per expert problem from the same data, and S for each element's tolerance.
  core::GroupedLayout l = core::grouped_layout(s, k.kind);
  std::vector<bf16_t> expected(d.size(), kSentinel);
  std::vector<float> scratch;
  for (int ex = 0; ex < s.experts_per_rank; ++ex) {
    core::GroupedProblem p = core::grouped_problem(s, host_sched, k.kind, periods, window, ex);
    if (p.m == 0) continue;
    scratch.assign(core::gemm_scratch_floats(p.m, p.n, p.k, true), 0.0f);
    core::Gemm g = core::problem_gemm(p, l, a.data(), b.data(), expected.data(), core::Epilogue::store_bf16);
    core::reference_gemm(g, scratch.data());
    for (int i = 0; i < p.m; ++i)
      for (int j = 0; j < p.n; ++j) {
        double sum_abs = 0;
        for (int q = 0; q < p.k; ++q)
          sum_abs += std::fabs(static_cast<double>(core::bf16_to_float(a[p.a + i * l.lda + q])) *
                               core::bf16_to_float(b[p.b + j * l.ldb + q]));
        int64_t at = p.c + i * l.ldc + j;
        float host = core::bf16_to_float(expected[at]), device = core::bf16_to_float(d[at]);
        double tol = p.k * std::ldexp(sum_abs, -22) + std::ldexp(std::fabs(host) + std::fabs(device), -8);
        double err = std::fabs(static_cast<double>(device) - host);
        ++worst->checked;
        bool ok = err <= tol;  // false for NaN too
        if (ok && err > worst->error) worst->error = err;
        if (ok && tol > 0 && err / tol > worst->ratio) worst->ratio = err / tol;
        if (!ok && worst->bad++ == 0) {
          worst->bad_index = at;
          worst->bad_device = device;
          worst->bad_host = host;
          worst->bad_tolerance = static_cast<float>(tol);
        }
      }
  }
  if (worst->bad) {
    int64_t row = worst->bad_index / k.d_cols, col = worst->bad_index % k.d_cols;
    text->add(
        "%s: %lld of %lld elements differ from the host's beyond the tolerance; the first, D[%lld][%lld]: "
        "device %g, host %g, tolerance %g",
        k.name, static_cast<long long>(worst->bad), static_cast<long long>(worst->checked), static_cast<long long>(row),
        static_cast<long long>(col), worst->bad_device, worst->bad_host, worst->bad_tolerance);
    return mokInternalError;
  }
  // Rows in no problem (padding) must hold the sentinel still: the GEMM wrote nothing outside its problems.
  for (size_t i = 0; i < d.size(); ++i)
    if (expected[i] == kSentinel && d[i] != kSentinel) {
      text->add("%s: the GEMM wrote D[%zu][%zu] (0x%04x), which lies in no expert's problem (a padding row)", k.name,
                i / static_cast<size_t>(k.d_cols), i % static_cast<size_t>(k.d_cols), d[i]);
      return mokInternalError;
    }
  return mokSuccess;
}

}  // namespace

mokStatus_t selftest_gemm_tile(const SelftestSetup& setup, Text* text) {
  int cc_major = 0;
  if (mokStatus_t s = open_gemm_device(setup, text, &cc_major); s != mokSuccess) return s;
  text->add("seed %llu: ", static_cast<unsigned long long>(setup.seed));  // --seed repeats the inputs
  std::mt19937_64 rng(setup.seed);
  core::LayerShape s = stage_shape();
  std::vector<int32_t> ids = stage_routing(s, rng);
  const int32_t* id_ptrs[1] = {ids.data()};
  int32_t tokens[1] = {s.max_tokens};
  std::vector<int32_t> experts(static_cast<size_t>(2 * s.experts_per_rank));
  std::vector<core::RowRef> rows(static_cast<size_t>(core::max_recv_rows(s)));
  core::Schedule sched{experts.data(), rows.data(), 0};
  core::build_schedule(s, core::Routing{id_ptrs, tokens}, sched);
  DeviceBuffers dev;
  void* device_experts = nullptr;
  cudaError_t e = dev.alloc(experts.size() * sizeof(int32_t), &device_experts);
  if (e == cudaSuccess)
    e = cudaMemcpy(device_experts, experts.data(), experts.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
  if (e != cudaSuccess) return cuda_failed(text, "copying the schedule", e);
  const KindRun kinds[2] = {{core::GroupedGemm::gate, "gate", sched.total_rows, s.hidden, s.intermediate},
                            {core::GroupedGemm::down, "down", sched.total_rows, s.intermediate, s.hidden}};
  Worst worst;
  for (const KindRun& k : kinds) {
    mokStatus_t st = run_kind(setup, s, sched, static_cast<const int32_t*>(device_experts), gemm_architecture(cc_major),
                              k, rng, &worst, text);
    if (st == mokTimeout) dev.keep = true;
    if (st != mokSuccess) return st;
  }
  text->add(
      "gate (H %d -> I %d) and down (I %d -> H %d) over %d experts with %d, %d, %d and %d rows: %lld elements "
      "as the host computes them within the accumulation-order tolerance (largest difference %g, %.2f of its "
      "tolerance); padding rows untouched",
      s.hidden, s.intermediate, s.intermediate, s.hidden, s.experts_per_rank, core::expert_count(sched, 0),
      core::expert_count(sched, 1), core::expert_count(sched, 2), core::expert_count(sched, 3),
      static_cast<long long>(worst.checked), worst.error, worst.ratio);
  return mokSuccess;
}
#endif

}  // namespace mok::cuda
