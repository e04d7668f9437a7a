// The backward's data-gradient GEMMs with a bf16 D on SM90: dgrad_h (dh = dy W_down, no source) and
// dgrad_x_up (dx = bf16(du W_up + C), C the fp32 partial dx that dgrad_x_gate wrote, beta 1). A K-major,
// B N-major (the weights read transposed), fp32 source C (grouped_gemm_sm90.cuh). One instantiation per unit.
#include "cuda/grouped_gemm_sm90.cuh"

namespace mok::cuda {
namespace grouped_gemm_dgrad_sm90 {
using Gemm = sm90::GroupedGemm<sm90::KMajorA, sm90::NMajorB, cutlass::bfloat16_t, float>;
__attribute__((used)) constexpr sm90::Note kResourceNote = sm90::resource_note<Gemm>("dgrad");
}  // namespace grouped_gemm_dgrad_sm90

const GroupedGemmInstance& grouped_gemm_sm90_dgrad() {
  return sm90::instance<grouped_gemm_dgrad_sm90::Gemm>("dgrad");
}

}  // namespace mok::cuda
