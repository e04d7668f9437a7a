// The backward's data-gradient GEMMs with a bf16 D on SM100: dgrad_h (dh = dy W_down, no source) and
// dgrad_x_up (dx = bf16(du W_up + C), C the fp32 partial dx that dgrad_x_gate wrote, beta 1). A K-major,
// B N-major (the weights read transposed), fp32 source C (grouped_gemm_sm100.cuh). One instantiation per unit.
#include "cuda/grouped_gemm_sm100.cuh"

namespace mok::cuda {
namespace grouped_gemm_dgrad {
using Gemm = sm100::GroupedGemm<sm100::KMajorA, sm100::NMajorB, cutlass::bfloat16_t, float>;
__attribute__((used)) constexpr sm100::Note kResourceNote = sm100::resource_note<Gemm>("dgrad");
}  // namespace grouped_gemm_dgrad

const GroupedGemmInstance& grouped_gemm_sm100_dgrad() {
  return sm100::instance<grouped_gemm_dgrad::Gemm>("dgrad");
}

}  // namespace mok::cuda
