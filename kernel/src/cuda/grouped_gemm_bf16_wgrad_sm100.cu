// The backward's weight-gradient GEMMs on SM100: wgrad_down, wgrad_gate, wgrad_up. A M-major and B N-major
// (both read along the tokens: K = the expert's rows in the window), fp32 D = C + A B^T on main_grad in
// place, beta 1: each window adds into main_grad, windows in schedule order, no split-K
// (grouped_gemm_sm100.cuh). One instantiation per unit.
#include "cuda/grouped_gemm_sm100.cuh"

namespace mok::cuda {
namespace grouped_gemm_wgrad {
using Gemm = sm100::GroupedGemm<sm100::MMajorA, sm100::NMajorB, float, float>;
__attribute__((used)) constexpr sm100::Note kResourceNote = sm100::resource_note<Gemm>("wgrad");
}  // namespace grouped_gemm_wgrad

const GroupedGemmInstance& grouped_gemm_sm100_wgrad() {
  return sm100::instance<grouped_gemm_wgrad::Gemm>("wgrad");
}

}  // namespace mok::cuda
