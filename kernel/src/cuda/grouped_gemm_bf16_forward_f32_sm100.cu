// The forward's grouped GEMM with an fp32 product on SM100: gate, up and down of a layer with expert biases, whose
// bias is added to the fp32 sum before the one rounding to bf16 (core/split_bias.hpp's add_bias step). A and B
// K-major, fp32 D, no source C (grouped_gemm_sm100.cuh). One instantiation per translation unit.
#include "cuda/grouped_gemm_sm100.cuh"

namespace mok::cuda {
namespace grouped_gemm_forward_f32 {
using Gemm = sm100::GroupedGemm<sm100::KMajorA, sm100::KMajorB, float, void>;
__attribute__((used)) constexpr sm100::Note kResourceNote = sm100::resource_note<Gemm>("forward_f32");
}  // namespace grouped_gemm_forward_f32

const GroupedGemmInstance& grouped_gemm_sm100_forward_f32() {
  return sm100::instance<grouped_gemm_forward_f32::Gemm>("forward_f32");
}

}  // namespace mok::cuda
