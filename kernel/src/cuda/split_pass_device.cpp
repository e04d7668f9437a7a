// The split executor's pass enqueued on a stream (split_device.hpp): core's run_split_pass over device steps.
#include <vector>

#include "cuda/split_device.hpp"

#if MOK_WITH_GROUPED_GEMM
#include "cuda/grouped_gemm.hpp"
#endif

namespace mok::cuda {
namespace {

// Whether the device has block-scaled MMA for MXFP8's block-scaled kinds (core::split_dequantises): GemmArchitecture's
// sm100, compute capability 10.x.
bool block_scaled(const SplitDevice& d) {
  return d.architecture == 10;
}

// Each step of the plan as kernel launches on the stream; the first that cannot be enqueued is told in `failure`.
struct DeviceSteps {
  const SplitDevice& d;
  SplitFailure& failure;

  bool launched(cudaError_t e) {
    if (e == cudaSuccess) return true;
    failure.refusal = SplitRefusal::cuda_error;
    failure.error = e;
    return false;
  }
  bool dispatch(core::RowWindow w) { return launched(launch_dispatch(d, w)); }
  bool swiglu(core::RowWindow w) { return launched(launch_swiglu(d, w)); }
  bool swiglu_backward(core::RowWindow w) { return launched(launch_swiglu_backward(d, w)); }
  bool combine(core::RowWindow w) { return launched(launch_combine(d, w)); }
  bool shared_rows(core::SplitStep step) { return launched(launch_shared_rows(d, step)); }
  bool gradients(bool write) { return launched(launch_gradients(d, write)); }
  bool dequantise(core::GroupedGemm kind, core::RowWindow w) { return launched(launch_dequantise(d, kind, w)); }
  bool add_bias(core::GroupedGemm kind, core::RowWindow w) { return launched(launch_add_bias(d, kind, w)); }
  bool bias_gradients(core::RowWindow w) { return launched(launch_bias_gradients(d, w)); }
  bool barrier() { return launched(launch_group_barrier(d.view, core::WaitId::closing_barrier, d.stream)); }
  bool home_sums() { return launched(launch_home_sums(d)); }
  bool gemm(core::GroupedGemm kind, core::RowWindow w) {
    core::SplitRoutedGemm g = core::split_routed_gemm(d.view, kind, d.targets, d.dequantised, block_scaled(d));
    if (g.block_scaled) return grouped_mx(kind, w);
    return grouped(kind, g.bf16, d.view.s, d.view.sched, core::ring_periods(d.view.s), w);
  }
  bool shared_gemm(core::GroupedGemm kind) {
    const core::LayerShape& s = d.view.s;
    core::PassView host_view = d.view;  // the operands' addresses come from the own peer base: read it on the host
    host_view.peers = d.host_peers;
    return grouped(kind, core::shared_gemm_operands(host_view, kind, d.shared, d.targets), core::shared_expert_shape(s),
                   core::shared_schedule(s, d.shared, d.view.tokens), core::shared_periods(s), core::shared_window(s));
  }
#if MOK_WITH_GROUPED_GEMM
  // One BF16 grouped GEMM launch.
  bool grouped(core::GroupedGemm kind, const core::SplitGemmOperands& o, const core::LayerShape& shape,
               const core::Schedule& schedule, const core::RowPeriods& periods, core::RowWindow w) {
    GroupedGemmBf16 g{shape,    schedule, kind,
                      periods,  w,        o.a,
                      o.b,      o.d,      d.gemm_arguments,
                      o.d_fp32, o.c_fp32, static_cast<GemmArchitecture>(d.architecture)};
    cudaError_t e = cudaSuccess;
    return gemm_launched(grouped_gemm_bf16(g, d.gemm_workspace, d.gemm_workspace_bytes, d.stream, &e), e);
  }
  // One block-scaled grouped GEMM on SM100 (core::mx_block_scaled_kind; every other MXFP8 GEMM reads dequantised
  // operands).
  bool grouped_mx(core::GroupedGemm kind, core::RowWindow w) {
    core::SplitMxOperands o = core::split_mx_gemm_operands(d.view, kind);
    GroupedGemmMxfp8 g{d.view.s,
                       d.view.sched,
                       kind,
                       core::ring_periods(d.view.s),
                       w,
                       o.a,
                       o.a_stride,
                       o.a_scales,
                       o.b,
                       o.b_scales,
                       o.d,
                       d.gemm_arguments,
                       static_cast<GemmArchitecture>(d.architecture)};
    cudaError_t e = cudaSuccess;
    return gemm_launched(grouped_gemm_mxfp8(g, d.gemm_workspace, d.gemm_workspace_bytes, d.stream, &e), e);
  }
  // A GEMM launcher's status: ok, a failed CUDA call, or its refusal (gemm_refused, with the status).
  bool gemm_launched(GemmStatus s, cudaError_t e) {
    if (s == GemmStatus::cuda_error) return launched(e);
    if (s == GemmStatus::ok) return true;
    failure.refusal = SplitRefusal::gemm_refused;
    failure.gemm_status = static_cast<int>(s);
    return false;
  }
#else  // a build without CUTLASS is refused before the walk (no_gemm)
  bool grouped(core::GroupedGemm, const core::SplitGemmOperands&, const core::LayerShape&, const core::Schedule&,
               const core::RowPeriods&, core::RowWindow) {
    failure.refusal = SplitRefusal::no_gemm;
    return false;
  }
  bool grouped_mx(core::GroupedGemm kind, core::RowWindow w) { return grouped(kind, {}, {}, {}, {}, w); }
#endif
};

}  // namespace

const char* split_refusal_name(SplitRefusal refusal) {
  switch (refusal) {
    case SplitRefusal::none: return "none";
    case SplitRefusal::unsupported_layer: return "unsupported_layer";
    case SplitRefusal::no_gemm: return "no_gemm";
    case SplitRefusal::gemm_refused: return "gemm_refused";
    case SplitRefusal::cuda_error: return "cuda_error";
    case SplitRefusal::bad_device: return "bad_device";
  }
  return "unknown";
}

#if MOK_WITH_GROUPED_GEMM
size_t split_gemm_argument_bytes(const core::LayerShape& s) {
  size_t bf16 = grouped_gemm_bf16_argument_bytes(s.experts_per_rank);
  size_t mx = s.mxfp8 ? grouped_gemm_mxfp8_argument_bytes(s.experts_per_rank) : 0;  // 0 without the SM100 unit
  return bf16 > mx ? bf16 : mx;
}

GemmStatus split_gemm_workspace_bytes(const core::LayerShape& s, GemmArchitecture architecture, size_t* bytes,
                                      cudaError_t* error) {
  *bytes = 0;
  *error = cudaSuccess;
  // One GEMM's need (a BF16 or an MXFP8 launch of `kind` over `shape`), the largest kept in *bytes.
  auto take = [&](auto gemm, const core::LayerShape& shape, core::GroupedGemm kind, auto workspace_bytes) {
    gemm.architecture = architecture;
    gemm.shape = shape;
    gemm.kind = kind;
    size_t need = 0;
    GemmStatus st = workspace_bytes(gemm, &need, error);
    *bytes = need > *bytes ? need : *bytes;
    return st;
  };
  // A forward kind's fp32-product unit (an expert bias) is picked by a set d_fp32, which the query never reads.
  static float any_fp32;
  for (int k = 0; k < static_cast<int>(core::GroupedGemm::count); ++k) {
    auto kind = static_cast<core::GroupedGemm>(k);
    for (const core::LayerShape& shape : {s, core::shared_expert_shape(s)})
      if (GemmStatus st = take(GroupedGemmBf16{}, shape, kind, grouped_gemm_bf16_workspace_bytes); st != GemmStatus::ok)
        return st;
    GroupedGemmBf16 biased{};
    biased.d_fp32 = &any_fp32;
    if (core::mx_forward_kind(kind))
      if (GemmStatus st = take(biased, s, kind, grouped_gemm_bf16_workspace_bytes); st != GemmStatus::ok) return st;
    // The block-scaled unit only where the device has it: on SM90 every MXFP8 GEMM is a BF16 one (dequantised).
    if (!s.mxfp8 || architecture != GemmArchitecture::sm100 || !core::mx_block_scaled_kind(kind)) continue;
    if (GemmStatus st = take(GroupedGemmMxfp8{}, s, kind, grouped_gemm_mxfp8_workspace_bytes); st != GemmStatus::ok)
      return st;
  }
  return GemmStatus::ok;
}
#endif

bool enqueue_split_pass(const SplitDevice& d, SplitFailure* failure) {
  *failure = SplitFailure{};
  const core::LayerShape& s = d.view.s;
  if (!core::split_supports(s)) failure->refusal = SplitRefusal::unsupported_layer;
  core::SplitCall call = core::split_call(d.view, d.gradients, block_scaled(d));
  failure->missing = core::split_missing_buffer(d.view, call, d.targets, d.gradients, d.shared);
  // MXFP8's dispatch and SwiGLU quantise 32-row blocks in each CTA's staging.
  auto need = static_cast<int64_t>(core::max_value(core::mx_staging_values(s), core::mx_swiglu_staging_values(s)));
  if (s.mxfp8 && (!d.staging || d.staging_values < need) && !failure->missing)
    failure->missing = "staging (MXFP8's: mx_staging_values and mx_swiglu_staging_values per CTA)";
  if (s.mxfp8 && (!d.dequantised.a || !d.dequantised.b) && !failure->missing)
    failure->missing = "dequantised (MXFP8's scratch: dequantised_a_values and dequantised_b_values bf16)";
  bool group = s.world == 1 || (d.view.group && d.view.headers);
  if (d.ctas < 1 || !d.host_peers || !d.gemm_arguments || (d.staging_values > 0 && !d.staging) || failure->missing ||
      !group)
    failure->refusal = SplitRefusal::bad_device;
#if MOK_WITH_GROUPED_GEMM
  auto architecture = static_cast<GemmArchitecture>(d.architecture);
  bool units = architecture != GemmArchitecture::none && gemm_architecture(d.architecture) == architecture;
  if (failure->refusal == SplitRefusal::none && !units) {  // not a device this build carries grouped GEMMs for
    failure->refusal = SplitRefusal::gemm_refused;
    failure->gemm_status = static_cast<int>(GemmStatus::no_architecture);
  }
#else
  failure->refusal = SplitRefusal::no_gemm;
#endif
  core::RowPeriods periods = core::ring_periods(s);
  int64_t count = failure->refusal == SplitRefusal::none ? core::split_plan(s, d.view.kind, periods, call, nullptr) : 0;
  if (count < 0) failure->refusal = SplitRefusal::unsupported_layer;
  if (failure->refusal != SplitRefusal::none) return false;
  std::vector<core::SplitLaunch> launches(static_cast<size_t>(count));
  core::split_plan(s, d.view.kind, periods, call, launches.data());
  // The group's entry barrier first (the caller staged this call's inputs before it), once nothing is refused.
  if (cudaError_t e = launch_group_barrier(d.view, core::WaitId::entry_barrier, d.stream); e != cudaSuccess) {
    *failure =
        SplitFailure{SplitRefusal::cuda_error, -1, core::SplitStep::barrier, core::GroupedGemm::count, 0, nullptr, e};
    return false;
  }
  DeviceSteps steps{d, *failure};
  int64_t stopped = core::run_split_pass(launches.data(), count, steps);
  if (stopped == count) return true;
  failure->launch = stopped;
  failure->step = launches[static_cast<size_t>(stopped)].step;
  failure->gemm = launches[static_cast<size_t>(stopped)].gemm;
  return false;
}

}  // namespace mok::cuda
