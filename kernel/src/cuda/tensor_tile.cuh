// A tile GEMM on the tensor cores of one CTA (sm_100a / sm_103a): core's blocks (core/tensor_tile.hpp) through
// stages of shared memory (core::sum_tile: later blocks' copies fly while the MMAs read one) into a 1-CTA tcgen05
// MMA (CuTe's SM100_MMA_F16BF16_SS, 128 x 128 x 16, each operand's panel K- or MN-major as the operand is stored, fp32
// accumulators in tensor memory; an MXFP8 part's scaled blocks, core/scaled_block.hpp, through the block-scaled
// SM100_MMA_MXF8F6F4_SS, 128 x 128 x 32, its scales copied into tensor memory), and core's epilogue from a chunk's
// accumulator, loaded by CuTe's tensor-memory load atom while the MMAs sum the next chunk into the other.
//
// The types (the MMAs, the panels' and scales' layouts, the scales' copy, the accumulator's load) compile on the host
// too: test_tensor_tile_cute holds them against core's layouts there.
#pragma once

#include <cutlass/arch/barrier.h>

#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/tmem_allocator_sm100.hpp>
#include <cute/atom/copy_traits_sm100.hpp>
#include <cute/tensor.hpp>
#include <cutlass/detail/sm100_blockscaled_layout.hpp>
#include <type_traits>

#include "core/gemm_element.hpp"
#include "core/panel_boxes.hpp"
#include "core/scaled_block.hpp"
#include "core/tensor_tile.hpp"

