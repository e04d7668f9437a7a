// The backward's weight-gradient GEMMs on SM90: wgrad_down, wgrad_gate, wgrad_up. A M-major and B N-major
// (both read along the tokens: K = the expert's rows in the window), fp32 D = C + A B^T on main_grad in
// place, beta 1: each window adds into main_grad, windows in schedule order, no split-K
// (grouped_gemm_sm90.cuh). One instantiation per unit.
#include "cuda/grouped_gemm_sm90.cuh"

namespace mok::cuda {
namespace grouped_gemm_wgrad_sm90 {
using Gemm = sm90::GroupedGemm<sm90::MMajorA, sm90::NMajorB, float, float>;
__attribute__((used)) constexpr sm90::Note kResourceNote = sm90::resource_note<Gemm>("wgrad");
}  // namespace grouped_gemm_wgrad_sm90

const GroupedGemmInstance& grouped_gemm_sm90_wgrad() {
  return sm90::instance<grouped_gemm_wgrad_sm90::Gemm>("wgrad");
}

}  // namespace mok::cuda
