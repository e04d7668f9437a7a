// A random ragged routing and the schedule core builds from it, for the tests of what a split executor derives
// from a schedule (test_grouped_problems, test_split_plan): empty experts, padding, -1 routes, every row to one
// expert, and row-buffer periods other than the host executor's.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/grouped_problems.hpp"

namespace mok_test {

namespace core = mok::core;

struct RoutingCase {
  core::LayerShape s{};
  int tokens[4] = {0, 0, 0, 0};
  std::vector<std::vector<int32_t>> ids;  // per rank [tokens, K]
  std::vector<const int32_t*> id_ptrs;
  std::vector<int32_t> experts;
  std::vector<core::RowRef> rows;
  core::Schedule sched{};
  core::RowPeriods periods{};
};

inline int pick(std::mt19937_64& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

// A random shape and routing; `skewed` sends every route of this rank's experts to one of them.
inline void make_case(std::mt19937_64& rng, RoutingCase& c, bool skewed) {
  core::LayerShape& s = c.s;
  s.world = pick(rng, 1, 4);
  s.rank = pick(rng, 0, s.world - 1);
  s.experts_per_rank = pick(rng, 1, 6);
  s.hidden = pick(rng, 1, 9);
  s.intermediate = pick(rng, 1, 9);
  s.top_k = pick(rng, 1, 3);
  s.max_tokens = pick(rng, 1, 40);
  s.expert_padding = pick(rng, 1, 8);
  s.minibatch = s.expert_padding * pick(rng, 1, 3);
  s.macrobatch = s.minibatch * pick(rng, 1, 4);
  int experts = s.world * s.experts_per_rank;
  // Some local experts receive nothing: they are never drawn.
  std::vector<int> drawn;
  for (int e = 0; e < experts; ++e)
    if (e / s.experts_per_rank != s.rank || pick(rng, 0, 2) > 0) drawn.push_back(e);
  int only = s.rank * s.experts_per_rank + pick(rng, 0, s.experts_per_rank - 1);
  c.ids.assign(static_cast<size_t>(s.world), {});
  c.id_ptrs.clear();
  for (int r = 0; r < s.world; ++r) {
    c.tokens[r] = pick(rng, 0, s.max_tokens);
    auto& ids = c.ids[static_cast<size_t>(r)];
    for (int i = 0; i < c.tokens[r] * s.top_k; ++i) {
      int draw = pick(rng, -1, static_cast<int>(drawn.size()) - 1);  // -1: a skipped route
      ids.push_back(skewed ? only : (draw < 0 ? -1 : drawn[static_cast<size_t>(draw)]));
    }
    c.id_ptrs.push_back(ids.data());
  }
  c.experts.assign(static_cast<size_t>(2 * s.experts_per_rank), 0);
  c.rows.assign(static_cast<size_t>(core::max_recv_rows(s)), core::RowRef{-2, -2, -2});
  c.sched = core::Schedule{c.experts.data(), c.rows.data(), 0};
  core::build_schedule(s, core::Routing{c.id_ptrs.data(), c.tokens}, c.sched);
  // A split executor may size its row buffers otherwise: any period that holds a tile will do.
  c.periods = pick(rng, 0, 1) ? core::ring_periods(s)
                              : core::RowPeriods{s.expert_padding * static_cast<int64_t>(pick(rng, 1, 6)),
                                                 s.expert_padding * static_cast<int64_t>(pick(rng, 1, 6))};
}

// The local expert a routed row belongs to, from the routing itself (not from the segments).
inline int row_expert(const RoutingCase& c, const core::RowRef& r) {
  return c.ids[static_cast<size_t>(r.rank)][static_cast<size_t>(r.token * c.s.top_k + r.k)] -
         c.s.rank * c.s.experts_per_rank;
}

}  // namespace mok_test
