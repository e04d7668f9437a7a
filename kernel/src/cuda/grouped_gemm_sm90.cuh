// CUTLASS 4.2's SM90 ptr-array grouped GEMM for the grouped_gemm_bf16*_sm90.cu units, so H100 and H200 run the
// split executor: BF16 A and B, fp32 accumulation in registers, TMA loads and warpgroup MMAs (WGMMA) with two
// consumer warpgroups on a 128 x 128 tile (64-deep k blocks), problem sizes read on the device, D = A B^T + beta C.
// The same operands, kinds and launch as the SM100 units (grouped_gemm_cutlass.cuh); one instantiation per unit.
#pragma once

#include "cuda/grouped_gemm_cutlass.cuh"

namespace mok::cuda::sm90 {

using namespace grouped;
using namespace cute;

// The BF16 instantiation's choices: its operands (Bf16Operands), tile and schedules.
template <class LayoutA, class LayoutB, class ElementD, class ElementC>
struct Bf16Config : Bf16Operands<LayoutA, LayoutB, ElementD, ElementC> {
  using O = Bf16Operands<LayoutA, LayoutB, ElementD, ElementC>;
  static constexpr const char* kNote = "mok_gemm_bf16_sm90 ";  // resource_note's family

  using ClusterShape = Shape<_1, _1, _1>;
  using TileShape = Shape<_128, _128, _64>;  // the cooperative schedule splits M over its two consumer warpgroups

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, typename O::LayoutD*, O::kAlignmentC,
      ElementD, typename O::LayoutD*, O::kAlignmentD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementC, float>>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename O::Element, LayoutA*, O::kAlignment,
      typename O::Element, LayoutB*, O::kAlignment, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
};

template <class LayoutA, class LayoutB, class ElementD, class ElementC>
using GroupedGemm = Instantiation<Bf16Config<LayoutA, LayoutB, ElementD, ElementC>>;

}  // namespace mok::cuda::sm90
