// core::RowMoves and core::bulk_copy (core/bulk_copy.hpp), the row moves the fused executor's CTAs make as bulk copies:
// a row copied unchanged, on 16 bytes at both ends, goes whole through the slots, each of its copies by one slot, the
// job's copies spread over the slots; any other row in every part's pieces; and a slot's copies, a batch at a time,
// whose loads and stores run asynchronously as TMA's do, wait for what they must.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "check.hpp"
#include "core/bulk_copy.hpp"

using namespace mok_test;
namespace core = mok::core;

namespace {

constexpr core::bf16_t kUnwritten = 0x7fc1;  // a NaN no move writes

// A row of a job: where its values come from and go, and whether they are scaled.
struct Row {
  int64_t n;
  size_t src_at, dst_at;  // in values from a 16-byte boundary
  bool scaled;
};

// A recording Bulk: copies synchronously, and notes each copy's slot and destination range.
struct Copy {
  int slot;
  const core::bf16_t* dst;
  int64_t n;
};
struct RecordingBulk {
  int count, own;
  std::vector<Copy>* copies;
  int slots() const { return count; }
  int slot() const { return own; }
  void copy(const core::bf16_t* src, int64_t n, core::bf16_t* dst) {
    CHECK_MSG(core::on_piece(src) && core::on_piece(dst) && n % core::kPieceValues == 0 && n <= core::kBulkValues,
              "a bulk copy of %lld values off 16 bytes or over a slot", static_cast<long long>(n));
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(core::bf16_t));
    copies->push_back(Copy{own, dst, n});
  }
};

// A row's span of src and dst: room for it 7 values on, whole pieces (so that the next span starts on 16 bytes).
size_t span_values(const Row& r) {
  return (static_cast<size_t>(r.n) + 16) / core::kPieceValues * core::kPieceValues;
}

bool in_bulk(const Row& r) {
  return !r.scaled && r.n % core::kPieceValues == 0 && r.src_at % core::kPieceValues == 0 &&
         r.dst_at % core::kPieceValues == 0;
}

}  // namespace

