// CUTLASS 4.2's SM100 block-scaled ptr-array grouped GEMM for the MXFP8 forward (grouped_gemm_mxfp8_sm100.cu):
// e4m3 A and B, both K-major, with e8m0 scales of 1x32 blocks along K (cutlass::mx_float8_t, the scales in
// Sm1xxBlockScaledConfig<32>'s layout, which is core's MxScaleLayout), fp32 accumulation in tensor memory,
// bf16 D = A B^T, no source. The 2-CTA tcgen05 MXF8F6F4 MMA over a 256 x 128 tile per CTA pair, 128-deep k
// blocks (128 e4m3 = one 128 B swizzle row; 4 scales per row and k block). What it shares with the BF16
// instantiations (the kernel's assembly, resource note, argument carving, fill, launch) is
// grouped_gemm_sm100.cuh's; this file adds the scale arrays and where each group's scales start
// (core/grouped_mx_problems.hpp).
#pragma once

#include "core/grouped_mx_problems.hpp"
#include "cuda/grouped_gemm_sm100.cuh"

namespace mok::cuda::sm100 {

// The MXFP8 forward's choices, as Bf16Config's for the BF16 units (Instantiation builds the kernel from them).
struct MxConfig {
  using LayoutA = KMajorA;
  using LayoutB = KMajorB;
  using LayoutD = cutlass::layout::RowMajor;
  using Element = cutlass::float_e4m3_t;              // the codes, as the pointer arrays hold them
  using ElementPair = cutlass::mx_float8_t<Element>;  // codes and their e8m0 scales, as the builder takes them
  using ElementD = cutlass::bfloat16_t;
  static constexpr bool kSource = false;
  static constexpr bool kAKMajor = true;
  static constexpr bool kBKMajor = true;
  static constexpr const char* kNote = "mok_gemm_mxfp8_sm100 ";

  static constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;  // 16 codes: TMA's 16 bytes
  static constexpr int kAlignmentD = 128 / cutlass::sizeof_bits<ElementD>::value;

  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using ClusterShape = Shape<_2, _1, _1>;
  using MmaTileShape = Shape<_256, _128, _128>;  // per pair; 128 e4m3 = one 128 B swizzle row, 4 scale blocks

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, MmaTileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignmentD, ElementD, LayoutD*,
      kAlignmentD, cutlass::epilogue::PtrArrayTmaWarpSpecialized2Sm,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementPair, LayoutA*, kAlignment, ElementPair,
      LayoutB*, kAlignment, float, MmaTileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmMxf8f6f4Sm100>::CollectiveOp;
};

struct GroupedGemmMx : Instantiation<MxConfig> {
  using ElementSF = typename Mainloop::ElementSF;  // e8m0
  using LayoutSFA = typename Mainloop::InternalLayoutSFA;
  using LayoutSFB = typename Mainloop::InternalLayoutSFB;
  using ScaleConfig = typename Mainloop::Sm1xxBlkScaledConfig;

  static_assert(std::is_same_v<ScaleConfig, cutlass::detail::Sm1xxBlockScaledConfig<core::kMxBlock>>,
                "the MMA reads scales in core's MxScaleLayout (test_sf_layout_cute)");
  static_assert(sizeof(ElementSF) == 1 &&
                    std::is_same_v<decltype(typename Mainloop::Arguments{}.ptr_A), const Element**>,
                "byte scales; the pointer arrays hold e4m3 codes");
};

// The BF16 arrays and, per group, where its scales start and how they are laid out.
struct MxArrays {
  Arrays<GroupedGemmMx> base;
  const GroupedGemmMx::ElementSF** sfa;
  const GroupedGemmMx::ElementSF** sfb;
  GroupedGemmMx::LayoutSFA* layout_sfa;
  GroupedGemmMx::LayoutSFB* layout_sfb;
};

inline size_t carve_mx(int groups, char* base, MxArrays* arrays) {
  ArrayCarver c{base, static_cast<size_t>(groups)};
  MxArrays out{};
  out.base = carve_arrays<GroupedGemmMx>(c);
  out.sfa = c.take<const GroupedGemmMx::ElementSF*>();
  out.sfb = c.take<const GroupedGemmMx::ElementSF*>();
  out.layout_sfa = c.take<GroupedGemmMx::LayoutSFA>();
  out.layout_sfb = c.take<GroupedGemmMx::LayoutSFB>();
  if (arrays) *arrays = out;
  return c.at;
}

// The operands as the shared BF16 code reads them: D = A B^T, no source.
CUTE_HOST_DEVICE GemmOperands mx_operands(const GroupedGemmMxfp8& g) {
  return GemmOperands{g.a, g.b, g.d, nullptr, 0.0f};
}

// One thread per local expert: its problem and operand offsets from core, its scales' start and layout.
__global__ void fill_mx_arguments(GroupedGemmMxfp8 g, MxArrays arrays) {
  using G = GroupedGemmMx;
  int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= g.shape.experts_per_rank) return;
  core::GroupedMxProblem q = core::grouped_mx_problem(g.shape, g.schedule, g.kind, g.periods, g.window, g.a_stride, e);
  core::GroupedLayout l = core::grouped_mx_layout(g.shape, g.kind);
  l.lda = q.lda;
  put_group<G>(arrays.base, mx_operands(g), e, q.p, l);
  arrays.sfa[e] = reinterpret_cast<const G::ElementSF*>(g.a_scales + q.a_scales);
  arrays.sfb[e] = reinterpret_cast<const G::ElementSF*>(g.b_scales + q.b_scales);
  auto mnkl = make_shape(q.p.m, q.p.n, q.p.k, 1);
  arrays.layout_sfa[e] = G::ScaleConfig::tile_atom_to_shape_SFA(mnkl);
  arrays.layout_sfb[e] = G::ScaleConfig::tile_atom_to_shape_SFB(mnkl);
}

