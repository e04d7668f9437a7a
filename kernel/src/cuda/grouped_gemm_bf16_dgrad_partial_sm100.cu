// The first half of dx on SM100: dgrad_x_gate writes the fp32 partial dx = dg W_gate, which dgrad_x_up then
// adds to (grouped_gemm_bf16_dgrad_sm100.cu), so dx is rounded to bf16 once. A K-major, B N-major, fp32 D,
// no source (grouped_gemm_sm100.cuh). One instantiation per unit.
#include "cuda/grouped_gemm_sm100.cuh"

namespace mok::cuda {
namespace grouped_gemm_dgrad_partial {
using Gemm = sm100::GroupedGemm<sm100::KMajorA, sm100::NMajorB, float, void>;
__attribute__((used)) constexpr sm100::Note kResourceNote = sm100::resource_note<Gemm>("dgrad_partial");
}  // namespace grouped_gemm_dgrad_partial

const GroupedGemmInstance& grouped_gemm_sm100_dgrad_partial() {
  return sm100::instance<grouped_gemm_dgrad_partial::Gemm>("dgrad_partial");
}

}  // namespace mok::cuda
