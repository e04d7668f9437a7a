// The first half of dx on SM90: dgrad_x_gate writes the fp32 partial dx = dg W_gate, which dgrad_x_up then
// adds to (grouped_gemm_bf16_dgrad_sm90.cu), so dx is rounded to bf16 once. A K-major, B N-major, fp32 D,
// no source (grouped_gemm_sm90.cuh). One instantiation per unit.
#include "cuda/grouped_gemm_sm90.cuh"

namespace mok::cuda {
namespace grouped_gemm_dgrad_partial_sm90 {
using Gemm = sm90::GroupedGemm<sm90::KMajorA, sm90::NMajorB, float, void>;
__attribute__((used)) constexpr sm90::Note kResourceNote = sm90::resource_note<Gemm>("dgrad_partial");
}  // namespace grouped_gemm_dgrad_partial_sm90

const GroupedGemmInstance& grouped_gemm_sm90_dgrad_partial() {
  return sm90::instance<grouped_gemm_dgrad_partial_sm90::Gemm>("dgrad_partial");
}

}  // namespace mok::cuda
