// The grouped-GEMM launcher (grouped_gemm.hpp): from the kind, the instantiation that serves it and the
// operands it reads. No CUTLASS here: each instantiation is its own unit (grouped_gemm_instances.hpp).
#include <algorithm>

#include "cuda/grouped_gemm_instances.hpp"

namespace mok::cuda {
namespace grouped_gemm_launcher {  // named: nvcc names an anonymous one after the file's absolute path

struct Route {
  const GroupedGemmInstance* instance;
  GemmOperands operands;
};

// Every pointer a kind uses is set and every other is null: a missing operand or one meant for another kind
// is refused before anything runs.
bool uses_exactly(const GroupedGemmBf16& g, bool d, bool d_fp32, bool c_fp32) {
  return g.a && g.b && (g.d != nullptr) == d && (g.d_fp32 != nullptr) == d_fp32 && (g.c_fp32 != nullptr) == c_fp32;
}

// The table of grouped_gemm.hpp's GroupedGemmBf16 comment. The workspace query needs the kind only, not the
// pointers (`operands` false).
GemmStatus route(const GroupedGemmBf16& g, Route* r, bool operands = true) {
  using core::GroupedGemm;
  bool ok = false;
  switch (g.kind) {
    case GroupedGemm::gate:
    case GroupedGemm::up:
    case GroupedGemm::down:
      ok = uses_exactly(g, true, false, false);
      *r = Route{&grouped_gemm_sm100_forward(), {g.a, g.b, g.d, nullptr, 0.0f}};
      break;
    case GroupedGemm::dgrad_h:
      ok = uses_exactly(g, true, false, false);
      *r = Route{&grouped_gemm_sm100_dgrad(), {g.a, g.b, g.d, nullptr, 0.0f}};
      break;
    case GroupedGemm::dgrad_x_gate:
      ok = uses_exactly(g, false, true, false);
      *r = Route{&grouped_gemm_sm100_dgrad_partial(), {g.a, g.b, g.d_fp32, nullptr, 0.0f}};
      break;
    case GroupedGemm::dgrad_x_up:
      ok = uses_exactly(g, true, false, true);
      *r = Route{&grouped_gemm_sm100_dgrad(), {g.a, g.b, g.d, g.c_fp32, 1.0f}};
      break;
    case GroupedGemm::wgrad_down:
    case GroupedGemm::wgrad_gate:
    case GroupedGemm::wgrad_up:
      ok = uses_exactly(g, false, true, false);
      *r = Route{&grouped_gemm_sm100_wgrad(), {g.a, g.b, g.d_fp32, g.d_fp32, 1.0f}};  // main_grad += A B^T
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
  }
  return "unknown";
}

size_t grouped_gemm_bf16_argument_bytes(int groups) {
  size_t bytes = 0;
  for (const GroupedGemmInstance* i : {&grouped_gemm_sm100_forward(), &grouped_gemm_sm100_dgrad(),
                                       &grouped_gemm_sm100_dgrad_partial(), &grouped_gemm_sm100_wgrad()})
    bytes = std::max(bytes, i->argument_bytes(groups));
  return bytes;
}

GemmStatus grouped_gemm_bf16_workspace_bytes(const GroupedGemmBf16& g, size_t* bytes, cudaError_t* error) {
  Route r{};
  GemmStatus s = route(g, &r, false);
  return s == GemmStatus::ok ? r.instance->workspace_bytes(g, r.operands, bytes, error) : s;
}

GemmStatus grouped_gemm_bf16(const GroupedGemmBf16& g, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                             cudaError_t* error) {
  Route r{};
  GemmStatus s = route(g, &r);
  return s == GemmStatus::ok ? r.instance->launch(g, r.operands, workspace, workspace_bytes, stream, error) : s;
}

// One instantiation serves every MXFP8 kind (gate, up, down); it checks the kind itself.
size_t grouped_gemm_mxfp8_argument_bytes(int groups) {
  return grouped_gemm_sm100_mxfp8_forward().argument_bytes(groups);
}

GemmStatus grouped_gemm_mxfp8_workspace_bytes(const GroupedGemmMxfp8& g, size_t* bytes, cudaError_t* error) {
  if (!core::mx_forward_kind(g.kind)) return GemmStatus::bad_kind;
  return grouped_gemm_sm100_mxfp8_forward().workspace_bytes(g, bytes, error);
}

GemmStatus grouped_gemm_mxfp8(const GroupedGemmMxfp8& g, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                              cudaError_t* error) {
  return grouped_gemm_sm100_mxfp8_forward().launch(g, workspace, workspace_bytes, stream, error);
}

}  // namespace mok::cuda
