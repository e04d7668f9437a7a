// The forward's grouped GEMM with an fp32 product on SM90: gate, up and down of a layer with expert biases, whose
// bias is added to the fp32 sum before the one rounding to bf16 (core/split_bias.hpp's add_bias step). A and B
// K-major, fp32 D, no source C (grouped_gemm_sm90.cuh). One instantiation per translation unit.
#include "cuda/grouped_gemm_sm90.cuh"

namespace mok::cuda {
namespace grouped_gemm_forward_f32_sm90 {
using Gemm = sm90::GroupedGemm<sm90::KMajorA, sm90::KMajorB, float, void>;
__attribute__((used)) constexpr sm90::Note kResourceNote = sm90::resource_note<Gemm>("forward_f32");
}  // namespace grouped_gemm_forward_f32_sm90

const GroupedGemmInstance& grouped_gemm_sm90_forward_f32() {
  return sm90::instance<grouped_gemm_forward_f32_sm90::Gemm>("forward_f32");
}

}  // namespace mok::cuda
