// The forward's grouped GEMM on SM90: gate, up and down. A and B K-major, bf16 D, no source C
// (grouped_gemm_sm90.cuh). One instantiation per translation unit.
#include "cuda/grouped_gemm_sm90.cuh"

namespace mok::cuda {
namespace grouped_gemm_forward_sm90 {
using Gemm = sm90::GroupedGemm<sm90::KMajorA, sm90::KMajorB, cutlass::bfloat16_t, void>;
__attribute__((used)) constexpr sm90::Note kResourceNote = sm90::resource_note<Gemm>("forward");
}  // namespace grouped_gemm_forward_sm90

const GroupedGemmInstance& grouped_gemm_sm90_forward() {
  return sm90::instance<grouped_gemm_forward_sm90::Gemm>("forward");
}

}  // namespace mok::cuda
