// The fused pass's bulk copies of rows (core/bulk_copy.hpp): lane 0 of warps 2 to 7 each hold a 16 KB slot of the
// CTA's dynamic shared memory (the panels' stages, which a comm CTA never fills and a compute CTA leaves idle between
// its tiles) and move a row job's rows that it copies unchanged through it with TMA's bulk copies, a batch of up to
// kBulkBatch of them at a time: CuTe's SM90_BULK_COPY_G2S into the slot, their bytes counted by the slot's barrier,
// then SM90_BULK_COPY_S2G out of it.
#pragma once

#include <cutlass/arch/barrier.h>

#include <cute/arch/copy_sm90_tma.hpp>

#include "core/bulk_copy.hpp"
#include "cuda/tensor_tile.cuh"

namespace mok::cuda::row_copies {

constexpr int kFirstWarp = 2;  // warp 0 holds thread 0 (core's body), warp 1 the MMAs' issue
constexpr int kSlots = 6;      // warps 2 to 7, one issuing thread each
constexpr int kSlotBytes = static_cast<int>(core::kBulkValues * sizeof(core::bf16_t));
static_assert(kSlots * kSlotBytes <= static_cast<int>(sizeof(tensor_tile::Panels)), "the slots are the panels'");
static_assert(kSlotBytes % 16 == 0, "a bulk copy's bytes and addresses are multiples of 16");

// The slots' state, in shared memory: each slot's fields are its thread's alone, but for `failed`.
struct Slots {
  alignas(8) uint64_t loaded[kSlots];                 // a slot's batch landed: its bytes complete the barrier's phase
  core::bf16_t* batch_dst[kSlots][core::kBulkBatch];  // the batch's copies: where each goes
  int32_t batch_values[kSlots][core::kBulkBatch];     // and its values, one after another in the staging
  int32_t batch_used[kSlots];                         // the staging's values the batch holds
  uint8_t batch_count[kSlots];                        // the batch's copies
  uint8_t parity[kSlots];                             // the parity of the slot's next phase
  uint8_t lost[kSlots];                               // the slot's last batch did not land in time
  volatile int failed;                                // a batch did not land: the job, and the pass, failed
};

// The CTA's slots: one place, which thread 0's operations and the serving threads reach alike.
__device__ inline Slots& slots() {
  __shared__ Slots state;
  return state;
}

// Before the pass: the barriers set up (one plain arrival a phase, the issuing thread's, after each load's bytes are
// expected); the CTA's barrier that follows publishes them.
__device__ inline void open(Slots& s) {
  if (threadIdx.x != 0) return;
  for (int slot = 0; slot < kSlots; ++slot) {
    cute::initialize_barrier(s.loaded[slot], 1);
    s.batch_used[slot] = 0;
    s.batch_count[slot] = s.parity[slot] = s.lost[slot] = 0;
  }
  cutlass::arch::fence_barrier_init();
  s.failed = 0;
}

// The slot this thread holds, -1 if none.
__device__ inline int own_slot() {
  int warp = tensor_tile::warp();
  return threadIdx.x % 32 == 0 && warp >= kFirstWarp && warp < kFirstWarp + kSlots ? warp - kFirstWarp : -1;
}

// One thread's bulk copies in a row job: core's Bulk (the job's slots, the one it holds) and Slot (a batch's steps).
struct SlotCopies {
  Slots& s;
  int own;
  uint64_t timeout_ns;

  __device__ int slots() const { return kSlots; }
  __device__ int slot() const { return own; }
  __device__ void copy(const core::bf16_t* src, int64_t n, core::bf16_t* dst) {
    if (s.failed) return;  // the pass has failed: its rows are not the layer's
    if (!core::bulk_copy(*this, src, n, dst)) fail();
  }
  __device__ void fail() {
    s.lost[own] = 1;
    s.failed = 1;
  }

  __device__ core::bf16_t* staging() const {
    return reinterpret_cast<core::bf16_t*>(reinterpret_cast<uint8_t*>(&tensor_tile::panels()) + own * kSlotBytes);
  }
  __device__ static int32_t bytes(int64_t values) { return static_cast<int32_t>(values * sizeof(core::bf16_t)); }
  __device__ int count() const { return s.batch_count[own]; }
  __device__ int64_t used() const { return s.batch_used[own]; }
  __device__ void wait_read() { cute::tma_store_wait<0>(); }
  __device__ void load(const core::bf16_t* src, int64_t n, core::bf16_t* dst) {
    int count = s.batch_count[own];
    cutlass::arch::ClusterTransactionBarrier::expect_transaction(&s.loaded[own], static_cast<uint32_t>(bytes(n)));
    cute::SM90_BULK_COPY_G2S::copy(src, &s.loaded[own], staging() + s.batch_used[own], bytes(n));
    s.batch_dst[own][count] = dst;
    s.batch_values[own][count] = static_cast<int32_t>(n);
    s.batch_used[own] += static_cast<int32_t>(n);
    s.batch_count[own] = static_cast<uint8_t>(count + 1);
  }
  __device__ bool land() {
    cutlass::arch::ClusterBarrier::arrive(&s.loaded[own]);
    if (!tensor_tile::await_phase(s.loaded[own], s.parity[own], timeout_ns)) return false;
    s.parity[own] ^= 1;
    return true;
  }
  __device__ void store() {
    const core::bf16_t* from = staging();
    for (int i = 0; i < s.batch_count[own]; ++i) {
      cute::SM90_BULK_COPY_S2G::copy(from, s.batch_dst[own][i], bytes(s.batch_values[own][i]));
      from += s.batch_values[own][i];
    }
    cute::tma_store_arrive();
    s.batch_count[own] = 0;
    s.batch_used[own] = 0;
  }

  // Before the job's copies: the bulk copies are the async proxy's, the counters' acquire (thread 0's, before the
  // CTA's barrier) and the threads' earlier writes into the slot's panels the generic proxy's.
  __device__ void begin() const {
    if (own < 0) return;
    asm volatile("fence.proxy.async.global;" ::: "memory");
    cutlass::arch::fence_view_async_shared();
  }
  // After them: the last batch flushed, every store written (not only read out of the slot), and ordered before the
  // generic release of the job's end (thread 0's, after the CTA's barrier).
  __device__ void end() {
    if (own < 0) return;
    if (!s.lost[own] && !core::bulk_flush(*this)) fail();  // the batch's loads land even where another slot failed
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    asm volatile("fence.proxy.async.global;" ::: "memory");
  }
};

// After the pass, before the CTA's shared memory goes: a slot whose batch did not land gives it one more timeout, so
// that a load that is only slow does not write shared memory a later CTA holds.
__device__ inline void close(Slots& s, uint64_t timeout_ns) {
  int own = own_slot();
  if (own >= 0 && s.lost[own]) tensor_tile::await_phase(s.loaded[own], s.parity[own], timeout_ns);
}

}  // namespace mok::cuda::row_copies
