// CUTLASS 4.2's SM100 ptr-array grouped GEMM for the grouped_gemm_bf16*_sm100.cu units: BF16 A and B, fp32
// accumulation, 2-CTA tcgen05 MMA (a 256 x 128 tile over a CTA pair, 64-deep k blocks), problem sizes read on the
// device, D = A B^T + beta C. A unit names ONE instantiation (the layouts of A and B, D's element, C's element or void
// for no source); grouped_gemm_cutlass.cuh builds, fills and launches it.
#pragma once

#include "cuda/grouped_gemm_cutlass.cuh"

namespace mok::cuda::sm100 {

using namespace grouped;
using namespace cute;

// The BF16 instantiation's choices: its operands (Bf16Operands), tile and schedules (Instantiation builds the
// kernel from them).
template <class LayoutA, class LayoutB, class ElementD, class ElementC>
struct Bf16Config : Bf16Operands<LayoutA, LayoutB, ElementD, ElementC> {
  using O = Bf16Operands<LayoutA, LayoutB, ElementD, ElementC>;
  static constexpr const char* kNote = "mok_gemm_bf16_sm100 ";  // resource_note's family

  using ClusterShape = Shape<_2, _1, _1>;       // the CTA pair of the 2-CTA MMA
  using MmaTileShape = Shape<_256, _128, _64>;  // per pair; 64 bf16 = one 128 B swizzle row (K- and MN-major)

  // The epilogue builder takes the MMA's tile (per pair) and halves M itself for a 2Sm schedule, as the
  // mainloop does (CUTLASS example 75): the assertion below holds the two CTA tiles equal.
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, MmaTileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, typename O::LayoutD*, O::kAlignmentC,
      ElementD, typename O::LayoutD*, O::kAlignmentD, cutlass::epilogue::PtrArrayTmaWarpSpecialized2Sm,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementC, float>>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, typename O::Element, LayoutA*, O::kAlignment,
      typename O::Element, LayoutB*, O::kAlignment, float, MmaTileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmSm100>::CollectiveOp;

  static_assert(size<0>(typename Epilogue::CtaTileShape{}) == size<0>(typename Mainloop::CtaShape_MNK{}) &&
                    size<1>(typename Epilogue::CtaTileShape{}) == size<1>(typename Mainloop::CtaShape_MNK{}),
                "the epilogue's CTA tile must be the mainloop's (pass the MMA tile to both builders)");
};

template <class LayoutA, class LayoutB, class ElementD, class ElementC>
using GroupedGemm = Instantiation<Bf16Config<LayoutA, LayoutB, ElementD, ElementC>>;

}  // namespace mok::cuda::sm100
