// The forward's grouped GEMM on SM100: gate, up and down. A and B K-major, bf16 D, no source C
// (grouped_gemm_sm100.cuh). One instantiation per translation unit.
#include "cuda/grouped_gemm_sm100.cuh"

namespace mok::cuda {
namespace grouped_gemm_forward {
using Gemm = sm100::GroupedGemm<sm100::KMajorA, sm100::KMajorB, cutlass::bfloat16_t, void>;
__attribute__((used)) constexpr sm100::Note kResourceNote = sm100::resource_note<Gemm>("forward");
}  // namespace grouped_gemm_forward

const GroupedGemmInstance& grouped_gemm_sm100_forward() {
  return sm100::instance<grouped_gemm_forward::Gemm>("forward");
}

}  // namespace mok::cuda
