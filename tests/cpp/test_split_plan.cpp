// core/split_plan.hpp against core's schedule, over random ragged routings and row-buffer periods: the plan's
// launches, run in stream order over the rows each one covers (the grouped problems' rows for a GEMM, the
// window's routed rows otherwise), give every routed row each of its pass's stages exactly once, each after
// the stages it reads and while the ring and output-ring rows it reads still hold that row; every GEMM window
// lies in one turn of its buffers; the shared expert, the closing barrier and the home sums come where the
// pass needs them. The plan is a pure function of the shape: one plan serves every routing below. And a launch's
// count of the schedule's rows, from the segments alone, is the schedule's.
#include <cstdint>
#include <random>
#include <vector>

#include "check.hpp"
#include "core/split_plan.hpp"
#include "random_schedule.hpp"

namespace core = mok::core;
using core::GroupedGemm;
using core::PassKind;
using core::SplitStep;
using Case = mok_test::RoutingCase;
using mok_test::make_case;

namespace {

// What a row has been given so far, one bit per value a launch produces.
enum Produced : uint32_t {
  kX = 1,
  kDy = 2,
  kG = 4,
  kU = 8,
  kH = 16,
  kDh = 32,
  kDg = 64,
  kDu = 128,
  kOutFirst = 256,  // y (forward), dx's dg W_gate term (backward)
  kOutDone = 512,   // y, or dx with both terms
  kCombined = 1024,
  kWDown = 2048,
  kWGate = 4096,
  kWUp = 8192,
  kBias = 16384,  // the row's dy, dg, du added to the bias gradients' sums
};

struct Row {
  uint32_t has = 0;
  int combines = 0, wgrads = 0;
};

// The shared expert's values (core/split_shared.hpp): one window of every token, so one set of bits.
enum SharedProduced : uint32_t {
  kSchedule = 1,
  kSg = 2,
  kSu = 4,
  kSh = 8,
  kSOut = 16,   // the forward's output (also the gated backward's, which ds reads)
  kSGate = 32,  // the gated backward's scaled dout and dlogit
  kSDh = 64,
  kSDgDu = 128,   // dg, du in place of g, u
  kSFirst = 256,  // dx's first term
  kSDx = 512,
  kSGateDx = 1024,
  kSRouter = 2048,
  kSWDown = 4096,
  kSWGate = 8192,
  kSWUp = 16384,
};

// The shared expert's launches in stream order: each after what it reads, each once; g and u not rebuilt once
// the SwiGLU backward has put dg and du in their place; the output read by the gate before dx overwrites it.
struct SharedSim {
  bool backward, gated;
  uint32_t has = 0;