namespace mok::cuda::tensor_tile {

using Value = cute::bfloat16_t;
using Major = cute::UMMA::Major;
// The MMA over panels of the majors a and b (core::PanelMajor): the instruction descriptor says which.
template <Major A, Major B>
using MmaOf = decltype(cute::make_tiled_mma(
    cute::SM100_MMA_F16BF16_SS<Value, Value, float, core::kMmaRows, core::kMmaCols, A, B>{}));
using Mma = MmaOf<Major::K, Major::K>;  // its shapes, the accumulator's among them, are every major's
// Core's name for the major the MMA calls M: the one map between them.
template <Major M>
constexpr core::PanelMajor core_major = M == Major::MN ? core::PanelMajor::mn : core::PanelMajor::k;
// A panel, as the MMA partitions it: ((rows, 16), 1, depth / 16).
using PanelShape = decltype(cute::partition_shape_A(
    Mma{}, cute::make_shape(cute::Int<core::kMmaRows>{}, cute::Int<core::kMmaDepth>{})));
// Its layout under the 128-byte swizzle: K-major, or MN-major with the atoms along the depth first (as CUTLASS's SM100
// mainloops tile an MN-major operand's).
template <Major M>
using PanelLayoutOf =
    std::conditional_t<M == Major::K,
                       decltype(cute::UMMA::tile_to_mma_shape(cute::UMMA::Layout_K_SW128_Atom<Value>{}, PanelShape{})),
                       decltype(cute::UMMA::tile_to_mma_shape(cute::UMMA::Layout_MN_SW128_Atom<Value>{}, PanelShape{},
                                                              cute::Step<cute::_2, cute::_1>{}))>;
// A scaled block's MMA (core/scaled_block.hpp): e4m3 codes K-major, 32 of the depth an instruction, each 32's e8m0
// scales from tensor memory (tcgen05.mma kind::mxf8f6f4.block_scale); its accumulator is the bf16 MMA's.
using Code = cute::float_e4m3_t;
using Scale = cute::float_ue8m0_t;
using ScaledMma = decltype(cute::make_tiled_mma(
    cute::SM100_MMA_MXF8F6F4_SS<Code, Code, float, Scale, core::kMmaRows, core::kMmaCols, Major::K, Major::K>{}));
// A panel of codes, as the MMA partitions it ((rows, 32), 1, depth / 32), under the 128-byte swizzle.
using CodePanelLayout = decltype(cute::UMMA::tile_to_mma_shape(
    cute::UMMA::Layout_K_SW128_Atom<Code>{},
    cute::partition_shape_A(ScaledMma{},
                            cute::make_shape(cute::Int<core::kMmaRows>{}, cute::Int<core::kScaledDepth>{}))));
// An operand's scales of a block in shared memory, as CUTLASS's block-scaled mainloop lays a 128 x 128 x 128 tile's
// (and copies them to tensor memory from there): (((32, 4), 1), (32, 1)), 1, (4, 1)) over (row, depth).
using ScaleAtomLayout = decltype(cutlass::detail::Sm1xxBlockScaledConfig<core::kMxBlock>::deduce_smem_layoutSFA(
    ScaledMma{}, cute::Shape<cute::Int<core::kMmaRows>, cute::Int<core::kMmaCols>, cute::Int<core::kScaledDepth>>{}));

// The accumulator in tensor memory: 8 columns of one lane per thread and load.
using AccumulatorLoad = cute::SM100_TMEM_LOAD_32dp32b8x;
using AccumulatorShape = cute::Shape<cute::Int<core::kMmaRows>, cute::Int<core::kMmaCols>>;
constexpr int kEpilogueThreads = 128;  // four warps, one lane quadrant of tensor memory each
// The accumulators side by side: 256 of the SM's 512 columns, all of them at two CTAs an SM.
constexpr int kTensorColumns = core::kAccumulators * core::kMmaCols;
static_assert(kTensorColumns >= 32 && (kTensorColumns & (kTensorColumns - 1)) == 0,
              "tcgen05.alloc takes a power of two of at least 32 columns");
// A CTA that takes scaled blocks holds, after its accumulators, each stage's block's scales as the MMA reads them (a's,
// then b's, kScaleColumns each: row r's 4 scales one 32-bit word, lane r mod 32, column r / 32, in every lane
// quadrant): the SM's 512 columns, one CTA an SM. A stage's own columns: a block's copy of its scales never writes
// those that an earlier block's MMAs may still read (the stage's next fill waited for them).
constexpr int kScaleColumns = 4;
constexpr int kScaledTensorColumns = 512;
static_assert(kTensorColumns + core::kPanelStages * 2 * kScaleColumns <= kScaledTensorColumns,
              "the stages' scales after the accumulators");
// The columns a CTA allocates: all of them when it takes scaled blocks.
CUTE_HOST_DEVICE int tensor_columns(bool scaled) {
  return scaled ? kScaledTensorColumns : kTensorColumns;
}
// Accumulator `index` of those at `tmem`: kMmaCols columns on (an address's low half is its column).
CUTE_HOST_DEVICE uint32_t accumulator_address(uint32_t tmem, int index) {
  return tmem + static_cast<uint32_t>(index * core::kMmaCols);
}

// Roles of a 256-thread CTA: warp 1 allocates tensor memory and issues the MMAs; warps 4 to 7 (lane quadrant
// warp % 4) load the accumulator. Warp 0, whose thread 0 runs core's body, only fills panels and writes elements:
// nothing warp-aligned.
constexpr int kMmaWarp = 1;
constexpr int kFirstEpilogueWarp = 4;
// The thread that writes a tile's tensor maps and issues its TMA loads (core/panel_boxes.hpp): warp 1's lane 0, whose
// warp then issues the MMAs over what it waited for.
constexpr int kBoxIssuer = kMmaWarp * 32;
static_assert(sizeof(cute::TmaDescriptor) == core::kTensorMapBytes, "a map is a CUtensorMap");

static_assert(cute::cosize_v<PanelLayoutOf<Major::K>> == core::kPanelValues &&
                  cute::cosize_v<PanelLayoutOf<Major::MN>> == core::kPanelValues,
              "a panel is kMmaRows x kMmaDepth values");
static_assert(core::kPanelValues * sizeof(core::bf16_t) % 1024 == 0, "every panel of the stages starts on 1024 bytes");

// An operand's scales of stage `stage`'s block in tensor memory (a's: second false) for a CTA whose columns start at
// `tmem`, as the block-scaled MMA reads them ((((32, 4), 4), (32, 1)), 1, (4, 1)): slice k the scales of its k-th 32
// of the depth).
template <bool Second>
CUTE_HOST_DEVICE auto scale_tensor(uint32_t tmem, int stage) {
  using Fragment = std::conditional_t<Second, ScaledMma::FrgTypeSFB, ScaledMma::FrgTypeSFA>;
  auto scales = cute::make_tensor<Fragment>(cute::shape(ScaleAtomLayout{}));
  scales.data() = tmem + static_cast<uint32_t>(kTensorColumns + (2 * stage + Second) * kScaleColumns);
  return scales;
}

// The copy of an operand's atom of scales at `atom` (shared memory) into its columns `scales` (scale_tensor), as
// CUTLASS's block-scaled mainloop makes it (tcgen05.cp 32x128b.warpx4: the atom's 32 rows of 128 bits, each into a
// lane of 4 columns, in every lane quadrant): the copy, and its source and destination as it partitions them.
using ScaleCopy = cute::SM100_UTCCP_4x32dp128bit_1cta;
template <class Scales>
CUTE_HOST_DEVICE auto scale_copy(Scale* atom, const Scales& scales) {
  auto columns = cute::make_tensor(scales.data(), cute::filter_zeros(scales.layout()));
  auto copy = cute::make_utccp_copy(ScaleCopy{}, columns);
  auto source = cute::make_tensor(cute::make_smem_ptr(atom), cute::filter_zeros(ScaleAtomLayout{}));
  auto thread = copy.get_slice(0);
  return cute::make_tuple(copy, thread.partition_S(source), thread.partition_D(columns));
}

// The (row, column) coordinates of the accumulator and its tensor-memory view at `tmem`, as the MMA partitions them.
CUTE_HOST_DEVICE auto accumulator_coordinates() {
  return Mma{}.get_slice(0).partition_C(cute::make_identity_tensor(AccumulatorShape{}));
}
CUTE_HOST_DEVICE auto accumulator(uint32_t tmem) {
  auto acc = Mma{}.get_slice(0).make_fragment_C(accumulator_coordinates());
  acc.data() = tmem;
  return acc;
}
// The load that moves the accumulator to registers: thread t of the epilogue's 128 reads lane quadrant t / 32.
CUTE_HOST_DEVICE auto accumulator_load(uint32_t tmem) {
  return cute::make_tmem_copy(AccumulatorLoad{}, accumulator(tmem));
}

#if defined(__CUDACC__)  // the device side: nvcc only (the host tests include the types above)

// The stages' panels (32 KB a stage), in dynamic shared memory: all of them are above the 48 KB a kernel's static
// shared memory may hold.
// The 128-byte swizzle repeats every 1024 bytes: each panel starts on one.
struct Panels {
  alignas(1024) core::bf16_t stages[core::kPanelStages][2 * core::kPanelValues];  // each stage: a's panel, then b's
  alignas(128) uint8_t scales[core::kPanelStages][2 * core::kScaleAtomBytes];     // a scaled block's: a's, then b's
};
// The dynamic shared memory a CTA asks for: the panels, and room to move them to a 1024-byte boundary.
constexpr int kDynamicSharedBytes = static_cast<int>(sizeof(Panels)) + 1024;

// The rest of one CTA's tensor tile, in static shared memory.
struct Storage {
  alignas(8) uint64_t mma_done[core::kPanelStages];  // a stage's MMAs have read its panels
  uint64_t loaded[core::kPanelStages];               // a stage's TMA loads landed: their bytes complete the phase
  cute::TmaDescriptor* maps;                         // the CTA's kPanelMaps in global memory
  core::PanelStages loads;                           // the issuer's: a stage busy while its TMA loads are unwaited
  core::PanelMajors majors[core::kPanelStages];      // how a stage's panels hold a and b, by the fill of its block
  bool scaled_stage[core::kPanelStages];             // a stage's panels hold a scaled block, by its fill
  uint32_t scaled;                                   // the parts the MMAs take block-scaled: all or none (open)
  uint32_t tmem;                                     // the accumulators' base in tensor memory
  int failed;                                        // an MMA did not finish in time
};

// The stages' panels at the first 1024-byte boundary of the CTA's dynamic shared memory (which starts on 16): a
// kernel that computes tensor tiles gives its whole dynamic shared memory to them (kDynamicSharedBytes).
__device__ inline Panels& panels() {
  extern __shared__ __align__(16) uint8_t dynamic_shared[];
  uint32_t at = cute::cast_smem_ptr_to_uint(dynamic_shared);
  return *reinterpret_cast<Panels*>(dynamic_shared + ((1024u - at % 1024u) % 1024u));
}

// A panel as the MMA reads it.
template <Major M>
__device__ inline auto panel(core::bf16_t* values) {
  return cute::make_tensor(cute::make_smem_ptr(reinterpret_cast<Value*>(values)), PanelLayoutOf<M>{});
}

// A piece's one copy as an asynchronous 16-byte copy (CuTe's SM80_CP_ASYNC_CACHEGLOBAL, cp.async): a thread's
// copies of a block are one group, which lands blocks later (TileSteps::land), where a load then a store each would
// wait for the load before the next piece.
struct AsyncPieceMove {
  __device__ void operator()(core::Piece* to, const core::Piece* from) const {
    cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>::copy(*reinterpret_cast<const cute::uint128_t*>(from),
                                                           *reinterpret_cast<cute::uint128_t*>(to));
  }
};

// cp.async.wait_group with a count known only at run time (0 to N): the instruction takes an immediate.
template <int N>
__device__ inline void cp_async_wait_at_most(int groups) {
  if constexpr (N > 0)
    if (groups < N) return cp_async_wait_at_most<N - 1>(groups);
  cute::cp_async_wait<N>();
}

// This thread's part of work the CTA's threads share: thread t part t of blockDim.
__device__ inline core::Part cta_part() {
  return core::Part{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
}

__device__ inline int warp() {
  return static_cast<int>(threadIdx.x) / 32;
}

// The barrier of every thread of the CTA, which thread 0 enters from inside core's body and the others from their
// serving loop (fused_pass.cu): the non-aligned named barrier 1 (barrier.sync), unlike __syncthreads' aligned 0.
__device__ inline void cta_barrier() {
  asm volatile("barrier.sync 1;" ::: "memory");
}
// The same barrier with a vote: true for every thread when `yes` was true for one (barrier.red.or).
__device__ inline bool cta_any(bool yes) {
  uint32_t any;
  asm volatile(
      "{\n"
      ".reg .pred yes, any;\n"
      "setp.ne.u32 yes, %1, 0;\n"
      "barrier.red.or.pred any, 1, yes;\n"
      "selp.u32 %0, 1, 0, any;\n"
      "}"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(yes))
      : "memory");
  return any != 0;
}

__device__ inline void fence_before_sync() {
  asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
}
__device__ inline void fence_after_sync() {
  asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
}

// Wait for an mbarrier's phase of `parity`, for at most `timeout_ns`; false when it did not complete.
__device__ inline bool await_phase(uint64_t& barrier, uint32_t parity, uint64_t timeout_ns) {
  uint64_t start = core::now_ns();
  while (!cutlass::arch::ClusterBarrier::try_wait(&barrier, parity))
    if (core::now_ns() - start > timeout_ns) return false;
  return true;
}
// Wait for the MMAs' commit to complete the stage barrier's phase of `parity`.
__device__ inline bool await_mma(Storage& s, int stage, uint32_t parity, uint64_t timeout_ns) {
  return await_phase(s.mma_done[stage], parity, timeout_ns);
}

// Before the pass: warp 1 takes the CTA's tensor memory (kTensorColumns, two CTAs an SM: all of its 512 columns; or,
// `scaled`, all 512 for the one CTA an SM whose MMAs take scaled blocks) and the stages' barriers are set up; the
// CTA's barrier that follows publishes both. `maps`: the CTA's kPanelMaps, each the template the layer encoded at its
// creation.
__device__ inline void open(Storage& s, cute::TmaDescriptor* maps, bool scaled) {
  if (warp() == kMmaWarp) {
    __syncwarp();
    cute::TMEM::Allocator1Sm allocator{};
    allocator.allocate(tensor_columns(scaled), &s.tmem);
    allocator.release_allocation_lock();
    fence_before_sync();
  }
  if (threadIdx.x == 0) {
    for (uint64_t& barrier : s.mma_done) cute::initialize_barrier(barrier, 1);
    for (uint64_t& barrier : s.loaded) cute::initialize_barrier(barrier, 1);  // the issuer's arrival with its bytes
    cutlass::arch::fence_barrier_init();  // the init before the MMA's commit arrives, as CUTLASS's pipelines order it
    s.maps = maps;
    s.scaled = scaled ? ~0u : 0u;  // core takes those of a tile's parts that core::scaled_parts names
    s.loads = core::PanelStages{};
    s.failed = 0;
  }
}

// core::wait_busy's wait on this CTA.
struct StageWait {
  Storage& s;
  uint64_t timeout_ns;
  __device__ bool wait(int stage, uint32_t parity) { return await_mma(s, stage, parity, timeout_ns); }
};

// After the pass, once every thread has left its last tile (the CTA's barrier before): the tensor memory back. The
// stages still busy (a wait for their MMAs ran out) give the MMAs one more timeout to finish, so that the memory is
// not freed under an MMA that still writes it where the hardware is only slow; TMA loads whose wait ran out likewise,
// which write the panels. Not inlined: in the pass kernel's body, its branches spill the body's registers.
__device__ __noinline__ void close(Storage& s, const core::PanelStages& stages, uint64_t timeout_ns) {
  if (warp() == kMmaWarp) {
    for (int stage = 0; stage < core::kPanelStages; ++stage)  // the issuer's bits; every lane polls
      if (s.loads.busy(stage)) await_phase(s.loaded[stage], s.loads.parity(stage), timeout_ns);
    StageWait waits{s, timeout_ns};
    core::wait_busy(stages, waits);
    __syncwarp();
    fence_after_sync();
    cute::TMEM::Allocator1Sm{}.free(s.tmem, tensor_columns(s.scaled != 0));
  }
}

// Slices [from, to) of a chunk's accumulator at `tmem` into c by core's epilogue, warps 4 to 7, 8 columns of one row
// per load.
__device__ inline void write_slices(const core::Gemm& g, uint32_t tmem, int row0, int col0, int from, int to) {
  if (warp() < kFirstEpilogueWarp) return;
  __syncwarp();
  fence_after_sync();
  auto tiled = accumulator_load(tmem);
  auto load = tiled.get_slice(threadIdx.x % kEpilogueThreads);
  auto source = load.partition_S(accumulator(tmem));
  auto where = load.partition_D(accumulator_coordinates());
  static_assert(decltype(cute::size<1>(source))::value == core::kEpilogueSlices, "a load a slice");
  auto values = cute::make_tensor<float>(cute::shape(where(cute::_, 0, 0, 0)));
  for (int n = from; n < to; ++n) {
    __syncwarp();  // the load and its wait are warp-aligned; the writes below diverge at the tile's edge
    cute::copy(tiled, source(cute::_, n, 0, 0), values);
    cutlass::arch::fence_view_async_tmem_load();
    // Unrolled: the values stay in registers, each at a static index.
#pragma unroll
    for (int v = 0; v < cute::size(values); ++v) {
      auto at = where(cute::_, n, 0, 0)(v);
      core::tensor_epilogue(g, row0 + cute::get<0>(at), col0 + cute::get<1>(at), values(v));
    }
  }
  fence_before_sync();  // the loads done before the CTA's next barrier, after which an MMA may write the accumulator
}

// A field of a map in global memory (tensormap.replace; CuTe has the address's, and CCCL's wrappers stop at sm_101a):
// dimension `Dim`'s extent, its box's, and the stride in bytes from one index of dimension 1 to the next.
template <int Dim>
__device__ inline void replace_extents(cute::TmaDescriptor* map, uint32_t extent, uint32_t box) {
  asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], %1, %2;" ::"l"(map), "n"(Dim), "r"(extent)
               : "memory");
  asm volatile("tensormap.replace.tile.box_dim.global.b1024.b32 [%0], %1, %2;" ::"l"(map), "n"(Dim), "r"(box)
               : "memory");
}
__device__ inline void replace_stride(cute::TmaDescriptor* map, uint64_t bytes) {
  asm volatile("tensormap.replace.tile.global_stride.global.b1024.b64 [%0], 0, %1;" ::"l"(map), "l"(bytes) : "memory");
}

