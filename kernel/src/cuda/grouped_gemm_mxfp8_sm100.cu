// The forward's grouped GEMM on SM100 in MXFP8 mode: gate, up and down with e4m3 A and B in 1x32 blocks,
// e8m0 scales, bf16 D, no source (grouped_gemm_mxfp8_sm100.cuh). One instantiation per translation unit.
#include "cuda/grouped_gemm_mxfp8_sm100.cuh"

namespace mok::cuda {
namespace grouped_gemm_mxfp8_forward {
__attribute__((used)) constexpr sm100::Note kResourceNote = sm100::resource_note<sm100::GroupedGemmMx>("mxfp8_forward");
}  // namespace grouped_gemm_mxfp8_forward

const GroupedGemmMxInstance& grouped_gemm_sm100_mxfp8_forward() {
  static const GroupedGemmMxInstance entry{"mxfp8_forward", &sm100::mx_argument_bytes, &sm100::mx_workspace_bytes,
                                           &sm100::mx_launch};
  return entry;
}

}  // namespace mok::cuda