  void step(uint32_t needs, uint32_t gives, const char* what) {
    CHECK_MSG((has & needs) == needs, "shared %s before its inputs (has 0x%x, needs 0x%x)", what, has, needs);
    CHECK_MSG((has & gives) == 0, "shared %s twice", what);
    has |= gives;
  }
  void gemm(GroupedGemm g) {
    uint32_t dout = gated ? static_cast<uint32_t>(kSGate) : 0u;  // dh and dW_down read the gated one's scaled dout
    switch (g) {
      case GroupedGemm::gate: step(kSchedule, kSg, "gate"); break;
      case GroupedGemm::up: step(kSchedule, kSu, "up"); break;
      case GroupedGemm::down: step(kSh, kSOut, "down"); break;
      case GroupedGemm::dgrad_h: step(kSchedule | dout, kSDh, "dgrad_h"); break;
      case GroupedGemm::dgrad_x_gate: step(kSDgDu, kSFirst, "dgrad_x_gate"); break;
      case GroupedGemm::dgrad_x_up: step(kSDgDu | kSFirst | dout, kSDx, "dgrad_x_up"); break;
      case GroupedGemm::wgrad_down: step(kSh | dout, kSWDown, "wgrad_down"); break;
      case GroupedGemm::wgrad_gate: step(kSDgDu, kSWGate, "wgrad_gate"); break;
      case GroupedGemm::wgrad_up: step(kSDgDu, kSWUp, "wgrad_up"); break;
      case GroupedGemm::count: CHECK_MSG(false, "a shared gemm launch without a GEMM"); break;
    }
  }
  void row_step(SplitStep st) {
    switch (st) {
      case SplitStep::shared_schedule: step(0, kSchedule, "schedule"); break;
      case SplitStep::shared_swiglu: step(kSg | kSu, kSh, "swiglu"); break;
      case SplitStep::shared_swiglu_backward: step(kSg | kSu | kSh | kSDh, kSDgDu, "swiglu_backward"); break;
      case SplitStep::shared_gate_backward: step(kSOut, kSGate, "gate_backward"); break;
      case SplitStep::shared_gate_dx: step(kSDx | kSGate, kSGateDx, "gate_dx"); break;
      case SplitStep::shared_router_gradient: step(kSGate, kSRouter, "router_gradient"); break;
      default: CHECK_MSG(false, "step %s is not a shared step", core::split_step_name(st)); break;
    }
  }
  // What the home sums read, and (backward) every gradient.
  uint32_t done() const {
    if (!backward) return kSOut;
    return kSDx | kSWDown | kSWGate | kSWUp | (gated ? kSGateDx | kSRouter : 0);
  }
};

struct Sim {
  const Case& c;
  PassKind kind;
  std::vector<Row> rows;
  std::vector<int64_t> ring_holder, out_holder;  // the schedule row each buffer row holds, -1 none
  bool barrier = false, sums = false;
  SharedSim shared;
  // A bf16-gradient backward: its sums zeroed before any weight-gradient product and written out after the last.
  bool bf16_gradients, bias_gradients, own_sums;  // own_sums: the executor's sums, zeroed first and written last
  uint8_t biases;
  const core::SplitLaunch* unbiased = nullptr;  // a GEMM with a bias, waiting for its add_bias step
  int zeroed = 0, written = 0, wgrads = 0;
  // MXFP8: a GEMM over dequantised operands (core::split_dequantises) right after its own dequantise step
  bool block_scaled;
  const core::SplitLaunch* dequantised = nullptr;

  Sim(const Case& cs, PassKind k, const core::SplitCall& call)
      : c(cs),
        kind(k),
        rows(static_cast<size_t>(cs.sched.total_rows)),
        ring_holder(static_cast<size_t>(cs.periods.ring), -1),
        out_holder(static_cast<size_t>(cs.periods.out), -1),
        shared{core::is_backward(k), call.gated},
        bf16_gradients(core::is_backward(k) && call.bf16_gradients),
        bias_gradients(core::is_backward(k) && call.bias_gradients),
        own_sums(bf16_gradients || bias_gradients),
        biases(call.biases),
        block_scaled(call.block_scaled) {}

  // A gradient's product goes into the sums: zeroed first (the executor's own), not yet written out.
  void into_sums(const char* what) {
    ++wgrads;
    CHECK_MSG(!own_sums || (zeroed == 1 && written == 0), "%s with the sums zeroed %d times, written %d", what, zeroed,
              written);
  }
  // What a backward's routed row must have before it leaves the ring, and at the pass's end.
  uint32_t backward_done() const { return kWDown | kWGate | kWUp | (bias_gradients ? kBias : 0u); }

  // Every weight gradient's products are in: each routed row's three and the shared expert's.
  bool all_wgrads_in() const {
    for (int64_t r = 0; r < c.sched.total_rows; ++r)
      if (routed(r) && (rows[static_cast<size_t>(r)].has & backward_done()) != backward_done()) return false;
    uint32_t shared_wgrads = kSWDown | kSWGate | kSWUp | (shared.gated ? static_cast<uint32_t>(kSRouter) : 0u);
    return c.s.shared_intermediate == 0 || (shared.has & shared_wgrads) == shared_wgrads;
  }

  bool routed(int64_t r) const { return r < c.sched.total_rows && c.rows[static_cast<size_t>(r)].rank >= 0; }

  // A row may leave the ring once every stage of its pass that reads the ring is done.
  bool finished_in_ring(int64_t r) const {
    const Row& row = rows[static_cast<size_t>(r)];
    if (!core::is_backward(kind)) return (row.has & kOutDone) != 0;
    return (row.has & (backward_done() | kOutDone)) == (backward_done() | kOutDone);
  }