// The issuer, before a tile's fills: each operand TMA takes (core::part_map, as core::boxed_operands rules) gets its
// map's fields in its slot of the CTA's maps (the template holds the rest: bf16, the 128-byte swizzle, zeros out of
// bounds), then the fences that let the loads read them; returns those operands, boxed_operands' bits. The tile
// before landed every load from those slots. The global proxy fence: the operands' rows were written by the generic
// proxy (other CTAs' tiles and row jobs, a peer's pushes), published by counters that thread 0 acquired before the
// CTA's barrier that started the tile; the loads that read them are the async proxy's.
__device__ __noinline__ uint32_t write_maps(const core::Gemm& g, cute::TmaDescriptor* maps) {
  uint32_t boxed = 0;
  for (int slot = 0; slot < 2 * g.num_parts; ++slot) {
    core::PanelMap m;
    if (!core::part_map(g, slot / 2, slot % 2, &m)) continue;
    boxed |= 1u << slot;
    cute::tma_descriptor_replace_addr_in_global_mem(maps + slot, m.base);
    replace_extents<0>(maps + slot, static_cast<uint32_t>(m.dims[0]), m.box[0]);
    replace_extents<1>(maps + slot, static_cast<uint32_t>(m.dims[1]), m.box[1]);
    replace_stride(maps + slot, m.stride_bytes);
  }
  if (!boxed) return 0;
  asm volatile("fence.proxy.async.global;" ::: "memory");
  cute::tma_descriptor_fence_release();
  for (int slot = 0; slot < core::kPanelMaps; ++slot)
    if (boxed >> slot & 1u) cute::tma_descriptor_fence_acquire(maps + slot);
  return boxed;
}

