// core/grouped_problems.hpp against core's schedule, over random ragged routings (empty experts, padding,
// every row to one expert): for every GEMM kind and window, the problems cover each routed row of the window
// exactly once, in the schedule's canonical order, and no padding row; every element they address lies inside
// its buffer; and a GEMM run from the problem data alone (offsets, leading dims, majors: what a CUTLASS
// ptr-array grouped GEMM reads) equals the layer's math computed row by row from the RowRefs and the routing.
// Values are small integers, so every sum is exact in float and the comparison is exact.
#include <cstdint>
#include <random>
#include <vector>

#include "check.hpp"
#include "core/grouped_problems.hpp"
#include "random_schedule.hpp"

namespace core = mok::core;
using core::GroupedGemm;
using Case = mok_test::RoutingCase;
using mok_test::make_case;
using mok_test::row_expert;

namespace {

bool canonical_before(const core::RowRef& a, const core::RowRef& b) {
  if (a.rank != b.rank) return a.rank < b.rank;
  if (a.token != b.token) return a.token < b.token;
  return a.k < b.k;
}

// The schedule row at row q of a row buffer of `period` rows, for a window in one turn of it.
int64_t schedule_row(const core::RowWindow& w, int64_t period, int64_t q) {
  return w.row0 - w.row0 % period + q;
}

// The last element an operand [rows, depth] at `offset` reads (depth the K extent), plus one.
int64_t operand_end(int64_t offset, int64_t rows, int64_t depth, int64_t ld, bool k_major) {
  return k_major ? offset + (rows - 1) * ld + depth : offset + (depth - 1) * ld + rows;
}

struct Buffers {
  std::vector<float> a, b, c;
};

// D = A B^T for every problem, addressing the buffers only through the problem data, as CUTLASS does.
void run_problems(const core::GroupedLayout& l, const std::vector<core::GroupedProblem>& problems, Buffers& f) {
  for (const core::GroupedProblem& p : problems)
    for (int m = 0; m < p.m; ++m)
      for (int n = 0; n < p.n; ++n) {
        float sum = 0;
        for (int k = 0; k < p.k; ++k) {
          float a = f.a[static_cast<size_t>(p.a + (l.a_k_major ? m * l.lda + k : k * l.lda + m))];
          float b = f.b[static_cast<size_t>(p.b + (l.b_k_major ? n * l.ldb + k : k * l.ldb + n))];
          sum += a * b;
        }
        f.c[static_cast<size_t>(p.c + m * l.ldc + n)] = sum;
      }
}

// The layer's math for `kind` over the window, row by row from the RowRefs: buffers named as the layer
// names them (x, dy, g, u, h rows in the ring; weights [E, I, H] or [E, H, I]).
void reference(const Case& c, GroupedGemm kind, const core::RowWindow& w, Buffers& f) {
  const core::LayerShape& s = c.s;
  int64_t h = s.hidden, in = s.intermediate;
  for (int64_t r = w.row0; r < w.row0 + w.rows; ++r) {
    const core::RowRef& ref = c.rows[static_cast<size_t>(r)];
    if (ref.rank < 0) continue;  // padding: no product
    int64_t e = row_expert(c, ref), ring = r % c.periods.ring, out = r % c.periods.out;
    auto at = [&](std::vector<float>& v, int64_t i) -> float& { return v[static_cast<size_t>(i)]; };
    switch (kind) {
      case GroupedGemm::gate:
      case GroupedGemm::up:  // g[r][i] = sum_j x[r][j] W[e][i][j]
        for (int64_t i = 0; i < in; ++i) {
          float sum = 0;
          for (int64_t j = 0; j < h; ++j) sum += at(f.a, ring * h + j) * at(f.b, (e * in + i) * h + j);
          at(f.c, ring * in + i) = sum;
        }
        break;
      case GroupedGemm::down:  // y[r][j] = sum_i h[r][i] W_down[e][j][i]
        for (int64_t j = 0; j < h; ++j) {
          float sum = 0;
          for (int64_t i = 0; i < in; ++i) sum += at(f.a, ring * in + i) * at(f.b, (e * h + j) * in + i);
          at(f.c, out * h + j) = sum;
        }
        break;
      case GroupedGemm::dgrad_h:  // dh[r][i] = sum_j dy[r][j] W_down[e][j][i]
        for (int64_t i = 0; i < in; ++i) {
          float sum = 0;
          for (int64_t j = 0; j < h; ++j) sum += at(f.a, ring * h + j) * at(f.b, (e * h + j) * in + i);
          at(f.c, ring * in + i) = sum;
        }
        break;
      case GroupedGemm::dgrad_x_gate:
      case GroupedGemm::dgrad_x_up:  // dx[r][j] = sum_i dg[r][i] W_gate[e][i][j]
        for (int64_t j = 0; j < h; ++j) {
          float sum = 0;
          for (int64_t i = 0; i < in; ++i) sum += at(f.a, ring * in + i) * at(f.b, (e * in + i) * h + j);
          at(f.c, out * h + j) = sum;
        }
        break;
      case GroupedGemm::wgrad_down:  // dW_down[e][j][i] += dy[r][j] h[r][i]
        for (int64_t j = 0; j < h; ++j)
          for (int64_t i = 0; i < in; ++i)
            at(f.c, (e * h + j) * in + i) += at(f.a, ring * h + j) * at(f.b, ring * in + i);
        break;
      case GroupedGemm::wgrad_gate:
      case GroupedGemm::wgrad_up:  // dW_gate[e][i][j] += dg[r][i] x[r][j]
        for (int64_t i = 0; i < in; ++i)
          for (int64_t j = 0; j < h; ++j)
            at(f.c, (e * in + i) * h + j) += at(f.a, ring * in + i) * at(f.b, ring * h + j);
        break;
      case GroupedGemm::count: break;
    }
  }
}

// The schedule rows a problem covers, from its data alone: its A (or, in a weight gradient, its K rows).
core::RowWindow covered_rows(const core::GroupedProblem& p, const core::GroupedLayout& l, GroupedGemm kind,
                             const core::RowWindow& w, int64_t period) {
  int64_t rows = core::is_wgrad(kind) ? p.k : p.m;
  return core::RowWindow{schedule_row(w, period, p.a / l.lda), rows};
}

// One kind over one window: coverage, order, bounds, and the products.
void check_window(std::mt19937_64& rng, const Case& c, GroupedGemm kind, const core::RowWindow& w) {
  const core::LayerShape& s = c.s;
  core::GroupedLayout l = core::grouped_layout(s, kind);
  core::GroupedBuffers sizes = core::grouped_buffers(s, kind, c.periods);
  std::vector<core::GroupedProblem> problems(static_cast<size_t>(s.experts_per_rank));
  core::grouped_problems(s, c.sched, kind, c.periods, w, problems.data());
  std::vector<int> cover(static_cast<size_t>(w.rows), 0);
  int before = mok_test::failures().load();
  for (int e = 0; e < s.experts_per_rank; ++e) {
    const core::GroupedProblem& p = problems[static_cast<size_t>(e)];
    if (p.m == 0 || p.n == 0 || p.k == 0) {
      CHECK_MSG(p.m == 0 && p.n == 0 && p.k == 0 && p.a == 0 && p.b == 0 && p.c == 0,
                "kind %d expert %d: an empty problem is (0, 0, 0) at offset 0", static_cast<int>(kind), e);
      continue;
    }
    // In bounds: the last element of each operand lies inside its buffer.
    int64_t depth = p.k;
    CHECK_MSG(p.a >= 0 && operand_end(p.a, p.m, depth, l.lda, l.a_k_major) <= sizes.a, "kind %d expert %d: A",
              static_cast<int>(kind), e);
    CHECK_MSG(p.b >= 0 && operand_end(p.b, p.n, depth, l.ldb, l.b_k_major) <= sizes.b, "kind %d expert %d: B",
              static_cast<int>(kind), e);
    CHECK_MSG(p.c >= 0 && p.c + (p.m - 1) * l.ldc + p.n <= sizes.c, "kind %d expert %d: C", static_cast<int>(kind), e);
    // The rows it covers: inside the window, this expert's, routed, in canonical order.
    core::RowWindow rows = covered_rows(p, l, kind, w, c.periods.ring);
    CHECK_MSG(p.a % l.lda == 0 && rows.row0 >= w.row0 && rows.row0 + rows.rows <= w.row0 + w.rows,
              "kind %d expert %d: rows [%lld, +%lld) outside the window [%lld, +%lld)", static_cast<int>(kind), e,
              static_cast<long long>(rows.row0), static_cast<long long>(rows.rows), static_cast<long long>(w.row0),
              static_cast<long long>(w.rows));
    for (int64_t r = rows.row0; r < rows.row0 + rows.rows && r >= w.row0 && r < w.row0 + w.rows; ++r) {
      const core::RowRef& ref = c.rows[static_cast<size_t>(r)];
      ++cover[static_cast<size_t>(r - w.row0)];
      CHECK_MSG(ref.rank >= 0 && row_expert(c, ref) == e, "kind %d expert %d: row %lld is padding or another's",
                static_cast<int>(kind), e, static_cast<long long>(r));
      if (r > rows.row0) CHECK(canonical_before(c.rows[static_cast<size_t>(r - 1)], ref));
    }
  }
  for (int64_t r = w.row0; r < w.row0 + w.rows; ++r) {
    bool routed = c.rows[static_cast<size_t>(r)].rank >= 0;
    CHECK_MSG(cover[static_cast<size_t>(r - w.row0)] == (routed ? 1 : 0), "kind %d: row %lld (%s) covered %d times",
              static_cast<int>(kind), static_cast<long long>(r), routed ? "routed" : "padding",
              cover[static_cast<size_t>(r - w.row0)]);
  }
  if (mok_test::failures().load() != before) return;  // an operand out of bounds: running it would too
  // The products: buffers of small random integers (exact in float); C starts as a sentinel (uncovered
  // rows must keep it) in the forward and dgrad kinds, as zero in the weight gradients (which sum over rows).
  Buffers got, want;
  std::uniform_int_distribution<int> value(-4, 4);
  got.a.resize(static_cast<size_t>(sizes.a));
  got.b.resize(static_cast<size_t>(sizes.b));
  for (float& v : got.a) v = static_cast<float>(value(rng));
  for (float& v : got.b) v = static_cast<float>(value(rng));
  got.c.assign(static_cast<size_t>(sizes.c), core::is_wgrad(kind) ? 0.0f : 1e9f);
  want = got;
  run_problems(l, problems, got);
  reference(c, kind, w, want);
  size_t wrong = 0;
  for (size_t i = 0; i < got.c.size(); ++i) wrong += got.c[i] != want.c[i];
  CHECK_MSG(wrong == 0, "kind %d window [%lld, +%lld): %zu of %zu output elements differ", static_cast<int>(kind),
            static_cast<long long>(w.row0), static_cast<long long>(w.rows), wrong, got.c.size());
}

// The windows a split executor runs: each turn of the row buffers the kind touches, over all rows.
std::vector<core::RowWindow> turns(const Case& c, GroupedGemm kind) {
  std::vector<core::RowWindow> all;
  for (int64_t r = 0; r < c.sched.total_rows;) {
    int64_t n = core::rows_in_turn(kind, c.periods, r), left = c.sched.total_rows - r;
    all.push_back(core::RowWindow{r, n < left ? n : left});
    r += all.back().rows;
  }
  return all;
}

void check_case(std::mt19937_64& rng, const Case& c) {
  for (int k = 0; k < static_cast<int>(GroupedGemm::count); ++k) {
    GroupedGemm kind = static_cast<GroupedGemm>(k);
    for (const core::RowWindow& w : turns(c, kind)) {
      CHECK(core::window_fits(kind, c.periods, w));
      check_window(rng, c, kind, w);
    }
    // A random window inside one turn (a minibatch, a tile, a few rows: a pass may run any of them).
    int64_t total = c.sched.total_rows;
    if (total == 0) continue;
    int64_t row0 = std::uniform_int_distribution<int64_t>(0, total - 1)(rng);
    int64_t room = core::rows_in_turn(kind, c.periods, row0);
    room = room < total - row0 ? room : total - row0;
    core::RowWindow w{row0, std::uniform_int_distribution<int64_t>(1, room)(rng)};
    CHECK(core::window_fits(kind, c.periods, w));
    check_window(rng, c, kind, w);
  }
}

TEST(problems_cover_every_routed_row_once_in_canonical_order) {
  std::mt19937_64 rng(mok_test::seed());
  for (int trial = 0; trial < 300; ++trial) {
    Case c;
    make_case(rng, c, false);
    check_case(rng, c);
  }
}

TEST(one_expert_takes_every_row) {
  std::mt19937_64 rng(mok_test::seed() + 1);
  for (int trial = 0; trial < 60; ++trial) {
    Case c;
    make_case(rng, c, true);
    check_case(rng, c);
  }
}

// The empty window and a window of only padding give no work at all.
TEST(empty_experts_and_padding_give_empty_problems) {
  std::mt19937_64 rng(mok_test::seed() + 2);
  for (int trial = 0; trial < 200; ++trial) {
    Case c;
    make_case(rng, c, false);
    for (int e = 0; e < c.s.experts_per_rank; ++e) {
      int64_t first = core::expert_first(c.sched, e), count = core::expert_count(c.sched, e);
      int64_t padded = (count + c.s.expert_padding - 1) / c.s.expert_padding * c.s.expert_padding;
      // The expert's padding rows alone (a window in one turn of the ring; and the empty window).
      core::RowWindow pad{first + count, padded - count}, none{first, 0};
      for (const core::RowWindow& w : {pad, none}) {
        if (!core::fits_one_turn(w, c.periods.ring)) continue;
        for (int k = 0; k < static_cast<int>(GroupedGemm::count); ++k) {
          core::GroupedProblem p = core::grouped_problem(c.s, c.sched, static_cast<GroupedGemm>(k), c.periods, w, e);
          CHECK(p.m == 0 && p.n == 0 && p.k == 0);
        }
      }
    }
  }
}

}  // namespace

MOK_TEST_MAIN