  void need(int64_t r, uint32_t bits, const char* what) {
    Row& row = rows[static_cast<size_t>(r)];
    CHECK_MSG((row.has & bits) == bits, "%s of row %lld before its inputs (has 0x%x, needs 0x%x)", what,
              static_cast<long long>(r), row.has, bits);
    CHECK_MSG(ring_holder[static_cast<size_t>(r % c.periods.ring)] == r, "%s of row %lld: its ring row holds %lld",
              what, static_cast<long long>(r),
              static_cast<long long>(ring_holder[static_cast<size_t>(r % c.periods.ring)]));
  }

  void give(int64_t r, uint32_t bits, const char* what) {
    Row& row = rows[static_cast<size_t>(r)];
    CHECK_MSG((row.has & bits) == 0, "%s given twice to row %lld", what, static_cast<long long>(r));
    row.has |= bits;
  }

  void dispatch(int64_t r) {
    int64_t& holder = ring_holder[static_cast<size_t>(r % c.periods.ring)];
    CHECK_MSG(holder < 0 || holder == r || finished_in_ring(holder), "dispatch of row %lld overwrites row %lld",
              static_cast<long long>(r), static_cast<long long>(holder));
    if (kind == PassKind::backward_kept) {
      CHECK_MSG(holder == r, "a kept backward's row %lld is no longer in the ring", static_cast<long long>(r));
      give(r, kDy, "dy");
      return;
    }
    holder = r;
    give(r, core::is_backward(kind) ? kX | kDy : kX, "x");
  }

  // The GEMM's rows into the output ring: its first writer takes the buffer row, the second adds to it.
  void out_gemm(int64_t r, uint32_t reads, bool second, const char* what) {
    need(r, reads, what);
    int64_t& holder = out_holder[static_cast<size_t>(r % c.periods.out)];
    if (second) {
      CHECK_MSG(holder == r, "%s of row %lld: its output row holds %lld", what, static_cast<long long>(r),
                static_cast<long long>(holder));
      need(r, kOutFirst, what);
      give(r, kOutDone, what);
      return;
    }
    CHECK_MSG(holder < 0 || (rows[static_cast<size_t>(holder)].has & kCombined), "%s of row %lld overwrites row %lld",
              what, static_cast<long long>(r), static_cast<long long>(holder));
    holder = r;
    give(r, core::is_backward(kind) ? kOutFirst : kOutFirst | kOutDone, what);
  }

  void gemm(GroupedGemm g, int64_t r) {
    switch (g) {
      case GroupedGemm::gate: need(r, kX, "gate"), give(r, kG, "g"); break;
      case GroupedGemm::up: need(r, kX, "up"), give(r, kU, "u"); break;
      case GroupedGemm::down: out_gemm(r, kH, false, "down"); break;
      case GroupedGemm::dgrad_h: need(r, kDy, "dgrad_h"), give(r, kDh, "dh"); break;
      case GroupedGemm::dgrad_x_gate: out_gemm(r, kDg, false, "dgrad_x_gate"); break;
      case GroupedGemm::dgrad_x_up: out_gemm(r, kDu, true, "dgrad_x_up"); break;
      case GroupedGemm::wgrad_down: need(r, kDy | kH, "wgrad_down"), give(r, kWDown, "wgrad_down"); break;
      case GroupedGemm::wgrad_gate: need(r, kDg | kX, "wgrad_gate"), give(r, kWGate, "wgrad_gate"); break;
      case GroupedGemm::wgrad_up: need(r, kDu | kX, "wgrad_up"), give(r, kWUp, "wgrad_up"); break;
      case GroupedGemm::count: CHECK_MSG(false, "a gemm launch without a GEMM"); break;
    }
  }

  void combine(int64_t r) {
    Row& row = rows[static_cast<size_t>(r)];
    CHECK_MSG(row.has & kOutDone, "combine of row %lld before its output is done", static_cast<long long>(r));
    CHECK_MSG(out_holder[static_cast<size_t>(r % c.periods.out)] == r, "combine of row %lld: its output row holds %lld",
              static_cast<long long>(r), static_cast<long long>(out_holder[static_cast<size_t>(r % c.periods.out)]));
    row.has |= kCombined;
    ++row.combines;
  }

