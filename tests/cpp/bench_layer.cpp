// Host-executor timing (not a test): bench_layer [world] [experts/rank] [H] [I] [tokens/rank] [K]
// [comm] [compute] [mxfp8]. Prints the slowest rank's forward and backward wall time.
#include <algorithm>

#include "group.hpp"

using namespace mok_test;

int main(int argc, char** argv) {
  auto arg = [&](int i, int fallback) { return argc > i ? std::atoi(argv[i]) : fallback; };
  Spec s;
  s.world = arg(1, 8);
  s.experts = arg(2, 2);
  s.hidden = arg(3, 128);
  s.inter = arg(4, 64);
  s.max_tokens = arg(5, 64);
  s.top_k = arg(6, 2);
  s.ragged = false;
  s.mxfp8 = arg(9, 0) != 0;
  Knobs k;
  k.comm_workers = arg(7, 1);
  k.compute_workers = arg(8, 1);
  k.padding = k.minibatch = 32;
  k.macrobatch = 128;
  std::mt19937_64 rng(seed());
  ref::Problem p = make_problem(s, rng);
  for (int run = 0; run < 3; ++run) {
    Outputs o = run_layer(p, k);
    if (!all_ok(o)) return 1;
    double f = *std::max_element(o.forward_ms.begin(), o.forward_ms.end());
    double b = *std::max_element(o.backward_ms.begin(), o.backward_ms.end());
    double rows = static_cast<double>(s.world) * s.max_tokens * s.top_k;
    double flops = 6.0 * rows * s.hidden * s.inter;  // gate, up, down: 2 flops per multiply-add
    std::printf("W=%d E=%d H=%d I=%d T=%d K=%d workers=%d+%d %s: forward %.1f ms (%.2f GFLOP/s), backward %.1f ms\n",
                s.world, s.experts, s.hidden, s.inter, s.max_tokens, s.top_k, k.comm_workers, k.compute_workers,
                s.mxfp8 ? "mxfp8" : "bf16", f, flops / f * 1e-6, b);
  }
  return 0;
}
