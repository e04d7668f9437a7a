// The fused executor's tensor-core tile (cuda/tensor_tile.cuh) against core's layouts, computed by CuTe on the host
// (g++, no GPU): where CuTe's MMA reads each value of a panel in shared memory, K- and MN-major (core::panel_offset
// must put it there, and a piece's 8 values together), where the fp32 accumulator of (row, column) lies in tensor
// memory, and which elements each epilogue thread loads (every element once; thread t only lane t, the lane quadrant t
// / 32 that its warp may read).
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "check.hpp"
#include "cuda/tensor_tile.cuh"

namespace tile = mok::cuda::tensor_tile;
using mok::core::kMmaCols;
using mok::core::kMmaDepth;
using mok::core::kMmaRows;

namespace {

// Every (row, k) of a panel of major `major`: CuTe's address of it (the swizzle acts on the address: a 1024-byte
// aligned base, as in shared memory) against core's offset.
template <tile::Major M>
int cute_panel_at(int row, int k) {
  alignas(1024) static tile::Value panel[mok::core::kPanelValues];
  auto view = cute::make_tensor(cute::make_smem_ptr(panel), tile::PanelLayoutOf<M>{});
  return static_cast<int>(&view(cute::make_coord(cute::make_coord(row, k % 16), 0, k / 16)) - panel);
}

template <tile::Major M>
void check_panel_offsets(const char* name) {
  std::vector<int> seen(mok::core::kPanelValues, 0);
  long long wrong = 0;
  for (int row = 0; row < kMmaRows; ++row)
    for (int k = 0; k < kMmaDepth; ++k) {
      int cute_at = cute_panel_at<M>(row, k);
      int core_at = mok::core::panel_offset(tile::core_major<M>, row, k);
      if (cute_at >= 0 && cute_at < mok::core::kPanelValues) ++seen[cute_at];
      if (cute_at != core_at && wrong++ < 3)
        std::printf("  %s (row %d, k %d): core %d, CuTe %d\n", name, row, k, core_at, cute_at);
    }
  CHECK_MSG(wrong == 0, "%s: %lld panel offsets differ", name, wrong);
  for (int at = 0; at < mok::core::kPanelValues; ++at)
    CHECK_MSG(seen[at] == 1, "%s: panel value %d held %d times", name, at, seen[at]);
}

TEST(panel_offsets_are_cutes) {
  check_panel_offsets<tile::Major::K>("K-major");
  check_panel_offsets<tile::Major::MN>("MN-major");
}

// A piece of either major is 8 values that the swizzle keeps together: CuTe puts (row, k)'s 8 neighbours along the
// depth (K-major) or down the rows (MN-major) at 8 consecutive values from a multiple of 8, which fill_piece moves as
// one 16 bytes.
template <tile::Major M>
void check_pieces_whole(const char* name) {
  constexpr bool mn = M == tile::Major::MN;
  auto at = cute_panel_at<M>;
  long long torn = 0;
  for (int row = 0; row < kMmaRows; row += mn ? 8 : 1)
    for (int k = 0; k < kMmaDepth; k += mn ? 1 : 8) {
      bool whole = at(row, k) % 8 == 0;
      for (int v = 1; v < 8; ++v) whole = whole && at(mn ? row + v : row, mn ? k : k + v) == at(row, k) + v;
      if (!whole && torn++ < 3) std::printf("  %s piece at (row %d, k %d) is not 16 whole bytes\n", name, row, k);
    }
  CHECK_MSG(torn == 0, "%s: %lld pieces torn", name, torn);
}

TEST(panel_pieces_are_whole) {
  check_pieces_whole<tile::Major::K>("K-major");
  check_pieces_whole<tile::Major::MN>("MN-major");
}

// Byte (mn, k) of a panel (k within the MMA's 16) as the tensor cores address it from a shared-memory descriptor,
// read by the PTX ISA's fields (tcgen05 shared memory descriptor: start address, leading and stride byte offsets, each
// in 16 bytes) and its canonical layouts under the 128-byte swizzle (bits 4 to 6 of the address xor bits 7 to 9):
// K-major, 8 rows of 128 bytes an atom, atoms `stride` apart down the rows; MN-major, 64 rows across 128 bytes, 8 k
// an atom, atoms `leading` apart down the rows and `stride` apart along k.
int descriptor_byte(uint64_t descriptor, bool mn_major, int mn, int k, int element_bytes = 2) {
  uint32_t start = static_cast<uint32_t>(descriptor & 0x3fff) << 4;
  uint32_t leading = static_cast<uint32_t>(descriptor >> 16 & 0x3fff) << 4;
  uint32_t stride = static_cast<uint32_t>(descriptor >> 32 & 0x3fff) << 4;
  uint32_t row = static_cast<uint32_t>(mn), depth = static_cast<uint32_t>(k);
  uint32_t at = mn_major ? start + row % 64 * 2 + depth % 8 * 128 + row / 64 * leading + depth / 8 * stride
                         : start + row % 8 * 128 + row / 8 * stride + depth * static_cast<uint32_t>(element_bytes);
  return static_cast<int>(at ^ ((at >> 7 & 7u) << 4));
}

// CuTe's shared-memory descriptors on the host (a panel's start address reads as 0 here): its address cast says so on
// stdout, which is kept quiet meanwhile.
template <class Build>
auto quietly(Build build) {
  std::fflush(stdout);
  int saved = dup(1), null = open("/dev/null", O_WRONLY);
  dup2(null, 1);
  auto built = build();
  std::fflush(stdout);
  dup2(saved, 1);
  close(null);
  close(saved);
  return built;
}

// Operand `name`'s descriptors, one for each MMA's 16 of the depth: every (mn, k) of the panel where core's offset
// puts it, in the 128-byte swizzle (layout type 2), with the fixed bits 46 to 48 at 0b001, base offset 0 and the
// leading byte offset relative (bit 52 clear).
template <tile::Major M, class Fragment>
void check_descriptors(const Fragment& fragment, const char* name) {
  constexpr bool mn_major = M == tile::Major::MN;
  long long wrong = 0, fields = 0;
  for (int slice = 0; slice < cute::size<2>(fragment); ++slice) {
    uint64_t descriptor = static_cast<uint64_t>(*fragment(cute::_, cute::_, slice).data());
    bool fixed = (descriptor >> 46 & 7) == 1 && (descriptor >> 49 & 7) == 0 && (descriptor >> 52 & 1) == 0;
    if ((descriptor >> 61 != 2 || !fixed) && fields++ < 3)
      std::printf("  %s slice %d: descriptor %016llx\n", name, slice, static_cast<unsigned long long>(descriptor));
    for (int mn = 0; mn < kMmaRows; ++mn)
      for (int k = 0; k < 16; ++k) {
        int depth = slice * 16 + k;
        int core_at = 2 * mok::core::panel_offset(tile::core_major<M>, mn, depth);
        int read_at = descriptor_byte(descriptor, mn_major, mn, k);
        if (read_at != core_at && wrong++ < 3)
          std::printf("  %s (mn %d, k %d): core's byte %d, the descriptor's %d\n", name, mn, depth, core_at, read_at);
      }
  }
  CHECK_MSG(fields == 0, "%s: %lld descriptors not SW128, 0b001 at bit 46, base offset 0, relative", name, fields);
  CHECK_MSG(wrong == 0, "%s: %lld values read elsewhere", name, wrong);
}

// The MMA of majors A and B (tensor_tile::issue): its instruction descriptor says them (bits 15 and 16: 1 MN-major),
// and its operands' descriptors read core's panels.
template <tile::Major A, tile::Major B>
void check_mma(const char* name) {
  using Mma = tile::MmaOf<A, B>;
  bool a_mn = A == tile::Major::MN, b_mn = B == tile::Major::MN;
  uint32_t instruction = Mma{}.idesc_.desc_;
  CHECK_MSG((instruction >> 15 & 1) == a_mn && (instruction >> 16 & 1) == b_mn, "%s: instruction descriptor %08x", name,
            instruction);
  alignas(1024) static tile::Value panels[2 * mok::core::kPanelValues];
  auto a = quietly([] {
    return Mma{}.get_slice(0).make_fragment_A(cute::make_tensor(cute::make_smem_ptr(panels), tile::PanelLayoutOf<A>{}));
  });
  auto b = quietly([] {
    return Mma{}.get_slice(0).make_fragment_B(
        cute::make_tensor(cute::make_smem_ptr(panels + mok::core::kPanelValues), tile::PanelLayoutOf<B>{}));
  });
  CHECK(cute::size<2>(a) == kMmaDepth / 16 && cute::size<2>(b) == kMmaDepth / 16);
  check_descriptors<A>(a, (std::string(name) + " a").c_str());
  check_descriptors<B>(b, (std::string(name) + " b").c_str());
}

TEST(mma_descriptors_read_cores_panels) {
  check_mma<tile::Major::K, tile::Major::K>("K, K");
  check_mma<tile::Major::K, tile::Major::MN>("K, MN");
  check_mma<tile::Major::MN, tile::Major::K>("MN, K");
  check_mma<tile::Major::MN, tile::Major::MN>("MN, MN");
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

// A scaled block's panel of codes (core/scaled_block.hpp): every (row, k) where CuTe's block-scaled MMA reads it, a
// 16-byte piece of codes together, each byte of the panel once.
TEST(code_offsets_are_cutes) {
  alignas(1024) static tile::Code panel[mok::core::kPanelValues * 2];
  auto view = cute::make_tensor(cute::make_smem_ptr(panel), tile::CodePanelLayout{});
  CHECK(cute::cosize(tile::CodePanelLayout{}) == kMmaRows * mok::core::kScaledDepth);
  std::vector<int> seen(kMmaRows * mok::core::kScaledDepth, 0);
  long long wrong = 0;
  for (int row = 0; row < kMmaRows; ++row)
    for (int k = 0; k < mok::core::kScaledDepth; ++k) {
      int cute_at = static_cast<int>(&view(cute::make_coord(cute::make_coord(row, k % 32), 0, k / 32)) - panel);
      if (cute_at >= 0 && cute_at < static_cast<int>(seen.size())) ++seen[cute_at];
      if (cute_at != mok::core::code_offset(row, k) && wrong++ < 3)
        std::printf("  code (row %d, k %d): core %d, CuTe %d\n", row, k, mok::core::code_offset(row, k), cute_at);
    }
  CHECK_MSG(wrong == 0, "%lld code offsets differ", wrong);
  for (size_t at = 0; at < seen.size(); ++at) CHECK_MSG(seen[at] == 1, "panel byte %zu held %d times", at, seen[at]);
}

// The block-scaled MMA's descriptors of a's and b's panels of codes, one for each instruction's 32 of the depth: every
// (mn, k) at core's byte, K-major in the 128-byte swizzle, as the bf16 MMA's (check_descriptors).
TEST(scaled_mma_descriptors_read_cores_codes) {
  alignas(1024) static tile::Code panels[2 * kMmaRows * mok::core::kScaledDepth];
  auto a = quietly([] {
    return tile::ScaledMma{}.get_slice(0).make_fragment_A(
        cute::make_tensor(cute::make_smem_ptr(panels), tile::CodePanelLayout{}));
  });
  auto b = quietly([] {
    return tile::ScaledMma{}.get_slice(0).make_fragment_B(
        cute::make_tensor(cute::make_smem_ptr(panels + kMmaRows * mok::core::kScaledDepth), tile::CodePanelLayout{}));
  });
  CHECK(cute::size<2>(a) == mok::core::kScaledDepth / 32 && cute::size<2>(b) == mok::core::kScaledDepth / 32);
  long long wrong = 0, fields = 0;
  for (auto* fragment : {&a, &b})
    for (int slice = 0; slice < cute::size<2>(*fragment); ++slice) {
      uint64_t descriptor = static_cast<uint64_t>(*(*fragment)(cute::_, cute::_, slice).data());
      fields += descriptor >> 61 != 2 || (descriptor >> 46 & 7) != 1 || (descriptor >> 49 & 7) != 0;
      for (int mn = 0; mn < kMmaRows; ++mn)
        for (int k = 0; k < 32; ++k) {
          int core_at = mok::core::code_offset(mn, slice * 32 + k);
          int read_at = descriptor_byte(descriptor, false, mn, k, 1);
          if (read_at != core_at && wrong++ < 3)
            std::printf("  slice %d (mn %d, k %d): core's byte %d, the descriptor's %d\n", slice, mn, k, core_at,
                        read_at);
        }
    }
  CHECK_MSG(fields == 0, "%lld descriptors not SW128 with 0b001 at bit 46 and base offset 0", fields);
  CHECK_MSG(wrong == 0, "%lld codes read elsewhere", wrong);
}

// An operand's scales of a scaled block in shared memory: (row, block) where CUTLASS's block-scaled mainloop puts them
// for a 128 x 128 x 128 tile (Sm1xxBlockScaledConfig's smem atom, which UTCCP copies to tensor memory), at core's
// scale_offset; all 32 k of a block share it.
TEST(scale_offsets_are_cutlasss) {
  tile::ScaleAtomLayout layout{};
  CHECK(cute::cosize(layout) == mok::core::kScaleAtomBytes);
  long long wrong = 0;
  for (int row = 0; row < kMmaRows; ++row)
    for (int k = 0; k < mok::core::kScaledDepth; ++k) {
      int cutlass_at = static_cast<int>(layout(cute::make_coord(cute::make_coord(row, k % 32), 0, k / 32)));
      int core_at = mok::core::scale_offset(row, k / mok::core::kMxBlock);
      if (cutlass_at != core_at && wrong++ < 3)
        std::printf("  scale (row %d, k %d): core %d, CUTLASS %d\n", row, k, core_at, cutlass_at);
    }
  CHECK_MSG(wrong == 0, "%lld scale offsets differ", wrong);
}

// The scales in tensor memory, as the block-scaled MMA reads them (tensor_tile::scale_tensor): stage s's (row, k) of a
// at lane row mod 32, column kTensorColumns + 8 s + row / 32, byte k / 32 of the word (the MMA's scale id: bits 30 and
// 31 of the address); b's 4 columns on. So each stage's follow the accumulators, apart from the other stages', inside
// a scaled CTA's columns, and each is the byte that core's atom holds at scale_offset: 16-byte row i of the atom in
// lane i, its word j in column j.
TEST(scales_in_tensor_memory_are_cores_atom) {
  long long wrong = 0;
  std::vector<int> columns(tile::kScaledTensorColumns, 0);
  auto check = [&](auto scales, int first_column, const char* name) {
    for (int row = 0; row < kMmaRows; ++row)
      for (int k = 0; k < mok::core::kScaledDepth; ++k) {
        uint32_t at =
            (scales.data() + scales.layout()(cute::make_coord(cute::make_coord(row, k % 32), 0, k / 32))).get();
        int lane = static_cast<int>(at >> 16 & 0x3fff), column = static_cast<int>(at & 0xffff), byte = at >> 30;
        int atom = mok::core::scale_offset(row, k / mok::core::kMxBlock);
        bool placed = lane == atom / 16 && column == first_column + atom % 16 / 4 && byte == atom % 4;
        bool inside = column >= tile::kTensorColumns && column < tile::kScaledTensorColumns;
        if (inside && k % 32 == 0) ++columns[column];  // once a (lane, byte) of each of its columns
        if ((!placed || !inside) && wrong++ < 3)
          std::printf("  %s's scale (row %d, k %d) at lane %d column %d byte %d; core's atom byte %d\n", name, row, k,
                      lane, column, byte, atom);
      }
  };
  for (int stage = 0; stage < mok::core::kPanelStages; ++stage) {
    int first = tile::kTensorColumns + 2 * stage * tile::kScaleColumns;
    check(tile::scale_tensor<false>(0, stage), first, "a");
    check(tile::scale_tensor<true>(0, stage), first + tile::kScaleColumns, "b");
  }
  CHECK_MSG(wrong == 0, "%lld scales elsewhere in tensor memory", wrong);
  for (int column = 0; column < tile::kScaledTensorColumns; ++column)  // 32 lanes x 4 bytes a column, one stage's
    CHECK_MSG(
        columns[column] ==
            (column >= tile::kTensorColumns && column < tile::kTensorColumns + 6 * tile::kScaleColumns ? 32 * 4 : 0),
        "column %d holds %d scales of lanes 0 to 31", column, columns[column]);
  CHECK(tile::tensor_columns(false) == tile::kTensorColumns && tile::tensor_columns(true) == 512);
}

// The copy of an atom into tensor memory (tensor_tile::scale_copy, CuTe's UTCCP partitions of CUTLASS's mainloop's
// copy): every byte of the atom lands where the MMA reads that scale (scale_tensor), in each of the 4 lane quadrants.
TEST(scale_copy_puts_each_scale_where_the_mma_reads_it) {
  alignas(128) static tile::Scale atom[mok::core::kScaleAtomBytes];
  std::vector<int> rows(mok::core::kScaleAtomBytes, -1), blocks(mok::core::kScaleAtomBytes, -1);  // core's, a byte's
  for (int row = 0; row < kMmaRows; ++row)
    for (int block = 0; block < mok::core::kScaleBlocks; ++block) {
      rows[mok::core::scale_offset(row, block)] = row;
      blocks[mok::core::scale_offset(row, block)] = block;
    }
  long long wrong = 0;
  for (int stage = 0; stage < mok::core::kPanelStages; ++stage)
    for (int second = 0; second < 2; ++second) {
      auto check = [&](auto scales) {
        auto parts = tile::scale_copy(atom, scales);
        auto from = cute::get<1>(parts);
        auto to = cute::get<2>(parts);
        CHECK(cute::size(from) == cute::size(to));
        std::vector<int> landed(mok::core::kScaleAtomBytes * 4, 0);
        for (int v = 0; v < cute::size(from); ++v) {
          int byte = static_cast<int>((from.data() + from.layout()(v)).get() - atom);
          uint32_t at = (to.data() + to.layout()(v)).get();
          // The (row, block) core keeps at that byte, and where the MMA reads it.
          int row = rows[byte], block = blocks[byte];
          uint32_t read = (scales.data() + scales.layout()(cute::make_coord(cute::make_coord(row, 0), 0, block))).get();
          int quadrant = static_cast<int>(at >> 16 & 0x3fff) / 32;
          bool same = (at & 0xc000ffffu) == (read & 0xc000ffffu) && (at >> 16 & 31) == (read >> 16 & 31);
          if (byte >= 0 && byte < mok::core::kScaleAtomBytes && quadrant < 4) ++landed[quadrant * 512 + byte];
          if (!same && wrong++ < 3)
            std::printf("  stage %d %s: atom byte %d copied to %08x, read at %08x\n", stage, second ? "b" : "a", byte,
                        at, read);
        }
        for (int n = 0; n < static_cast<int>(landed.size()); ++n)
          CHECK_MSG(landed[n] == 1, "stage %d: atom byte %d copied %d times to lane quadrant %d", stage, n % 512,
                    landed[n], n / 512);
      };
      if (second)
        check(tile::scale_tensor<true>(0, stage));
      else
        check(tile::scale_tensor<false>(0, stage));
    }
  CHECK_MSG(wrong == 0, "%lld scales copied elsewhere than the MMA reads them", wrong);
}

// The block-scaled MMA's accumulator is the bf16 MMA's (tensor_tile::accumulator, which the epilogue loads): the same
// (row, column) at each place of the fragment.
TEST(scaled_mma_accumulates_where_the_bf16_mma_does) {
  auto coordinates = cute::make_identity_tensor(tile::AccumulatorShape{});
  auto scaled = tile::ScaledMma{}.get_slice(0).partition_C(coordinates);
  auto plain = tile::accumulator_coordinates();
  CHECK(cute::size(scaled) == cute::size(plain));
  long long wrong = 0;
  for (int v = 0; v < cute::size(plain); ++v) wrong += scaled(v) != plain(v);
  CHECK_MSG(wrong == 0, "%lld accumulator elements elsewhere", wrong);
  auto a = tile::ScaledMma{}.get_slice(0).make_fragment_C(scaled);
  auto b = tile::accumulator(0);
  CHECK(cute::cosize(a.layout()) == cute::cosize(b.layout()));
  for (int v = 0; v < cute::size(plain); ++v) wrong += a.layout()(v) != b.layout()(v);
  CHECK_MSG(wrong == 0, "%lld accumulator offsets differ", wrong);
}

}  // namespace

MOK_TEST_MAIN