  void row_step(SplitStep step, int64_t r) {
    switch (step) {
      case SplitStep::dispatch: dispatch(r); break;
      case SplitStep::swiglu: need(r, kG | kU, "swiglu"), give(r, kH, "h"); break;
      case SplitStep::swiglu_backward: need(r, kDh | kG | kU, "swiglu_backward"), give(r, kDg | kDu | kH, "dg"); break;
      case SplitStep::bias_gradients: need(r, kDy | kDg | kDu, "bias_gradients"), give(r, kBias, "bias sums"); break;
      case SplitStep::combine: combine(r); break;
      default: CHECK_MSG(false, "step %s is not a row step", core::split_step_name(step)); break;
    }
  }

  void launch(const core::SplitLaunch& l) {
    CHECK_MSG(!barrier || l.step == SplitStep::home_sums, "%s after the closing barrier",
              core::split_step_name(l.step));
    const core::SplitLaunch* before = dequantised;
    dequantised = l.step == SplitStep::dequantise ? &l : nullptr;
    bool routed_gemm = l.step == SplitStep::gemm && !l.shared;
    bool follows = before && routed_gemm && before->gemm == l.gemm && before->window.row0 == l.window.row0 &&
                   before->window.rows == l.window.rows;
    CHECK_MSG(!before || follows, "a dequantise step followed by %s, not its own GEMM", core::split_step_name(l.step));
    if (routed_gemm)
      CHECK_MSG(
          core::split_dequantises(c.s, l.gemm, block_scaled, (biases & core::split_bias_bit(l.gemm)) != 0) == follows,
          "gemm %d over [%lld, +%lld) %s", static_cast<int>(l.gemm), static_cast<long long>(l.window.row0),
          static_cast<long long>(l.window.rows),
          follows ? "after a dequantise step it does not read" : "without its dequantise step right before it");
    if (l.step == SplitStep::dequantise) return;
    // A GEMM with a bias is followed at once by its add_bias step, and an add_bias step follows only such a GEMM.
    const core::SplitLaunch* pending = unbiased;
    unbiased = routed_gemm && (biases & core::split_bias_bit(l.gemm)) ? &l : nullptr;
    bool adds = l.step == SplitStep::add_bias;
    CHECK_MSG(!pending || (adds && pending->gemm == l.gemm && pending->window.row0 == l.window.row0 &&
                           pending->window.rows == l.window.rows),
              "GEMM %d with a bias followed by %s, not its add_bias step",
              pending ? static_cast<int>(pending->gemm) : -1, core::split_step_name(l.step));
    CHECK_MSG(!adds || pending, "an add_bias step after a GEMM without a bias");
    if (adds) return;
    if (l.step == SplitStep::bias_gradients) {
      CHECK_MSG(bias_gradients, "a bias_gradients step without bias gradients");
      into_sums("a bias gradient");
    }
    CHECK_MSG(!l.shared || l.step == SplitStep::gemm, "a %s launch marked shared", core::split_step_name(l.step));
    switch (l.step) {
      case SplitStep::shared_schedule:
      case SplitStep::shared_swiglu:
      case SplitStep::shared_swiglu_backward:
      case SplitStep::shared_gate_backward:
      case SplitStep::shared_gate_dx:
      case SplitStep::shared_router_gradient:
        if (l.step == SplitStep::shared_router_gradient) into_sums("the router's gradient");
        shared.row_step(l.step);
        return;
      case SplitStep::zero_gradients:
        CHECK_MSG(own_sums && zeroed == 0 && wgrads == 0, "zero_gradients %s",
                  own_sums ? "twice or after a gradient's product" : "without the executor's own sums");
        ++zeroed;
        return;
      case SplitStep::write_gradients:
        CHECK_MSG(own_sums && zeroed == 1 && written == 0 && all_wgrads_in(),
                  "write_gradients before every product is in, twice, or without the executor's own sums");
        ++written;
        return;
      case SplitStep::barrier:
        CHECK_MSG(written == (own_sums ? 1 : 0), "the barrier with the gradients written %d times", written);
        for (int64_t r = 0; r < c.sched.total_rows; ++r)
          if (routed(r))
            CHECK_MSG(rows[static_cast<size_t>(r)].combines == 1, "barrier before row %lld is home",
                      static_cast<long long>(r));
        barrier = true;
        return;
      case SplitStep::home_sums:
        CHECK_MSG(barrier && !sums, "home sums before the barrier, or twice");
        CHECK_MSG(c.s.shared_intermediate == 0 || (shared.has & shared.done()) == shared.done(),
                  "home sums before the shared expert's 0x%x (has 0x%x)", shared.done(), shared.has);
        sums = true;
        return;
      case SplitStep::gemm:
        if (core::is_wgrad(l.gemm)) into_sums(l.shared ? "a shared weight gradient" : "a weight gradient");
        l.shared ? shared.gemm(l.gemm) : gemm_launch(l);
        return;
      default:
        for (int64_t r = l.window.row0; r < l.window.row0 + l.window.rows; ++r)
          if (routed(r)) row_step(l.step, r);
    }
  }

