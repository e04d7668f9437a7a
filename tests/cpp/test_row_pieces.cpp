// core::move_part, the row moves of dispatch and combine as a CTA's threads share them (core/tile.hpp): each part
// writes exactly its own 16-byte pieces (each_piece's: piece i to part i mod count), each value copied or scaled as
// the contract rounds it, whatever the row's length and its alignment; and a part reads its next kPiecesInFlight
// whole pieces before it writes any (what lets one thread's reads of a peer's row overlap).
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "check.hpp"
#include "core/tile.hpp"

using namespace mok_test;
namespace core = mok::core;

namespace {

constexpr core::bf16_t kUnwritten = 0x7fc1;  // a NaN no move writes

std::vector<core::bf16_t> random_row(std::mt19937_64& rng, size_t n) {
  std::uniform_real_distribution<float> value(-1e4f, 1e4f);
  std::vector<core::bf16_t> row(n);
  for (auto& v : row) v = core::float_to_bf16(value(rng));
  return row;
}

}  // namespace

// Rows of 1 to 300 values and of 7168 (a hidden size), src and dst on 16 bytes or not, split into 1, 2, 3, 7, 64, 255
// or 300 parts run in a shuffled order: each part alone writes only its pieces and all of them, each value the
// contract's (scaled: bf16 of the fp32 product, rounded once), and the parts together write every value once.
TEST(each_part_moves_its_own_pieces_copied_or_scaled) {
  std::mt19937_64 rng(seed() + 1);
  for (int n_case = 0; n_case < 200; ++n_case) {
    int64_t n = n_case % 10 == 0 ? 7168 : 1 + static_cast<int64_t>(rng() % 300);
    int parts = std::vector<int>{1, 2, 3, 7, 64, 255, 300}[rng() % 7];
    size_t src_at = rng() % 2 ? 0 : 1 + rng() % 7, dst_at = rng() % 2 ? 0 : 1 + rng() % 7;  // values: 2 bytes each
    bool scaled = rng() % 2;
    float weight = std::uniform_real_distribution<float>(-3.0f, 3.0f)(rng);
    alignas(16) static core::bf16_t src[7168 + 16], dst[7168 + 16];
    std::vector<core::bf16_t> values = random_row(rng, static_cast<size_t>(n) + 8);
    std::copy(values.begin(), values.end(), src);
    std::fill(std::begin(dst), std::end(dst), kUnwritten);
    std::vector<int> order(static_cast<size_t>(parts));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const core::bf16_t* from = src + src_at;  // off 16 bytes for src_at 1 to 7 (2 bytes a value)
    core::bf16_t* to = dst + dst_at;
    long long wrong = 0, stray = 0;
    std::vector<bool> ran(static_cast<size_t>(parts), false);
    for (int index : order) {
      core::Part part{index, parts};
      ran[static_cast<size_t>(index)] = true;
      if (scaled)
        core::move_part(part, from, n, to, core::ScaledValue{weight});
      else
        core::move_part(part, from, n, to, core::SameValue{});
      for (int64_t i = 0; i < n; ++i) {
        bool written = dst[dst_at + i] != kUnwritten;
        if (written != ran[static_cast<size_t>(i / core::kPieceValues % parts)] && stray++ < 3)
          std::printf("  n %lld, %d parts: value %lld %s after part %d\n", static_cast<long long>(n), parts,
                      static_cast<long long>(i), written ? "written" : "not written", index);
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      core::bf16_t want = scaled ? core::float_to_bf16(weight * core::bf16_to_float(from[i])) : from[i];
      if (dst[dst_at + i] != want && wrong++ < 3)
        std::printf("  n %lld: value %lld is %04x, not %04x\n", static_cast<long long>(n), static_cast<long long>(i),
                    dst[dst_at + i], want);
    }
    for (size_t i = 0; i < dst_at; ++i) stray += dst[i] != kUnwritten;
    for (size_t i = dst_at + static_cast<size_t>(n); i < std::size(dst); ++i) stray += dst[i] != kUnwritten;
    CHECK_MSG(wrong == 0 && stray == 0, "n %lld, %d parts, src +%zu, dst +%zu%s: %lld values wrong, %lld stray",
              static_cast<long long>(n), parts, src_at, dst_at, scaled ? ", scaled" : "", wrong, stray);
  }
}

// The reads in flight, seen through a destination one step of the part on (dst = src + 8 · count values): a part
// that read each piece just before writing it would read back what it wrote one step before, and copy the row's first
// piece on and on; one that reads kPiecesInFlight pieces first moves each of them by one step, and only every
// kPiecesInFlight-th step reads a piece it wrote. (move_part's contract excludes overlap: this only makes its order
// visible.)
TEST(a_part_reads_its_next_pieces_before_it_writes_any) {
  std::mt19937_64 rng(seed() + 2);
  for (int parts : {1, 3}) {
    int64_t step = static_cast<int64_t>(parts) * core::kPieceValues, n = 8 * core::kPiecesInFlight * step;
    alignas(16) static core::bf16_t row[4096];
    std::vector<core::bf16_t> original = random_row(rng, static_cast<size_t>(n + step));
    std::copy(original.begin(), original.end(), row);
    core::move_part(core::Part{0, parts}, row, n, row + step, core::SameValue{});
    long long fresh = 0;  // part 0's pieces that hold what the piece a step before held at the start
    for (int64_t first = step; first < n + step; first += step)
      fresh += std::equal(row + first, row + first + core::kPieceValues, original.begin() + (first - step));
    int64_t pieces = n / step;
    CHECK_MSG(fresh == pieces - (pieces - 1) / core::kPiecesInFlight,
              "%d parts: %lld of %lld pieces moved from the original, not %lld", parts, fresh,
              static_cast<long long>(pieces), static_cast<long long>(pieces - (pieces - 1) / core::kPiecesInFlight));
  }
}

MOK_TEST_MAIN