// Jobs of 1 to 12 rows (lengths 5 to 20000: whole pieces or not, one slot's 8192 values or several), each on or off
// 16 bytes at either end, copied or scaled, over 1, 7, 64 or 255 parts of which 1, 2 or 6 hold slots, the parts run
// in a shuffled order: every value lands as the contract has it (scaled: bf16 of the fp32 product, rounded once); the
// rows copied unchanged on 16 bytes go whole as bulk copies and no other does; each of their values by one copy; the
// job's copies spread over the slots as evenly as they go (copy c by slot c mod slots).
TEST(rows_copied_unchanged_go_in_bulk_spread_over_the_slots) {
  std::mt19937_64 rng(seed() + 1);
  std::uniform_real_distribution<float> value(-1e4f, 1e4f);
  for (int job = 0; job < 120; ++job) {
    std::vector<Row> rows(1 + rng() % 12);
    size_t total = 0;
    for (Row& r : rows) {
      int64_t lengths[] = {5, 96, 7168, 8192, 8200, 20000, 8 + static_cast<int64_t>(rng() % 300)};
      r.n = lengths[rng() % 7];
      r.src_at = rng() % 3 ? 0 : 1 + rng() % 7;
      r.dst_at = rng() % 3 ? 0 : 1 + rng() % 7;
      r.scaled = rng() % 4 == 0;
      total += span_values(r);
    }
    int parts = std::vector<int>{1, 7, 64, 255}[rng() % 4];
    int slots = std::min(parts, std::vector<int>{1, 2, 6}[rng() % 3]);
    float weight = std::uniform_real_distribution<float>(-3.0f, 3.0f)(rng);
    // Each row in its own 16-byte aligned span of src and dst.
    std::vector<core::Piece> src_pieces(total / core::kPieceValues + 1), dst_pieces(total / core::kPieceValues + 1);
    auto* src = reinterpret_cast<core::bf16_t*>(src_pieces.data());
    auto* dst = reinterpret_cast<core::bf16_t*>(dst_pieces.data());
    for (size_t i = 0; i < total; ++i) src[i] = core::float_to_bf16(value(rng));
    std::fill(dst, dst + total, kUnwritten);
    std::vector<size_t> span(rows.size());
    for (size_t r = 0, at = 0; r < rows.size(); at += span_values(rows[r]), ++r) span[r] = at;
    std::vector<int> order(static_cast<size_t>(parts));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<Copy> copies;
    for (int index : order) {
      int own = -1;
      for (int s = 0; s < slots; ++s)
        if (index == s * parts / slots) own = s;
      core::RowMoves<RecordingBulk> moves{core::Part{index, parts}, RecordingBulk{slots, own, &copies}};
      for (size_t r = 0; r < rows.size(); ++r) {
        const core::bf16_t* from = src + span[r] + rows[r].src_at;
        core::bf16_t* to = dst + span[r] + rows[r].dst_at;
        if (rows[r].scaled)
          moves.row(from, rows[r].n, to, core::ScaledValue{weight});
        else
          moves.row(from, rows[r].n, to, core::SameValue{});
      }
    }
    long long wrong = 0, stray = 0, unbulked = 0, overbulked = 0;
    int64_t bulk_copies = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      const Row& row = rows[r];
      const core::bf16_t* from = src + span[r] + row.src_at;
      const core::bf16_t* to = dst + span[r] + row.dst_at;
      for (int64_t i = 0; i < row.n; ++i) {
        core::bf16_t want = row.scaled ? core::ScaledValue{weight}(from[i]) : from[i];
        if (to[i] != want && wrong++ < 3)
          std::printf("  row %zu (n %lld) value %lld: %#x, want %#x\n", r, static_cast<long long>(row.n),
                      static_cast<long long>(i), to[i], want);
      }
      for (size_t i = span[r]; i < span[r] + span_values(row); ++i)
        if (i < span[r] + row.dst_at || i >= span[r] + row.dst_at + static_cast<size_t>(row.n))
          stray += dst[i] != kUnwritten;
      int64_t covered = 0;
      for (const Copy& c : copies)
        if (c.dst >= to && c.dst < to + row.n) covered += c.dst + c.n <= to + row.n ? c.n : -row.n;  // none past it
      if (in_bulk(row)) {
        unbulked += covered != row.n;
        bulk_copies += (row.n + core::kBulkValues - 1) / core::kBulkValues;
      } else {
        overbulked += covered != 0;
      }
    }
    std::vector<int64_t> per_slot(static_cast<size_t>(slots), 0);
    for (const Copy& c : copies) ++per_slot[static_cast<size_t>(c.slot)];
    auto [few, many] = std::minmax_element(per_slot.begin(), per_slot.end());
    CHECK_MSG(wrong == 0 && stray == 0, "job %d (%d parts, %d slots): %lld values wrong, %lld written outside", job,
              parts, slots, wrong, stray);
    CHECK_MSG(
        unbulked == 0 && overbulked == 0 && static_cast<int64_t>(copies.size()) == bulk_copies,
        "job %d: %lld rows not covered once by bulk copies, %lld rows in bulk that may not be, %zu copies of %lld", job,
        unbulked, overbulked, copies.size(), static_cast<long long>(bulk_copies));
    CHECK_MSG(*many - *few <= 1, "job %d: the slots made %lld to %lld copies of %lld", job,
              static_cast<long long>(*few), static_cast<long long>(*many), static_cast<long long>(bulk_copies));
  }
}

namespace {

// A slot as TMA runs it: a batch's loads land in the staging only when the batch is waited for, and its stores read
// the staging only when the slot's stores are waited for (or the job ends): the latest the hardware may, so that a
// missing wait shows. It also notes a load issued over stores not yet read, a store issued over loads not landed, and
// a batch past the slot's room.
struct LazySlot {
  struct Copy {
    const core::bf16_t* src;
    core::bf16_t* dst;
    int64_t n, at;
  };
  std::vector<core::bf16_t> staging = std::vector<core::bf16_t>(core::kBulkValues, kUnwritten);
  std::vector<Copy> batch;    // the batch's copies, loaded or not
  std::vector<Copy> loading;  // its loads in flight
  std::vector<Copy> storing;  // stores not yet read out of the staging
  int64_t values = 0;         // the batch's
  bool lands = true;          // false: loads never land (a peer that stopped)
  int overwrites = 0, early_reads = 0, overflows = 0, batches = 0;