  // A GEMM covers what its problems say, from core's problem data, not the window.
  void gemm_launch(const core::SplitLaunch& l) {
    CHECK_MSG(core::window_fits(l.gemm, c.periods, l.window), "gemm %d window [%lld, +%lld) crosses a buffer's turn",
              static_cast<int>(l.gemm), static_cast<long long>(l.window.row0), static_cast<long long>(l.window.rows));
    for (int e = 0; e < c.s.experts_per_rank; ++e) {
      core::ExpertRows er = core::window_rows(c.sched, e, l.window);
      for (int64_t r = er.first; r < er.first + er.rows; ++r)
        if (routed(r)) gemm(l.gemm, r);
    }
  }

  void finish() {
    uint32_t all = core::is_backward(kind) ? backward_done() | kCombined : kCombined;
    for (int64_t r = 0; r < c.sched.total_rows; ++r) {
      if (!routed(r)) continue;
      const Row& row = rows[static_cast<size_t>(r)];
      CHECK_MSG((row.has & all) == all && row.combines == 1, "row %lld ends with 0x%x, combined %d times",
                static_cast<long long>(r), row.has, row.combines);
    }
    CHECK_MSG(barrier, "no closing barrier");
    CHECK_MSG(sums == (kind != PassKind::recompute), "home sums %s", sums ? "in a recompute" : "missing");
    uint32_t want = c.s.shared_intermediate > 0 && kind != PassKind::recompute ? shared.done() : 0;
    CHECK_MSG((shared.has & want) == want && (want != 0 || shared.has == 0), "the shared expert gave 0x%x, not 0x%x",
              shared.has, want);
  }
};

// A kept backward starts where the forward left the ring: every row's x, g and u in place.
void keep_forward(Sim& sim) {
  for (int64_t r = 0; r < sim.c.sched.total_rows; ++r) {
    sim.ring_holder[static_cast<size_t>(r % sim.c.periods.ring)] = r;
    sim.rows[static_cast<size_t>(r)].has = kX | kG | kU;
  }
}

std::vector<core::SplitLaunch> plan_of(const core::LayerShape& s, PassKind kind, const core::RowPeriods& p,
                                       const core::SplitCall& call = {}) {
  int64_t n = core::split_plan(s, kind, p, call, nullptr);
  std::vector<core::SplitLaunch> plan(static_cast<size_t>(n > 0 ? n : 0));
  if (n > 0) CHECK(core::split_plan(s, kind, p, call, plan.data()) == n);
  return plan;
}

void check_pass(const Case& c, PassKind kind, const core::SplitCall& call) {
  std::vector<core::SplitLaunch> plan = plan_of(c.s, kind, c.periods, call);
  if (kind == PassKind::backward_kept && !core::split_keeps_ring(c.s, c.periods)) {
    CHECK_MSG(core::split_plan(c.s, kind, c.periods, call, nullptr) == -1,
              "a kept backward planned over a turning ring");
    return;
  }
  CHECK(!plan.empty());
  Sim sim(c, kind, call);
  if (kind == PassKind::backward_kept) keep_forward(sim);
  for (const core::SplitLaunch& l : plan) {
    CHECK_MSG(l.window.row0 >= 0 && l.window.rows >= 0 && l.window.row0 + l.window.rows <= core::max_recv_rows(c.s),
              "%s window [%lld, +%lld) outside the worst-case rows", core::split_step_name(l.step),
              static_cast<long long>(l.window.row0), static_cast<long long>(l.window.rows));
    sim.launch(l);
  }
  sim.finish();
}

void check_cases(uint64_t seed, int trials, bool skewed) {
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < trials; ++trial) {
    Case c;
    make_case(rng, c, skewed);
    c.s.shared_intermediate = mok_test::pick(rng, 0, 1) * 8;
    core::SplitCall call{mok_test::pick(rng, 0, 1) == 1, mok_test::pick(rng, 0, 1) == 1, mok_test::pick(rng, 0, 1) == 1,
                         static_cast<uint8_t>(mok_test::pick(rng, 0, 7)), mok_test::pick(rng, 0, 1) == 1};
    c.s.mxfp8 = mok_test::pick(rng, 0, 1);  // the plan's dequantise steps (the shape's other MXFP8 rules do not matter)
    int before = mok_test::failures().load();
    // A launch counts the schedule's rows from its segments (the host never reads them).
    CHECK_MSG(core::schedule_rows(c.s, c.sched) == c.sched.total_rows, "segments give %lld rows, the schedule %lld",
              static_cast<long long>(core::schedule_rows(c.s, c.sched)), static_cast<long long>(c.sched.total_rows));
    for (PassKind kind : {PassKind::forward, PassKind::recompute, PassKind::backward, PassKind::backward_kept})
      check_pass(c, kind, call);
    if (mok_test::failures().load() != before) {
      std::printf("  trial %d: world %d, E %d, K %d, T %d, pad %d, periods %lld / %lld\n", trial, c.s.world,
                  c.s.experts_per_rank, c.s.top_k, c.s.max_tokens, c.s.expert_padding,
                  static_cast<long long>(c.periods.ring), static_cast<long long>(c.periods.out));
      return;
    }
  }
}

