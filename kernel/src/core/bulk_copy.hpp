// Rows a row job copies unchanged, moved whole by a few of its parts as bulk copies: the fused executor's CTAs copy
// them with TMA through slots of shared memory, which keep a row's bytes in flight where a thread keeps 4 pieces'.
// Every executor walks the same moves (RowMoves); only the one with slots makes bulk copies.
#pragma once

#include <cstdint>

#include "core/tile.hpp"

namespace mok::core {

// A bulk copy's most values: one slot of the fused executor's staging (16 KB).
constexpr int64_t kBulkValues = 8192;

// An executor's bulk copies, as seen by one part: slots() of them in the job, slot() the one this part holds (-1:
// none), copy(src, n, dst) moves n values through it (n a multiple of kPieceValues, src and dst on 16 bytes; done
// once the executor has flushed the slot at the job's end).
// NoBulk: an executor without them, whose parts move every row in pieces.
struct NoBulk {
  MOK_HD int slots() const { return 0; }
  MOK_HD int slot() const { return -1; }
  MOK_HD void copy(const bf16_t*, int64_t, bf16_t*) {}
};

MOK_HD constexpr bool unchanged(SameValue) {
  return true;
}
template <class Value>
MOK_HD constexpr bool unchanged(Value) {
  return false;
}

// How part `part` of a row job moves its rows. A row copied unchanged, of whole pieces on 16 bytes at both ends, goes
// as bulk copies of at most kBulkValues values: the job's copy c (counted over its rows in the job's order, alike on
// every part) by the part holding slot c mod slots. Any other row, or every row without slots, in move_part's pieces
// by every part.
template <class Bulk = NoBulk>
struct RowMoves {
  Part part;
  Bulk bulk{};
  int64_t copies = 0;  // the job's bulk copies in the rows before

  template <class Value>
  MOK_HD bool in_bulk(const bf16_t* src, int64_t n, const bf16_t* dst, Value value) const {
    return bulk.slots() > 0 && unchanged(value) && n % kPieceValues == 0 && on_piece(src) && on_piece(dst);
  }
  template <class Value>
  MOK_HD void row(const bf16_t* src, int64_t n, bf16_t* dst, Value value) {
    if (!in_bulk(src, n, dst, value)) return move_part(part, src, n, dst, value);
    for (int64_t first = 0; first < n; first += kBulkValues, ++copies)
      if (copies % bulk.slots() == bulk.slot())
        bulk.copy(src + first, n - first < kBulkValues ? n - first : kBulkValues, dst + first);
  }
};

// A slot's copies go through its staging a batch at a time: the loads of a batch land on one phase of the slot's
// barrier, so that a slot keeps its staging's bytes in flight however short the rows. A batch holds fewer than
// kBulkBatch copies and at most kBulkValues values. The executor's `Slot`:
//   int count()               the batch's copies
//   int64_t used()            the batch's values
//   void wait_read()          the slot's earlier stores have read its staging
//   void load(src, n, dst)    src's n values into the staging after the batch's, their bytes expected on the
//                             barrier's phase; dst noted for the store
//   bool land()               the batch's loads announced complete (the phase's arrival) and waited for; false when
//                             they did not land in time
//   void store()              each of the batch's copies out of the staging into its dst; the batch then empty
// A batch's first load must not overwrite what the slot's stores have yet to read, nor a store read before its load
// landed. False when a batch did not land in time: the slot is then lost to the job.
constexpr int kBulkBatch = 8;

MOK_HD constexpr bool batch_fits(int copies, int64_t values, int64_t n) {
  return copies < kBulkBatch && values + n <= kBulkValues;
}

template <class Slot>
MOK_HD bool bulk_flush(Slot& slot) {
  if (slot.count() == 0) return true;
  if (!slot.land()) return false;
  slot.store();
  return true;
}

template <class Slot>
MOK_HD bool bulk_copy(Slot& slot, const bf16_t* src, int64_t n, bf16_t* dst) {
  if (!batch_fits(slot.count(), slot.used(), n) && !bulk_flush(slot)) return false;
  if (slot.count() == 0) slot.wait_read();
  slot.load(src, n, dst);
  return true;
}

// The row jobs whose moves may copy in bulk (run_rows): only these need an executor's bulk copies set up.
MOK_HD constexpr bool copies_in_bulk(RowWork work) {
  return work == RowWork::pull || work == RowWork::push;
}

}  // namespace mok::core