// core::sum_tile's steps on this CTA: the panels filled by all, the MMAs issued by warp 1, the epilogue written by
// warps 4 to 7 (or an element each by all).
struct TileSteps : StageWait {
  const core::Gemm& g;
  Panels& panels;
  uint32_t boxed;     // the operands whose panels TMA fills (core::boxed_operands), the threads the others'
  uint32_t scaled;    // the parts whose blocks the MMAs take block-scaled (Storage::scaled)
  int landed = 0;     // the tile's fills whose TMA loads the issuer waited for
  bool lost = false;  // a TMA load did not land in time: the tile has failed

  // The stage's majors, which its MMAs read them in: written by thread 0 before the CTA's barrier that lets warp 1
  // read them (the walk's vote before the block's MMAs), and after the one that follows the stage's last MMAs' issue.
  // A panel TMA takes is the issuer's boxes; the threads copy the other's pieces.
  __device__ bool fill(const core::MmaBlock& b, int stage) {
    if (threadIdx.x == 0) {
      s.majors[stage] = core::block_majors(g, b);
      s.scaled_stage[stage] = b.scaled;
    }
    if (b.scaled) return fill_scaled(b, stage);
    uint32_t by_box = boxed >> (2 * b.part) & 3u;  // bit 0 a's panel, bit 1 b's
    int first = by_box & 1u ? core::kBlockPieces / 2 : 0,
        end = by_box & 2u ? core::kBlockPieces / 2 : core::kBlockPieces;
    bool exact = true;
    for (int p = first + static_cast<int>(threadIdx.x); p < end; p += blockDim.x)
      core::fill_piece(g, b, p, panels.stages[stage], exact, AsyncPieceMove{});
    cute::cp_async_fence();  // the block's copies, one group
    if (by_box && threadIdx.x == kBoxIssuer) load_boxes(b, stage, by_box);
    return exact;
  }
  // A scaled block's codes (a piece each, as fill's) and its scales (a row's word each), by all; false when a scale
  // is not core::exact_scale. The scales' stores reach the scales' copy to tensor memory through land's proxy fence
  // and the CTA's barrier after it. Not inlined: in the walk, its loops spill the walk's registers (ptxas: 20 bytes).
  __device__ __noinline__ bool fill_scaled(const core::MmaBlock& b, int stage) {
    auto* codes = reinterpret_cast<uint8_t*>(panels.stages[stage]);
    for (int p = static_cast<int>(threadIdx.x); p < core::kBlockPieces; p += blockDim.x)
      core::fill_codes(g, b, p, codes, AsyncPieceMove{});
    cute::cp_async_fence();
    bool exact = true;
    for (int w = static_cast<int>(threadIdx.x); w < core::kScaleWords; w += blockDim.x)
      exact = core::fill_scales(g, b, w, panels.scales[stage]) && exact;
    return exact;
  }
  // The issuer's TMA loads of a block's panels in `by_box`: their bytes expected on the stage's barrier with its one
  // arrival, then each box (core::panel_boxes) from its operand's map.
  __device__ __noinline__ void load_boxes(const core::MmaBlock& b, int stage, uint32_t by_box) {
    uint32_t bytes = static_cast<uint32_t>(__popc(by_box) * core::kPanelValues * sizeof(core::bf16_t));
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.loaded[stage], bytes);
    for (int second = 0; second < 2; ++second) {
      if (!(by_box >> second & 1u)) continue;
      core::PanelBox boxes[core::kPanelBoxes];
      int count = core::block_boxes(g, b, second, boxes);
      core::bf16_t* panel = panels.stages[stage] + second * core::kPanelValues;
      for (int box = 0; box < count; ++box)
        cute::SM90_TMA_LOAD_2D::copy(s.maps + 2 * b.part + second, &s.loaded[stage],
                                     static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL),
                                     panel + boxes[box].offset, boxes[box].coords[0], boxes[box].coords[1]);
    }
    s.loads.committed(stage);
  }
  __device__ bool land(int fills, int groups) {
    cp_async_wait_at_most<core::kPanelStages - 2>(groups);
    cutlass::arch::fence_view_async_shared();  // the generic proxy's stores, before the MMA's reads
    return threadIdx.x != kBoxIssuer || land_boxes(fills - groups);
  }
  // The issuer: the TMA loads of the tile's fills before `upto` waited for (core::land_loads); false once one did not
  // land in time (its stage stays busy, for close).
  __device__ bool land_boxes(int upto) {
    if (!lost) {
      landed = core::land_loads(s.loads, landed, upto, *this);
      lost = landed < upto;
    }
    return !lost;
  }
  __device__ bool loaded(int stage, uint32_t parity) { return await_phase(s.loaded[stage], parity, timeout_ns); }
  // One vote: a flag in shared memory read after a plain barrier could already hold a later step's failure.
  __device__ bool sync(bool ok) {
    bool failed = cta_any(!ok);
    if (failed && threadIdx.x == 0) s.failed = 1;
    return !failed;
  }
  __device__ bool agree(bool yes) { return !cta_any(!yes); }
  // Warp 1's MMAs over a stage's panels of majors A and B, then their commit to its barrier.
  template <Major A, Major B>
  __device__ void issue(int stage, int accumulator_index, bool first) {
    using MmaAB = MmaOf<A, B>;
    auto slice = MmaAB{}.get_slice(0);
    auto a = slice.make_fragment_A(panel<A>(panels.stages[stage]));
    auto b = slice.make_fragment_B(panel<B>(panels.stages[stage] + core::kPanelValues));
    auto acc = accumulator(accumulator_address(s.tmem, accumulator_index));
    MmaAB mma;
    mma.accumulate_ = first ? cute::UMMA::ScaleOut::Zero : cute::UMMA::ScaleOut::One;
    for (int k = 0; k < cute::size<2>(a); ++k) {
      cute::gemm(mma, a(cute::_, cute::_, k), b(cute::_, cute::_, k), acc);
      mma.accumulate_ = cute::UMMA::ScaleOut::One;
    }
    cutlass::arch::umma_arrive(&s.mma_done[stage]);
  }
  // Warp 1's MMAs over a stage's scaled block: its scales copied into the stage's columns of tensor memory
  // (tcgen05.cp, CuTe's UTCCP, by one lane; a copy, then the MMAs that read it, run in the order issued), then an MMA
  // a 32 of the depth with its scales, then their commit to the stage's barrier (which the copies' completion joins).
  __device__ void issue_scaled(int stage, int accumulator_index, bool first) {
    auto slice = ScaledMma{}.get_slice(0);
    auto* codes = reinterpret_cast<Code*>(panels.stages[stage]);
    auto a = slice.make_fragment_A(cute::make_tensor(cute::make_smem_ptr(codes), CodePanelLayout{}));
    auto b = slice.make_fragment_B(
        cute::make_tensor(cute::make_smem_ptr(codes + core::kCodeLine * core::kMmaRows), CodePanelLayout{}));
    auto acc = accumulator(accumulator_address(s.tmem, accumulator_index));
    auto a_scales = scale_tensor<false>(s.tmem, stage);
    auto b_scales = scale_tensor<true>(s.tmem, stage);
    auto* atoms = reinterpret_cast<Scale*>(panels.scales[stage]);
    copy_scales(atoms, a_scales);
    copy_scales(atoms + core::kScaleAtomBytes, b_scales);
    ScaledMma mma;
    mma.accumulate_ = first ? cute::UMMA::ScaleOut::Zero : cute::UMMA::ScaleOut::One;
    for (int k = 0; k < cute::size<2>(a); ++k) {
      cute::gemm(mma.with(mma.accumulate_, a_scales(cute::_, cute::_, k), b_scales(cute::_, cute::_, k)),
                 a(cute::_, cute::_, k), b(cute::_, cute::_, k), acc);
      mma.accumulate_ = cute::UMMA::ScaleOut::One;
    }
    cutlass::arch::umma_arrive(&s.mma_done[stage]);
  }
  // An operand's atom of scales in shared memory into its columns (scale_copy), by one lane of the warp.
  template <class Scales>
  __device__ static void copy_scales(Scale* atom, const Scales& scales) {
    auto parts = scale_copy(atom, scales);
    auto descriptors = cute::get_utccp_smem_desc_tensor<ScaleCopy>(cute::get<1>(parts));
    if (cute::elect_one_sync()) cute::copy(cute::get<0>(parts), descriptors, cute::get<2>(parts));
  }
  // Warp 1's MMAs of the stage when its fill recorded majors A and B; false for other majors.
  template <Major A, Major B>
  __device__ bool issue_if(core::PanelMajors majors, int stage, int accumulator_index, bool first) {
    if (majors.a != core_major<A> || majors.b != core_major<B>) return false;
    issue<A, B>(stage, accumulator_index, first);
    return true;
  }
  // Warp 1's MMAs of the stage in the majors its fill recorded. Not inlined: the four forms of the MMAs inlined into
  // the walk spill its registers (ptxas: 8 bytes), and warps 0 and 2 to 7 do not make the call.
  __device__ __noinline__ void issue_stage(int stage, int accumulator_index, bool first) {
    __syncwarp();
    fence_after_sync();
    if (s.scaled_stage[stage]) return issue_scaled(stage, accumulator_index, first);
    core::PanelMajors majors = s.majors[stage];
    issue_if<Major::K, Major::K>(majors, stage, accumulator_index, first) ||
        issue_if<Major::K, Major::MN>(majors, stage, accumulator_index, first) ||
        issue_if<Major::MN, Major::K>(majors, stage, accumulator_index, first) ||
        issue_if<Major::MN, Major::MN>(majors, stage, accumulator_index, first);
  }
  __device__ void multiply(int stage, int accumulator_index, bool first) {
    if (warp() == kMmaWarp) issue_stage(stage, accumulator_index, first);
  }
  __device__ void write(int chunk, int accumulator_index, int from, int to, bool exact) {
    if (exact)
      write_slices(g, accumulator_address(s.tmem, accumulator_index), core::chunk_row0(g, chunk),
                   core::chunk_col0(g, chunk), from, to);
    else
      core::chunk_elements(g, chunk, from, to, cta_part());
  }
};

// The tile g on tensor cores, by every thread of the CTA (core::sum_tile). A chunk with a value that is not a bf16 is
// left to gemm_element; an MMA or a TMA load that does not finish in `timeout_ns` leaves `failed` set, `stages` (and
// the storage's loads) naming the stages it may still write, and the tile.
__device__ inline void compute(const core::Gemm& g, Storage& s, core::PanelStages& stages, uint64_t timeout_ns) {
  uint32_t boxed = threadIdx.x == kBoxIssuer ? write_maps(g, s.maps) : core::boxed_operands(g);
  TileSteps steps{{s, timeout_ns}, g, panels(), boxed, s.scaled};
  core::sum_tile(g, stages, steps);
}

#endif  // __CUDACC__

}  // namespace mok::cuda::tensor_tile
