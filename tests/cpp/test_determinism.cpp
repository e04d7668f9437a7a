// Bitwise determinism: the same inputs give the same bits whatever the expert padding, minibatch
// and macrobatch (including a ring that wraps), the worker counts, and from run to run.
#include <tuple>
#include <type_traits>

#include "group.hpp"

using namespace mok_test;

namespace {

bool same(const Outputs& a, const Outputs& b) {
  return a.out == b.out && a.dx == b.dx && a.dw == b.dw && a.dgate == b.dgate && a.dup == b.dup && a.ddown == b.ddown &&
         a.dsgate == b.dsgate && a.dsup == b.dsup && a.dsdown == b.dsdown && a.dsrouter == b.dsrouter &&
         a.main_sgate == b.main_sgate && a.main_sup == b.main_sup && a.main_sdown == b.main_sdown &&
         a.main_srouter == b.main_srouter;
}

Knobs knobs(int padding, int minibatch, int macrobatch, int comm, int compute) {
  Knobs k;
  k.padding = padding;
  k.minibatch = minibatch;
  k.macrobatch = macrobatch;
  k.comm_workers = comm;
  k.compute_workers = compute;
  return k;
}

void check_bitwise(const Spec& spec, const std::vector<Knobs>& variants, int max_recv_rows) {
  std::mt19937_64 rng(seed() + 17);
  ref::Problem p = make_problem(spec, rng);
  Outputs first = run_layer(p, variants[0]);
  CHECK(all_ok(first));
  bool wrapped = false;
  for (const Knobs& k : variants) {
    wrapped |= k.macrobatch < max_recv_rows;
    for (int repeat = 0; repeat < 2; ++repeat) {
      Outputs o = run_layer(p, k);
      CHECK(all_ok(o));
      CHECK_MSG(same(first, o), "padding %d minibatch %d macrobatch %d workers %d+%d run %d differs", k.padding,
                k.minibatch, k.macrobatch, k.comm_workers, k.compute_workers, repeat);
    }
  }
  CHECK_MSG(wrapped, "no variant made the ring wrap");
}

}  // namespace

// 2 ranks x 16 tokens x top-2 into 2 x 2 experts: a rank receives about 32 rows plus padding, more
// than the 8- and 16-row rings below.
TEST(bf16_across_batching_workers_and_runs) {
  Spec s;
  s.world = 2;
  s.top_k = 2;
  s.max_tokens = 16;
  s.ragged = false;
  s.shared_inter = 8;
  check_bitwise(s,
                {knobs(8, 16, 64, 1, 2), knobs(8, 8, 8, 1, 1), knobs(4, 8, 16, 2, 3), knobs(16, 16, 32, 3, 4),
                 knobs(1, 1, 3, 1, 2), knobs(8, 32, 256, 2, 1)},
                32);
}

// The gated shared expert: dr sums dlogit_t x_t over the tokens in order, whatever the chunking (expert
// padding) and the workers that run the chunks.
TEST(bf16_gated_shared_expert_across_batching_workers_and_runs) {
  Spec s;
  s.world = 2;
  s.top_k = 2;
  s.max_tokens = 16;
  s.ragged = false;
  s.shared_inter = 8;
  s.gated = true;
  std::vector<Knobs> variants = {knobs(8, 16, 64, 1, 2), knobs(4, 8, 16, 2, 3), knobs(16, 16, 32, 3, 4),
                                 knobs(1, 1, 3, 1, 2)};
  // fp32 main_grad: the bf16 gradients would hide an fp32 sum taken in another order.
  for (Knobs& k : variants) k.accumulate = true;
  check_bitwise(s, variants, 32);
}

TEST(mxfp8_across_batching_workers_and_runs) {
  Spec s;
  s.world = 3;
  s.top_k = 2;
  s.hidden = 40;
  s.inter = 24;
  s.max_tokens = 24;
  s.routing = Routing::one_rank;  // one rank receives 3 x 24 x 2 = 144 rows
  s.mxfp8 = true;
  check_bitwise(
      s, {knobs(32, 32, 256, 1, 2), knobs(32, 32, 32, 1, 1), knobs(64, 64, 128, 2, 3), knobs(32, 64, 64, 3, 2)}, 144);
}

// The contract "the EP result on W ranks equals, bitwise, the single-process result on the
// concatenated tokens": one rank holding all experts and all tokens gives the same bits.
TEST(world3_equals_one_rank_on_concatenated_tokens) {
  std::mt19937_64 rng(seed() + 23);
  Spec s;
  s.world = 3;
  s.top_k = 3;
  s.routing = Routing::minus_one;
  ref::Problem p = make_problem(s, rng);
  ref::Problem one = p;
  one.world = 1;
  one.experts = p.world * p.experts;
  auto concat = [](const auto& per_rank) {
    typename std::decay_t<decltype(per_rank)> all(1);
    for (const auto& v : per_rank) all[0].insert(all[0].end(), v.begin(), v.end());
    return all;
  };
  one.tokens = {0};
  for (int t : p.tokens) one.tokens[0] += t;
  one.ids = concat(p.ids);
  one.topk_weights = concat(p.topk_weights);
  one.x = concat(p.x);
  one.dout = concat(p.dout);
  one.gate = concat(p.gate);
  one.up = concat(p.up);
  one.down = concat(p.down);
  Outputs ep = run_layer(p, Knobs{}), single = run_layer(one, Knobs{});
  CHECK(all_ok(ep) && all_ok(single));
  for (const auto& [name, a, b] :
       {std::tuple{"out", &ep.out, &single.out}, std::tuple{"dx", &ep.dx, &single.dx},
        std::tuple{"dgate", &ep.dgate, &single.dgate}, std::tuple{"dup", &ep.dup, &single.dup},
        std::tuple{"ddown", &ep.ddown, &single.ddown}})
    CHECK_MSG(concat(*a)[0] == (*b)[0], "%s differs", name);
  CHECK(concat(ep.dw)[0] == single.dw[0]);
}

MOK_TEST_MAIN
