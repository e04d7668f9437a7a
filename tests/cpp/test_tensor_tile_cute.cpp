// The fused executor's tensor-core tile (cuda/tensor_tile.cuh) against core's layouts, computed by CuTe on the host
// (g++, no GPU): where CuTe's MMA reads each value of a panel in shared memory (core::panel_offset must put it
// there), where the fp32 accumulator of (row, column) lies in tensor memory, and which elements each epilogue thread
// loads (every element once; thread t only lane t, the lane quadrant t / 32 that its warp may read).
#include <cstdint>
#include <cstdio>
#include <vector>

#include "check.hpp"
#include "cuda/tensor_tile.cuh"

namespace tile = mok::cuda::tensor_tile;
using mok::core::kMmaCols;
using mok::core::kMmaDepth;
using mok::core::kMmaRows;

namespace {

// Every (row, k) of a panel: CuTe's address of it (the swizzle acts on the address: a 1024-byte aligned base, as
// in shared memory) against core's offset.
TEST(panel_offsets_are_cutes) {
  alignas(1024) static tile::Value panel[mok::core::kPanelValues];
  auto view = cute::make_tensor(cute::make_smem_ptr(panel), tile::PanelLayout{});
  std::vector<int> seen(mok::core::kPanelValues, 0);
  long long wrong = 0;
  for (int row = 0; row < kMmaRows; ++row)
    for (int k = 0; k < kMmaDepth; ++k) {
      int cute_at = static_cast<int>(&view(cute::make_coord(cute::make_coord(row, k % 16), 0, k / 16)) - panel);
      int core_at = mok::core::panel_offset(row, k);
      if (cute_at >= 0 && cute_at < mok::core::kPanelValues) ++seen[cute_at];
      if (cute_at != core_at && wrong++ < 3)
        std::printf("  (row %d, k %d): core %d, CuTe %d\n", row, k, core_at, cute_at);
    }
  CHECK_MSG(wrong == 0, "%lld panel offsets differ", wrong);
  for (int at = 0; at < mok::core::kPanelValues; ++at)
    CHECK_MSG(seen[at] == 1, "panel value %d held %d times", at, seen[at]);
}

// The accumulators: (row, column) of accumulator i at tensor-memory lane row, column i x kMmaCols + column (the
// address's high and low halves), every column inside the CTA's allocation.
TEST(accumulator_lane_is_the_row) {
  long long wrong = 0;
  for (int index = 0; index < mok::core::kAccumulators; ++index) {
    auto acc = tile::accumulator(tile::accumulator_address(0, index));
    for (int row = 0; row < kMmaRows; ++row)
      for (int col = 0; col < kMmaCols; ++col) {
        auto offset = acc.layout()(cute::make_coord(cute::make_coord(row, col), 0, 0));
        uint32_t at = (acc.data() + static_cast<uint32_t>(offset)).get();
        uint32_t column = static_cast<uint32_t>(index * kMmaCols + col);
        if ((at != (static_cast<uint32_t>(row) << 16 | column) || column >= tile::kTensorColumns) && wrong++ < 3)
          std::printf("  accumulator %d (row %d, column %d) at lane %u column %u\n", index, row, col, at >> 16,
                      at & 0xffff);
      }
  }
  CHECK_MSG(wrong == 0, "%lld accumulator addresses differ", wrong);
}

// The epilogue's loads: thread t (warp 4 + t / 32 of the CTA, lane quadrant t / 32) gets row t, every column once;
// load n columns 8n to 8n + 7, core's epilogue slice n (kEpilogueColumns).
TEST(epilogue_threads_load_their_own_lanes_once) {
  auto tiled = tile::accumulator_load(0);
  std::vector<int> seen(kMmaRows * kMmaCols, 0);
  long long foreign = 0, sliced = 0;
  for (int t = 0; t < tile::kEpilogueThreads; ++t) {
    auto where = tiled.get_slice(t).partition_D(tile::accumulator_coordinates());
    CHECK(cute::size<1>(where) == mok::core::kEpilogueSlices);
    for (int n = 0; n < cute::size<1>(where); ++n)
      for (int v = 0; v < cute::size<0>(where); ++v) {
        auto at = where(cute::_, n, 0, 0)(v);
        int row = cute::get<0>(at), col = cute::get<1>(at);
        ++seen[row * kMmaCols + col];
        if (row != t && foreign++ < 3) std::printf("  thread %d loads row %d\n", t, row);
        if (col / mok::core::kEpilogueColumns != n && sliced++ < 3) std::printf("  load %d has column %d\n", n, col);
      }
  }
  CHECK_MSG(foreign == 0, "%lld loads outside the thread's own lane", foreign);
  CHECK_MSG(sliced == 0, "%lld values outside their load's slice", sliced);
  for (int e = 0; e < kMmaRows * kMmaCols; ++e) CHECK_MSG(seen[e] == 1, "element %d loaded %d times", e, seen[e]);
  CHECK(tile::kFirstEpilogueWarp % 4 == 0);  // warp 4 + q reads quadrant q: (4 + q) % 4 == q
}

}  // namespace

MOK_TEST_MAIN