  void read_out() {
    for (const Copy& c : storing) std::copy(staging.begin() + c.at, staging.begin() + c.at + c.n, c.dst);
    storing.clear();
  }
  int count() const { return static_cast<int>(batch.size()); }
  int64_t used() const { return values; }
  // The slot's room, as the test reads the rule (not core's batch_fits, which it checks).
  bool has_room(int64_t n) const { return batch.size() < core::kBulkBatch && values + n <= core::kBulkValues; }
  void wait_read() { read_out(); }
  void load(const core::bf16_t* src, int64_t n, core::bf16_t* dst) {
    overwrites += !storing.empty();
    overflows += !has_room(n);
    batch.push_back(Copy{src, dst, n, values});
    loading.push_back(batch.back());
    values += n;
  }
  bool land() {
    if (!lands) return false;
    for (const Copy& c : loading)
      if (c.at + c.n <= core::kBulkValues) std::copy(c.src, c.src + c.n, staging.begin() + c.at);
    loading.clear();
    ++batches;
    return true;
  }
  void store() {
    early_reads += !loading.empty();
    read_out();  // the emulation keeps one batch's stores
    storing = batch;
    batch.clear();
    values = 0;
  }
};

// Copies of `sizes` values, one after another through one slot, then the job's end (the flush, every store read out):
// every destination holds its source, no load was issued over stores not yet read out, no store over loads not
// landed, no batch past the slot's room; `batches` the batches that landed.
void check_copies(const std::vector<int64_t>& sizes, int* batches) {
  std::mt19937_64 rng(seed() + 3 + sizes.size());
  std::uniform_real_distribution<float> value(-1e4f, 1e4f);
  LazySlot slot;
  std::vector<std::vector<core::bf16_t>> sources, destinations;
  for (int64_t n : sizes) {
    sources.emplace_back(static_cast<size_t>(n));
    for (auto& v : sources.back()) v = core::float_to_bf16(value(rng));
    destinations.emplace_back(static_cast<size_t>(n), kUnwritten);
  }
  bool all = true;
  for (size_t c = 0; c < sources.size(); ++c)
    all &= core::bulk_copy(slot, sources[c].data(), static_cast<int64_t>(sources[c].size()), destinations[c].data());
  all &= core::bulk_flush(slot);
  slot.read_out();
  long long wrong = 0;
  for (size_t c = 0; c < sources.size(); ++c) wrong += sources[c] != destinations[c];
  CHECK_MSG(all && wrong == 0 && slot.overwrites == 0 && slot.early_reads == 0 && slot.overflows == 0,
            "%lld of %zu copies wrong; %d loads over stores not read out, %d stores over loads not landed, %d loads "
            "past the slot's room",
            wrong, sources.size(), slot.overwrites, slot.early_reads, slot.overflows);
  *batches = slot.batches;
}

}  // namespace

// 60 copies of 8 to 8192 values and 60 of 8 to 256, through one slot: each lands where it goes. 64 copies of 64 values
// go in 8 batches of kBulkBatch, 4 copies of 8192 in 4, 6 of 4096 in 3. A batch that never lands fails the copy that
// finds it full, which loads nothing more, and nothing is stored.
TEST(bulk_copies_wait_for_their_slot_a_batch_at_a_time) {
  std::mt19937_64 rng(seed() + 2);
  std::vector<int64_t> large, small;
  for (int c = 0; c < 60; ++c) {
    large.push_back(core::kPieceValues * (1 + static_cast<int64_t>(rng() % (core::kBulkValues / core::kPieceValues))));
    small.push_back(core::kPieceValues * (1 + static_cast<int64_t>(rng() % 32)));
  }
  int batches = 0;
  check_copies(large, &batches);
  check_copies(small, &batches);
  check_copies(std::vector<int64_t>(64, 64), &batches);
  CHECK_MSG(batches == 64 / core::kBulkBatch, "64 copies of 64 values in %d batches", batches);
  check_copies(std::vector<int64_t>(4, core::kBulkValues), &batches);
  CHECK_MSG(batches == 4, "4 copies of a whole slot in %d batches", batches);
  check_copies(std::vector<int64_t>(6, core::kBulkValues / 2), &batches);
  CHECK_MSG(batches == 3, "6 copies of half a slot in %d batches", batches);  // a slot filled exactly is one batch

  // A batch that never lands: the copy that finds it full fails, loading nothing more, and nothing is stored.
  LazySlot stopped;
  stopped.lands = false;
  std::vector<core::bf16_t> src(64, 1), dst(64, kUnwritten);
  bool loaded = true;
  for (int c = 0; c < core::kBulkBatch; ++c) loaded &= core::bulk_copy(stopped, src.data(), 8, dst.data() + 8 * c);
  bool next = core::bulk_copy(stopped, src.data(), 8, dst.data());
  CHECK_MSG(loaded && !next && stopped.batch.size() == core::kBulkBatch && stopped.overflows == 0 &&
                !core::bulk_flush(stopped) && stopped.storing.empty() && dst[0] == kUnwritten,
            "a batch that never lands: %zu copies in it, %d past its room, the copy after it %s", stopped.batch.size(),
            stopped.overflows, next ? "made" : "refused");
}

MOK_TEST_MAIN