TEST(every_routed_row_gets_each_stage_once_in_order) {
  check_cases(mok_test::seed(), 300, false);
}

TEST(one_expert_takes_every_row) {
  check_cases(mok_test::seed() + 1, 100, true);
}

// The plan's size is the shape's alone, and the walk that counts it is the one that fills it.
TEST(plan_depends_on_the_shape_alone) {
  std::mt19937_64 rng(mok_test::seed() + 2);
  for (int trial = 0; trial < 100; ++trial) {
    Case c;
    make_case(rng, c, false);
    core::RowPeriods p = core::ring_periods(c.s);
    int64_t windows = (core::max_recv_rows(c.s) + p.ring - 1) / p.ring;
    std::vector<core::SplitLaunch> plan = plan_of(c.s, PassKind::forward, p);
    int64_t dispatches = 0;
    for (const core::SplitLaunch& l : plan) dispatches += l.step == SplitStep::dispatch;
    CHECK_MSG(dispatches == windows, "%lld dispatches for %lld ring windows", static_cast<long long>(dispatches),
              static_cast<long long>(windows));
  }
}

TEST(bad_periods_are_refused) {
  core::LayerShape s{};
  s.world = 1;
  s.experts_per_rank = 2;
  s.hidden = s.intermediate = 8;
  s.top_k = 1;
  s.max_tokens = 16;
  s.expert_padding = 4;
  s.minibatch = 8;
  s.macrobatch = 16;
  for (core::RowPeriods p : {core::RowPeriods{0, 8}, core::RowPeriods{16, 0}, core::RowPeriods{6, 8},
                             core::RowPeriods{16, 10}, core::RowPeriods{-4, 8}})
    CHECK_MSG(core::split_plan(s, PassKind::forward, p, {}, nullptr) == -1, "periods %lld / %lld planned",
              static_cast<long long>(p.ring), static_cast<long long>(p.out));
  s.expert_padding = 0;
  CHECK(core::split_plan(s, PassKind::forward, core::RowPeriods{16, 8}, {}, nullptr) == -1);
}

}  // namespace

MOK_TEST_MAIN
