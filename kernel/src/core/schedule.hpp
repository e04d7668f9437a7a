// The schedule: from every rank's topk ids, this rank's expert-major receive layout.
//
// Expert e's segment holds its routed (source rank, token, k) rows in canonical order (ascending
// source rank, token, k; -1 routes skipped), padded with empty rows to a multiple of expert_padding.
// Segments follow each other in expert order. The layout is sized for the worst case, so no routing
// is ever refused. Counting and placing are per expert, so a device runs one expert per thread.
#pragma once

#include <cstdint>

#include "core/shape.hpp"

namespace mok::core {

struct RowRef {
  int32_t rank;  // source (home) rank; -1 for a padding row
  int32_t token;
  int32_t k;
};

// Id i of the caller's topk ids, as given.
MOK_HD inline int64_t topk_id(const void* ids, bool int64_ids, int64_t i) {
  return int64_ids ? static_cast<const int64_t*>(ids)[i] : static_cast<const int32_t*>(ids)[i];
}

// An id routes to one of the group's experts, or nowhere (-1). api/ checks a host executor's ids before its call;
// a device executor's schedule build checks them on the device (the host does not read device memory).
MOK_HD inline bool valid_topk_id(const LayerShape& s, int64_t id) {
  return id >= -1 && id < static_cast<int64_t>(s.world) * s.experts_per_rank;
}

// Every rank's routing as this rank sees it (peer memory): ids[r] is int32 [tokens[r], K].
struct Routing {
  const int32_t* const* ids;
  const int32_t* tokens;
};

struct Schedule {
  int32_t* experts;    // [E_local][2]: routed rows, first row of the segment
  RowRef* rows;        // [max_recv_rows]
  int64_t total_rows;  // padded; a multiple of expert_padding
};

MOK_HD inline int32_t expert_count(const Schedule& s, int e) {
  return s.experts[2 * e];
}
MOK_HD inline int32_t expert_first(const Schedule& s, int e) {
  return s.experts[2 * e + 1];
}

// Expert e's segment: its routed rows padded to a multiple of the tile height.
MOK_HD inline int64_t segment_rows(const LayerShape& shape, const Schedule& s, int e) {
  return (static_cast<int64_t>(expert_count(s, e)) + shape.expert_padding - 1) / shape.expert_padding *
         shape.expert_padding;
}

// The padded total from the segments alone: what a device launch reads where the host never saw the schedule.
MOK_HD inline int64_t schedule_rows(const LayerShape& shape, const Schedule& s) {
  int last = shape.experts_per_rank - 1;
  return expert_first(s, last) + segment_rows(shape, s, last);
}

// Pass 1: how many rows local expert e receives.
MOK_HD inline int32_t count_expert(const LayerShape& shape, const Routing& routing, int e) {
  int32_t wanted = shape.rank * shape.experts_per_rank + e, n = 0;
  for (int r = 0; r < shape.world; ++r)
    for (int64_t i = 0, end = static_cast<int64_t>(routing.tokens[r]) * shape.top_k; i < end; ++i)
      n += routing.ids[r][i] == wanted;
  return n;
}

// Pass 2 (one thread): segment starts from the counts; returns the padded total.
MOK_HD inline int64_t lay_out_segments(const LayerShape& shape, Schedule& s) {
  int64_t at = 0;
  for (int e = 0; e < shape.experts_per_rank; ++e) {
    s.experts[2 * e + 1] = static_cast<int32_t>(at);
    at += segment_rows(shape, s, e);
  }
  s.total_rows = at;
  return at;
}

// Pass 3: expert e's rows in canonical order, then its padding rows.
MOK_HD inline void place_expert(const LayerShape& shape, const Routing& routing, Schedule& s, int e) {
  int32_t wanted = shape.rank * shape.experts_per_rank + e;
  int64_t at = expert_first(s, e);
  for (int r = 0; r < shape.world; ++r)
    for (int32_t t = 0; t < routing.tokens[r]; ++t)
      for (int k = 0; k < shape.top_k; ++k)
        if (routing.ids[r][static_cast<int64_t>(t) * shape.top_k + k] == wanted) s.rows[at++] = RowRef{r, t, k};
  int64_t end = expert_first(s, e) + segment_rows(shape, s, e);
  while (at < end) s.rows[at++] = RowRef{-1, -1, -1};
}

// The whole schedule on one thread (the host executor).
MOK_HD inline void build_schedule(const LayerShape& shape, const Routing& routing, Schedule& s) {
  for (int e = 0; e < shape.experts_per_rank; ++e) s.experts[2 * e] = count_expert(shape, routing, e);
  lay_out_segments(shape, s);
  for (int e = 0; e < shape.experts_per_rank; ++e) place_expert(shape, routing, s, e);
}

// The local expert that owns tile `tile` (tile = row / expert_padding).
MOK_HD inline int tile_expert(const LayerShape& shape, const Schedule& s, int64_t tile) {
  int64_t row = tile * shape.expert_padding;
  int e = 0;
  while (e + 1 < shape.experts_per_rank && expert_first(s, e + 1) <= row) ++e;
  return e;
}

// Routed (non-padding) rows of a tile: they come first, padding only ends a segment.
MOK_HD inline int tile_rows(const LayerShape& shape, const Schedule& s, int64_t tile, int e) {
  int64_t left = expert_first(s, e) + expert_count(s, e) - tile * shape.expert_padding;
  return static_cast<int>(left < shape.expert_padding ? left : shape.expert_padding);
}

// The local expert of schedule row `row`, or -1 for a padding row or one past the schedule's end (in no problem).
MOK_HD inline int routed_row_expert(const LayerShape& shape, const Schedule& s, int64_t row) {
  if (row >= s.total_rows) return -1;
  int64_t tile = row / shape.expert_padding;
  int e = tile_expert(shape, s, tile);
  return row - tile * shape.expert_padding < tile_rows(shape, s, tile, e) ? e : -1;
}

}  // namespace mok::core