// Before any CUDA call: the kind, every pointer set and 16-byte aligned (TMA), A's stride in whole 16 bytes
// and at least K, the shape's and window's checks, and every group starting a scale row tile.
inline GemmStatus check_mx(const GroupedGemmMxfp8& g) {
  using G = GroupedGemmMx;
  if (!core::mx_block_scaled_kind(g.kind)) return GemmStatus::bad_kind;  // out of range included
  if (!g.a || !g.a_scales || !g.b || !g.b_scales || !g.d) return GemmStatus::bad_operands;
  if (!aligned(g.a) || !aligned(g.a_scales) || !aligned(g.b) || !aligned(g.b_scales) || !aligned(g.d))
    return GemmStatus::cannot_implement;
  int64_t k = core::grouped_mx_layout(g.shape, g.kind).lda;  // the kind's K: H for gate, up and dgrad_h, I for down
  if (g.a_stride < k || g.a_stride % G::kAlignment) return GemmStatus::cannot_implement;
  if (!core::mx_tiles_whole(g.shape, g.periods, g.window)) return GemmStatus::cannot_implement;
  return check_shape(g.shape, g.kind, g.periods, g.window, core::kMxBlock, g.arguments);
}

inline typename GroupedGemmMx::Gemm::Arguments mx_arguments(const GroupedGemmMxfp8& g, const MxArrays& arrays,
                                                            int sm_count) {
  const Arrays<GroupedGemmMx>& b = arrays.base;
  return gemm_arguments<GroupedGemmMx>(
      g.shape.experts_per_rank, mx_operands(g), b,
      {b.a, b.stride_a, b.b, b.stride_b, arrays.sfa, arrays.layout_sfa, arrays.sfb, arrays.layout_sfb}, sm_count);
}

inline size_t mx_argument_bytes(int groups) {
  return carve_mx(groups, nullptr, nullptr);
}

inline GemmStatus mx_workspace_bytes(const GroupedGemmMxfp8& g, size_t* bytes, cudaError_t* error) {
  MxArrays arrays{};
  carve_mx(g.shape.experts_per_rank, static_cast<char*>(g.arguments), &arrays);
  return query_workspace<GroupedGemmMx>([&](int sms) { return mx_arguments(g, arrays, sms); }, bytes, error);
}

inline GemmStatus mx_launch(const GroupedGemmMxfp8& g, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                            cudaError_t* error) {
  MxArrays arrays{};  // pointer arithmetic only: nothing is read or written before the checks pass
  carve_mx(g.shape.experts_per_rank, static_cast<char*>(g.arguments), &arrays);
  auto args = [&](int sms) { return mx_arguments(g, arrays, sms); };
  return run<GroupedGemmMx>(check_mx(g), args, workspace, workspace_bytes, stream, error, [&] {
    fill_mx_arguments<<<fill_blocks(g.shape.experts_per_rank), kFillThreads, 0, stream>>>(g, arrays);
  });
}

}  // namespace mok::cuda::sm100
