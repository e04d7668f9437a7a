// A tile GEMM on the tensor cores of one CTA (sm_100a / sm_103a): core's blocks (core/tensor_tile.hpp) through
// shared memory into a 1-CTA tcgen05 MMA (CuTe's SM100_MMA_F16BF16_SS, 128 x 128 x 16, fp32 accumulator in tensor
// memory), then core's epilogue from the accumulator, loaded by CuTe's tensor-memory load atom.
//
// The types (the MMA, the panels' shared-memory layout, the accumulator's load) compile on the host too:
// test_tensor_tile_cute holds them against core's layouts there.
#pragma once

#include <cutlass/arch/barrier.h>

#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/tmem_allocator_sm100.hpp>
#include <cute/tensor.hpp>

#include "core/gemm_element.hpp"
#include "core/tensor_tile.hpp"

namespace mok::cuda::tensor_tile {

using Value = cute::bfloat16_t;
using Mma =
    decltype(cute::make_tiled_mma(cute::SM100_MMA_F16BF16_SS<Value, Value, float, core::kMmaRows, core::kMmaCols,
                                                             cute::UMMA::Major::K, cute::UMMA::Major::K>{}));
// A panel, as the MMA partitions it: ((rows, 16), 1, depth / 16), K-major with the 128-byte swizzle.
using PanelShape = decltype(cute::partition_shape_A(
    Mma{}, cute::make_shape(cute::Int<core::kMmaRows>{}, cute::Int<core::kMmaDepth>{})));
using PanelLayout = decltype(cute::UMMA::tile_to_mma_shape(cute::UMMA::Layout_K_SW128_Atom<Value>{}, PanelShape{}));
// The accumulator in tensor memory: 8 columns of one lane per thread and load.
using AccumulatorLoad = cute::SM100_TMEM_LOAD_32dp32b8x;
using AccumulatorShape = cute::Shape<cute::Int<core::kMmaRows>, cute::Int<core::kMmaCols>>;
constexpr int kEpilogueThreads = 128;  // four warps, one lane quadrant of tensor memory each
constexpr int kTensorColumns = core::kMmaCols;

// Roles of a 256-thread CTA: warp 1 allocates tensor memory and issues the MMAs; warps 4 to 7 (lane quadrant
// warp % 4) load the accumulator. Warp 0, whose thread 0 runs core's body, only fills panels and writes elements:
// nothing warp-aligned.
constexpr int kMmaWarp = 1;
constexpr int kFirstEpilogueWarp = 4;

static_assert(cute::cosize_v<PanelLayout> == core::kPanelValues, "a panel is kMmaRows x kMmaDepth values");

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

// Shared memory of one CTA's tensor tile. The 128-byte swizzle repeats every 1024 bytes: the panels start on one.
struct Storage {
  alignas(1024) core::bf16_t panels[2 * core::kPanelValues];  // a's, then b's
  alignas(8) uint64_t mma_done;                               // the MMAs of a block have read the panels
  uint32_t tmem;                                              // the accumulator's base in tensor memory
  int inexact;                                                // a value of this chunk is not a bf16
  int failed;                                                 // an MMA did not finish in time
};

// A piece's one copy as an asynchronous 16-byte copy (CuTe's SM80_CP_ASYNC_CACHEGLOBAL, cp.async): a thread issues
// every copy of its pieces of a block before it waits for them (land), where a load then a store each would wait
// for the load before the next piece.
struct AsyncPieceMove {
  __device__ void operator()(core::Piece* to, const core::Piece* from) const {
    cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>::copy(*reinterpret_cast<const cute::uint128_t*>(from),
                                                           *reinterpret_cast<cute::uint128_t*>(to));
  }
  // This thread's copies in shared memory, before the proxy fence that hands the panels to the MMA.
  __device__ static void land() {
    cute::cp_async_fence();
    cute::cp_async_wait<0>();
  }
};

// This thread's part of work the CTA's threads share: thread t part t of blockDim.
__device__ inline core::Part cta_part() {
  return core::Part{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
}

__device__ inline int warp() {
  return static_cast<int>(threadIdx.x) / 32;
}

__device__ inline void fence_before_sync() {
  asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
}
__device__ inline void fence_after_sync() {
  asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
}

// Wait for the MMAs' commit to flip the barrier's phase, for at most `timeout_ns`; false when it did not come.
__device__ inline bool await_mma(Storage& s, uint32_t phase, uint64_t timeout_ns) {
  uint64_t start = core::now_ns();
  while (!cutlass::arch::ClusterBarrier::try_wait(&s.mma_done, phase))
    if (core::now_ns() - start > timeout_ns) return false;
  return true;
}

// Before the pass: warp 1 takes kTensorColumns of tensor memory (2 CTAs an SM: 256 of its 512) and the MMA barrier
// is set up; the CTA's barrier that follows publishes both.
__device__ inline void open(Storage& s) {
  if (warp() == kMmaWarp) {
    __syncwarp();
    cute::TMEM::Allocator1Sm allocator{};
    allocator.allocate(kTensorColumns, &s.tmem);
    allocator.release_allocation_lock();
    fence_before_sync();
  }
  if (threadIdx.x == 0) {
    cute::initialize_barrier(s.mma_done, 1);
    cutlass::arch::fence_barrier_init();  // the init before the MMA's commit arrives, as CUTLASS's pipelines order it
    s.failed = 0;
    s.inexact = 0;
  }
}

// After the pass, once every thread has left its last tile (the CTA's barrier before): the tensor memory back. After
// an MMA that ran out of time (`phase`: the phase after it) its commit is given one more timeout to come, so that the
// memory is not freed under an MMA that still writes it where the hardware is only slow.
__device__ inline void close(Storage& s, uint32_t phase, uint64_t timeout_ns) {
  if (warp() == kMmaWarp) {
    if (s.failed) await_mma(s, phase ^ 1, timeout_ns);
    __syncwarp();
    fence_after_sync();
    cute::TMEM::Allocator1Sm{}.free(s.tmem, kTensorColumns);
  }
}

// The chunk's accumulator into c by core's epilogue, warps 4 to 7, 8 columns of one row per load.
__device__ inline void write_chunk(const core::Gemm& g, const Storage& s, int row0, int col0) {
  if (warp() < kFirstEpilogueWarp) return;
  __syncwarp();
  fence_after_sync();
  auto tiled = accumulator_load(s.tmem);
  auto load = tiled.get_slice(threadIdx.x % kEpilogueThreads);
  auto from = load.partition_S(accumulator(s.tmem));
  auto where = load.partition_D(accumulator_coordinates());
  auto values = cute::make_tensor<float>(cute::shape(where(cute::_, 0, 0, 0)));
  for (int n = 0; n < cute::size<1>(from); ++n) {
    __syncwarp();  // the load and its wait are warp-aligned; the writes below diverge at the tile's edge
    cute::copy(tiled, from(cute::_, n, 0, 0), values);
    cutlass::arch::fence_view_async_tmem_load();
    // Unrolled: the values stay in registers, each at a static index.
#pragma unroll
    for (int v = 0; v < cute::size(values); ++v) {
      auto at = where(cute::_, n, 0, 0)(v);
      core::tensor_epilogue(g, row0 + cute::get<0>(at), col0 + cute::get<1>(at), values(v));
    }
  }
  fence_before_sync();
}

// The tile g on tensor cores, by every thread of the CTA (`barrier` is the CTA's): chunk by chunk, block by block,
// the panels filled by all, the MMAs by warp 1, the accumulator out by warps 4 to 7. A chunk with a value that is
// not a bf16 is left to gemm_element; an MMA that does not finish in `timeout_ns` leaves `failed` set and the tile.
template <class Barrier>
__device__ void compute(const core::Gemm& g, Storage& s, uint32_t& phase, uint64_t timeout_ns, Barrier barrier) {
  auto panels = cute::make_tensor(cute::make_smem_ptr(reinterpret_cast<Value*>(s.panels)), PanelLayout{});
  auto b_panels =
      cute::make_tensor(cute::make_smem_ptr(reinterpret_cast<Value*>(s.panels + core::kPanelValues)), PanelLayout{});
  auto slice = Mma{}.get_slice(0);
  auto a_view = slice.make_fragment_A(panels);
  auto b_view = slice.make_fragment_B(b_panels);
  auto acc = accumulator(s.tmem);
  for (int chunk = 0; chunk < core::tensor_chunks(g); ++chunk) {
    bool exact = true;
    for (int block = 0, blocks = core::chunk_blocks(g); block < blocks; ++block) {
      core::MmaBlock b = core::chunk_block(g, chunk, block);
      for (int p = threadIdx.x; p < core::kBlockPieces; p += blockDim.x)
        core::fill_piece(g, b, p, s.panels, exact, AsyncPieceMove{});
      AsyncPieceMove::land();
      cutlass::arch::fence_view_async_shared();  // the generic proxy's stores, before the MMA's reads
      barrier();
      if (warp() == kMmaWarp) {
        __syncwarp();
        fence_after_sync();
        Mma mma;
        mma.accumulate_ = block == 0 ? cute::UMMA::ScaleOut::Zero : cute::UMMA::ScaleOut::One;
        for (int k = 0; k < cute::size<2>(a_view); ++k) {
          cute::gemm(mma, a_view(cute::_, cute::_, k), b_view(cute::_, cute::_, k), acc);
          mma.accumulate_ = cute::UMMA::ScaleOut::One;
        }
        cutlass::arch::umma_arrive(&s.mma_done);
      }
      if (!await_mma(s, phase, timeout_ns)) s.failed = 1;
      phase ^= 1;
      barrier();  // every thread leaves together when one gave up
      if (s.failed) return;
    }
    if (!exact) atomicOr(&s.inexact, 1);
    barrier();
    int row0 = core::chunk_row0(g, chunk), col0 = core::chunk_col0(g, chunk);
    if (!s.inexact)
      write_chunk(g, s, row0, col0);
    else
      core::gemm_elements(g, row0, col0, core::kMmaRows, core::kMmaCols, cta_part());
    barrier();
    if (threadIdx.x == 0) s.inexact = 0;  // read by all before the barrier above; set again after the next
  }
}

#endif  // __CUDACC__

}  // namespace mok::cuda::tensor_tile
