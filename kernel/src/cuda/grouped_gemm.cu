// The grouped-GEMM launcher (grouped_gemm.hpp): from the kind, the instantiation that serves it and the
// operands it reads, among the units of the launch's architecture. No CUTLASS here: each instantiation is its own
// unit (grouped_gemm_instances.hpp).
#include <algorithm>

#include "cuda/grouped_gemm_instances.hpp"

#ifndef MOK_WITH_SM100_GEMM
#define MOK_WITH_SM100_GEMM 0
#endif
#ifndef MOK_WITH_SM90_GEMM
#define MOK_WITH_SM90_GEMM 0
#endif

namespace mok::cuda {
namespace grouped_gemm_launcher {  // named: nvcc names an anonymous one after the file's absolute path

// The five BF16 instantiations of one architecture.
struct Family {
  const GroupedGemmInstance& (*forward)();
  const GroupedGemmInstance& (*forward_f32)();
  const GroupedGemmInstance& (*dgrad)();
  const GroupedGemmInstance& (*dgrad_partial)();
  const GroupedGemmInstance& (*wgrad)();
};

const Family* family(GemmArchitecture architecture) {
#if MOK_WITH_SM100_GEMM
  static const Family sm100{&grouped_gemm_sm100_forward, &grouped_gemm_sm100_forward_f32, &grouped_gemm_sm100_dgrad,
                            &grouped_gemm_sm100_dgrad_partial, &grouped_gemm_sm100_wgrad};
  if (architecture == GemmArchitecture::sm100) return &sm100;
#endif
#if MOK_WITH_SM90_GEMM
  static const Family sm90{&grouped_gemm_sm90_forward, &grouped_gemm_sm90_forward_f32, &grouped_gemm_sm90_dgrad,
                           &grouped_gemm_sm90_dgrad_partial, &grouped_gemm_sm90_wgrad};
  if (architecture == GemmArchitecture::sm90) return &sm90;
#endif
  (void)architecture;
  return nullptr;
}

struct Route {
  const GroupedGemmInstance& (*instance)();
  GemmOperands operands;
};

// Every pointer a kind uses is set and every other is null: a missing operand or one meant for another kind
// is refused before anything runs.
bool uses_exactly(const GroupedGemmBf16& g, bool d, bool d_fp32, bool c_fp32) {
  return g.a && g.b && (g.d != nullptr) == d && (g.d_fp32 != nullptr) == d_fp32 && (g.c_fp32 != nullptr) == c_fp32;
}

// The table of grouped_gemm.hpp's GroupedGemmBf16 comment, over the launch architecture's units. The workspace
// query needs the kind only, not the pointers (`operands` false).
GemmStatus route(const GroupedGemmBf16& g, Route* r, bool operands = true) {
  using core::GroupedGemm;
  const Family* units = family(g.architecture);
  if (units == nullptr) return GemmStatus::no_architecture;
  bool ok = false;
  switch (g.kind) {
    case GroupedGemm::gate:
    case GroupedGemm::up:
    case GroupedGemm::down:  // bf16 D, or (an expert bias to add before the rounding) fp32 D
      ok = uses_exactly(g, true, false, false) || uses_exactly(g, false, true, false);
      *r = g.d_fp32 ? Route{units->forward_f32, {g.a, g.b, g.d_fp32, nullptr, 0.0f}}
                    : Route{units->forward, {g.a, g.b, g.d, nullptr, 0.0f}};
      break;
    case GroupedGemm::dgrad_h:
      ok = uses_exactly(g, true, false, false);
      *r = Route{units->dgrad, {g.a, g.b, g.d, nullptr, 0.0f}};
      break;
    case GroupedGemm::dgrad_x_gate:
      ok = uses_exactly(g, false, true, false);
      *r = Route{units->dgrad_partial, {g.a, g.b, g.d_fp32, nullptr, 0.0f}};
      break;
    case GroupedGemm::dgrad_x_up:
      ok = uses_exactly(g, true, false, true);
      *r = Route{units->dgrad, {g.a, g.b, g.d, g.c_fp32, 1.0f}};
      break;
    case GroupedGemm::wgrad_down:
    case GroupedGemm::wgrad_gate:
    case GroupedGemm::wgrad_up:
      ok = uses_exactly(g, false, true, false);
      *r = Route{units->wgrad, {g.a, g.b, g.d_fp32, g.d_fp32, 1.0f}};  // main_grad += A B^T
      break;
    default: return GemmStatus::bad_kind;
  }
  return ok || !operands ? GemmStatus::ok : GemmStatus::bad_operands;
}

}  // namespace grouped_gemm_launcher
using namespace grouped_gemm_launcher;

const char* gemm_status_name(GemmStatus status) {
  switch (status) {
    case GemmStatus::ok: return "ok";
    case GemmStatus::bad_kind: return "bad_kind";
    case GemmStatus::cannot_implement: return "cannot_implement";
    case GemmStatus::workspace_too_small: return "workspace_too_small";
    case GemmStatus::cuda_error: return "cuda_error";
    case GemmStatus::bad_operands: return "bad_operands";
    case GemmStatus::no_architecture: return "no_architecture";
  }
  return "unknown";
}

GemmArchitecture gemm_architecture(int cc_major) {
  for (GemmArchitecture a : {GemmArchitecture::sm100, GemmArchitecture::sm90})
    if (cc_major == static_cast<int>(a) && family(a) != nullptr) return a;
  return GemmArchitecture::none;
}

GemmArchitecture current_gemm_architecture(cudaError_t* error) {
  int device = 0, major = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  *error = e;
  if (e != cudaSuccess) cudaGetLastError();  // not sticky: leave nothing behind for the caller's next call
  return e == cudaSuccess ? gemm_architecture(major) : GemmArchitecture::none;
}

const char* gemm_architecture_name(GemmArchitecture architecture) {
  switch (architecture) {
    case GemmArchitecture::sm100: return "sm_100a/sm_103a";
    case GemmArchitecture::sm90: return "sm_90a";
    case GemmArchitecture::none: break;
  }
  return "none";
}

// Enough for every instantiation this build carries, whichever architecture runs.
size_t grouped_gemm_bf16_argument_bytes(int groups) {
  size_t bytes = 0;
  for (GemmArchitecture a : {GemmArchitecture::sm100, GemmArchitecture::sm90})
    if (const Family* f = family(a))
      for (auto instance : {f->forward, f->forward_f32, f->dgrad, f->dgrad_partial, f->wgrad})
        bytes = std::max(bytes, instance().argument_bytes(groups));
  return bytes;
}

GemmStatus grouped_gemm_bf16_workspace_bytes(const GroupedGemmBf16& g, size_t* bytes, cudaError_t* error) {
  Route r{};
  GemmStatus s = route(g, &r, false);
  return s == GemmStatus::ok ? r.instance().workspace_bytes(g, r.operands, bytes, error) : s;
}

GemmStatus grouped_gemm_bf16(const GroupedGemmBf16& g, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                             cudaError_t* error) {
  Route r{};
  GemmStatus s = route(g, &r);
  return s == GemmStatus::ok ? r.instance().launch(g, r.operands, workspace, workspace_bytes, stream, error) : s;
}

// One SM100 instantiation serves every block-scaled kind (gate, up, down, dgrad_h); it checks the kind itself. Other
// architectures, and a build without the SM100 units, have none.
namespace grouped_gemm_launcher {
const GroupedGemmMxInstance* mx_instance(GemmArchitecture architecture) {
#if MOK_WITH_SM100_GEMM
  if (architecture == GemmArchitecture::sm100) return &grouped_gemm_sm100_mxfp8_forward();
#endif
  (void)architecture;
  return nullptr;
}
}  // namespace grouped_gemm_launcher

size_t grouped_gemm_mxfp8_argument_bytes(int groups) {
  const GroupedGemmMxInstance* instance = mx_instance(GemmArchitecture::sm100);
  return instance ? instance->argument_bytes(groups) : 0;
}

GemmStatus grouped_gemm_mxfp8_workspace_bytes(const GroupedGemmMxfp8& g, size_t* bytes, cudaError_t* error) {
  if (!core::mx_block_scaled_kind(g.kind)) return GemmStatus::bad_kind;
  const GroupedGemmMxInstance* instance = mx_instance(g.architecture);
  return instance ? instance->workspace_bytes(g, bytes, error) : GemmStatus::no_architecture;
}

GemmStatus grouped_gemm_mxfp8(const GroupedGemmMxfp8& g, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                              cudaError_t* error) {
  const GroupedGemmMxInstance* instance = mx_instance(g.architecture);
  return instance ? instance->launch(g, workspace, workspace_bytes, stream, error) : GemmStatus::no_architecture;
}

}  // namespace mok::cuda
