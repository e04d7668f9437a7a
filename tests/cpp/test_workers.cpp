// The host executor's workers: threads made once per layer (not per pass), the same bits whatever the
// worker counts (home sums and gradient write-out split unevenly across workers) and however a worker's row
// jobs are cut into parts (as a CTA's threads share them), a layer with fewer threads than asked for, and a
// worker that is gone failing the pass with a named local wait.
#include <set>

#include "core/pass_worker.hpp"
#include "group.hpp"
#include "worker_threads.hpp"

using namespace mok_test;
namespace core = mok::core;

namespace {

Knobs workers(int comm, int compute) {
  Knobs k;
  k.comm_workers = comm;
  k.compute_workers = compute;
  return k;
}

bool same(const Outputs& a, const Outputs& b) {
  return a.out == b.out && a.dx == b.dx && a.dw == b.dw && a.dgate == b.dgate && a.dup == b.dup && a.ddown == b.ddown &&
         a.dsgate == b.dsgate && a.dsup == b.dsup && a.dsdown == b.dsdown && a.main_gate == b.main_gate &&
         a.main_up == b.main_up && a.main_down == b.main_down && a.main_sgate == b.main_sgate &&
         a.main_sup == b.main_sup && a.main_sdown == b.main_sdown && a.slots == b.slots;
}

// 13 tokens per rank (prime: no worker count divides it) and gradients of 2 x 12 x 20 = 480 and
// 8 x 20 = 160 elements (not divisible by 7): every split below is uneven.
Spec uneven(int world) {
  Spec s;
  s.world = world;
  s.hidden = 20;
  s.inter = 12;
  s.shared_inter = 8;
  s.max_tokens = 13;
  s.ragged = false;
  return s;
}

// The same bits on 1 + 1, 1 + 3, 2 + 5 and 6 + 40 workers; at 6 + 40 most workers take no task, as most of a GPU's
// CTAs do on a small batch.
void check_across_worker_counts(const Spec& spec, bool accumulate) {
  std::mt19937_64 rng(seed() + 41 + spec.world);
  ref::Problem p = make_problem(spec, rng);
  Outputs first;
  bool have_first = false;
  for (Knobs k : {workers(1, 1), workers(1, 3), workers(2, 5), workers(6, 40)}) {
    k.accumulate = accumulate;
    Outputs o = run_layer(p, k);
    CHECK(all_ok(o));
    if (!have_first) {
      first = o;
      have_first = true;
      continue;
    }
    CHECK_MSG(same(first, o), "world %d accumulate %d: workers %d+%d differ from 1+1", spec.world, accumulate,
              k.comm_workers, k.compute_workers);
  }
}

}  // namespace

TEST(threads_are_made_once_per_layer) {
  std::mt19937_64 rng(seed() + 3);
  Spec s = uneven(1);
  ref::Problem p = make_problem(s, rng);
  Knobs k = workers(2, 3);
  mokLayerSizes_t sizes = sizes_for(p, k);
  AlignedBuffer peer(sizes.peer_bytes), work(sizes.workspace_bytes);
  void* bases[1] = {peer.p};
  mokLayerConfig_t c = config_for(p, k, 0);
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  m.peer_bases = bases;
  m.workspace = work.p;
  m.workspace_bytes = sizes.workspace_bytes;
  std::set<std::string> before = worker_threads();
  mokLayer_t layer = nullptr;
  CHECK(mokLayerCreate(&c, &m, &layer) == mokSuccess);
  std::set<std::string> created = worker_threads();
  CHECK_MSG(created.size() == before.size() + 5, "%zu threads before, %zu after creating a 2 + 3 worker layer",
            before.size(), created.size());
  mokLayerWeights_t w = bf16_weights(p, 0);
  std::vector<int32_t> ids(p.ids[0].begin(), p.ids[0].end());
  int T = p.tokens[0];
  std::vector<uint16_t> out(static_cast<size_t>(T) * p.hidden);
  Bf16Grads grads(p, 0);
  mokLayerGrads_t g = grads.grads();
  CHECK(mokLayerBuildSchedule(layer, ids.data(), mokIndexInt32, T, nullptr) == mokSuccess);
  std::vector<uint16_t> first_out, first_dgate;
  for (int pass = 0; pass < 20; pass += 2) {  // 10 forwards and 10 backwards
    CHECK(mokLayerForward(layer, &w, p.x[0].data(), p.topk_weights[0].data(), out.data(), nullptr) == mokSuccess);
    CHECK(worker_threads() == created);
    CHECK(mokLayerBackward(layer, &w, p.topk_weights[0].data(), p.dout[0].data(), &g, nullptr) == mokSuccess);
    CHECK_MSG(worker_threads() == created, "pass %d: the layer's threads changed", pass + 1);
    if (pass == 0) {
      first_out = out;
      first_dgate = grads.dgate;
    }
    CHECK(out == first_out && grads.dgate == first_dgate);  // and every pass computes the same
  }
  CHECK(mokLayerDestroy(layer) == mokSuccess);
  std::set<std::string> after = worker_threads_when([&](const std::set<std::string>& now) { return now == before; });
  CHECK_MSG(after == before, "%zu threads left 10 s after destroy, %zu before", after.size(), before.size());
}

TEST(world1_bitwise_across_worker_counts) {
  check_across_worker_counts(uneven(1), false);
}

TEST(world2_bitwise_across_worker_counts_bf16_and_main_grad) {
  check_across_worker_counts(uneven(2), false);
  check_across_worker_counts(uneven(2), true);
}

// backward_comm_workers splits the same threads differently in the backward (as a GPU splits its SMs):
// core gives the backward's first backward_comm_workers workers the comm queue, forward and recompute
// comm_workers; 0 is comm_workers.
TEST(the_backward_takes_its_own_split_of_the_workers) {
  core::LayerShape s{};
  s.comm_workers = 1;
  s.compute_workers = 4;
  for (int bwd : {0, 1, 3, 4}) {
    s.backward_comm_workers = bwd;
    for (core::PassKind kind : {core::PassKind::forward, core::PassKind::recompute, core::PassKind::backward,
                                core::PassKind::backward_kept}) {
      core::PassView v{};
      v.s = s;
      v.kind = kind;
      int want = core::is_backward(kind) && bwd > 0 ? bwd : 1, comm = 0;
      for (int w = 0; w < core::workers_of(v); ++w) comm += core::class_of(v, w) == core::WorkerClass::comm;
      CHECK_MSG(comm == want && core::class_of(v, comm - 1) == core::WorkerClass::comm,
                "backward_comm_workers %d, pass %d: %d comm workers, want the first %d", bwd, static_cast<int>(kind),
                comm, want);
      CHECK(core::workers_of(v) == 5);
    }
  }
}

// The split is honoured end to end (every backward split of 1 + 4 workers, the most comm workers included,
// with and without recompute, world 1 and 2) and the bits do not depend on it.
TEST(backward_comm_workers_give_the_same_bits) {
  for (int world : {1, 2}) {
    std::mt19937_64 rng(seed() + 45 + world);
    ref::Problem p = make_problem(uneven(world), rng);
    Outputs base = run_layer(p, workers(1, 4));
    CHECK(all_ok(base));
    for (int bwd : {2, 4})
      for (bool recompute : {false, true}) {
        Knobs k = workers(1, 4);
        k.backward_comm_workers = bwd;
        k.recompute = recompute;
        Outputs o = run_layer(p, k);
        CHECK_MSG(all_ok(o) && same(base, o), "world %d: backward_comm_workers %d (recompute %d) differs from 1", world,
                  bwd, recompute);
      }
    Knobs k = workers(3, 2);  // forward 3 comm, backward 1
    k.backward_comm_workers = 1;
    Outputs o = run_layer(p, k);
    CHECK_MSG(all_ok(o) && same(base, o), "world %d: 3 + 2 workers, backward 1 comm, differ from 1 + 4", world);
  }
}

// core::fit_workers, the workers a pass runs on where fewer can run at once (host threads, or the CTAs a GPU keeps
// resident for the fused executor, which refuses fewer than 2): the config's where they fit; else as many as there
// are, at least one comm and one compute worker, the forward's and the backward's comm workers each leaving a
// compute worker, and the compute workers cut first.
TEST(fit_workers_runs_every_class_on_the_workers_there_are) {
  for (int available = 2; available <= 12; ++available)
    for (int comm = 1; comm <= 6; ++comm)
      for (int compute = 1; compute <= 10; ++compute)
        for (int backward = 0; backward < comm + compute; ++backward) {
          core::LayerShape s{};
          s.comm_workers = comm, s.compute_workers = compute, s.backward_comm_workers = backward;
          core::LayerShape f = core::fit_workers(s, available);
          int total = f.comm_workers + f.compute_workers;
          bool fits = comm + compute <= available;
          bool ok =
              fits ? (f.comm_workers == comm && f.compute_workers == compute && f.backward_comm_workers == backward)
                   : (total == available && f.comm_workers >= 1 && f.compute_workers >= 1 &&
                      f.comm_workers == (comm < available ? comm : available - 1) &&
                      f.backward_comm_workers <= total - 1 && (backward == 0) == (f.backward_comm_workers == 0));
          if (!ok) {
            CHECK_MSG(false, "available %d, comm %d compute %d backward %d: got comm %d compute %d backward %d",
                      available, comm, compute, backward, f.comm_workers, f.compute_workers, f.backward_comm_workers);
            return;
          }
        }
}

// Only compute tasks use a worker's shared-expert rows and weight-gradient sums, so the layout holds them for the most
// compute workers a pass runs (core::max_compute_workers, of the config's shape): every pass, fitted to however many
// workers there are, gives each compute worker its own rows and sums inside that, and a comm worker none. Sizing them
// by the config's compute workers alone (a backward with fewer comm workers runs more) fails it.
TEST(compute_workers_own_rows_and_sums_inside_the_layout) {
  constexpr size_t kRows = 3, kSums = 5;  // chunk_values and sums_floats: any sizes
  for (int available = 2; available <= 9; ++available)
    for (int comm = 1; comm <= 4; ++comm)
      for (int compute = 1; compute <= 5; ++compute)
        for (int backward = 0; backward < comm + compute; ++backward)
          for (core::PassKind kind : {core::PassKind::forward, core::PassKind::recompute, core::PassKind::backward,
                                      core::PassKind::backward_kept}) {
            core::LayerShape s{};
            s.comm_workers = comm, s.compute_workers = compute, s.backward_comm_workers = backward;
            size_t room = static_cast<size_t>(core::max_compute_workers(s));
            std::vector<core::bf16_t> rows(room * kRows);
            std::vector<float> sums(room * kSums);
            core::PassView v{};
            v.s = core::fit_workers(s, available);
            v.kind = kind;
            v.chunk = rows.data(), v.chunk_values = kRows;
            v.sums = sums.data(), v.sums_floats = kSums;
            std::set<const float*> seen;
            bool ok = true;
            for (int w = 0; w < v.s.comm_workers + v.s.compute_workers; ++w) {
              core::bf16_t* r = core::worker_chunk(v, w);
              float* m = core::worker_sums(v, w);
              if (core::class_of(v, w) == core::WorkerClass::comm) {
                ok = ok && !r && !m;
                continue;
              }
              ok = ok && r >= rows.data() && r + kRows <= rows.data() + rows.size() && m >= sums.data() &&
                   m + kSums <= sums.data() + sums.size() && seen.insert(m).second &&
                   (m - sums.data()) / static_cast<long>(kSums) == (r - rows.data()) / static_cast<long>(kRows);
            }
            if (!ok) {
              CHECK_MSG(false,
                        "available %d, comm %d compute %d backward %d, %s: a worker's rows or sums outside "
                        "the layout's %zu, shared, or given to a comm worker",
                        available, comm, compute, backward, core::is_backward(kind) ? "backward" : "forward", room);
              return;
            }
          }
  // core's layout holds that many of each, its last buffer (sums) ending inside the workspace: a shape with a shared
  // expert whose backward moves rows on fewer workers than its forward.
  core::LayerShape s{};
  s.world = 1, s.experts_per_rank = 2, s.hidden = 96, s.intermediate = 64, s.shared_intermediate = 32, s.top_k = 2;
  s.max_tokens = 64, s.expert_padding = 32, s.minibatch = 32, s.macrobatch = 64;
  s.comm_workers = 3, s.compute_workers = 4, s.backward_comm_workers = 1, s.form = core::PassForm::fused;
  core::LocalLayout l = core::local_layout(s);
  size_t room = static_cast<size_t>(core::max_compute_workers(s));
  CHECK(room == 6 && l.chunk_values > 0 && l.sums_floats > 0);
  CHECK(l.chunk + room * l.chunk_values * sizeof(core::bf16_t) <= l.sums);
  CHECK(l.sums + room * l.sums_floats * sizeof(float) <= l.bytes);
}

// A worker's row jobs (dispatch, SwiGLU forward and backward, combine, a weight-gradient block's zeroing, bias sums
// and write-out, the shared expert's row stages, the accumulators zeroed, the home sums and the write-out) cut into
// parts run one after another, first to last and last to first (MOK_HOST_ROW_PARTS), as the fused executor's CTA runs
// them on its threads at once: the same bits as whole, BF16 and MXFP8, a gated shared expert, biases, input scaling,
// recompute, bf16 gradients and fp32 main_grad. 3 parts split H = 96 unevenly (12 bf16 pieces; in MXFP8 128 pairs and
// 128 columns, a padding block's included); 200 leave some parts empty. With 3 or 6 of the parts holding slots
// (MOK_HOST_BULK_SLOTS), the rows copied unchanged (dispatch's unscaled x or dy, combine's pushes) go as bulk copies.
TEST(row_jobs_in_parts_give_the_same_bits) {
  for (bool mxfp8 : {false, true})
    for (bool input_scale : {false, true}) {
      std::mt19937_64 rng(seed() + 47 + 2 * mxfp8 + input_scale);
      Spec spec = uneven(2);
      spec.hidden = 96;
      spec.inter = 64;
      spec.shared_inter = 32;
      // Input scaling with every route on one expert, ungated: its rows span several weight-gradient parts, whose
      // sums carry over in a slot; else uniform routing with the gated shared expert.
      spec.routing = input_scale ? Routing::one_expert : Routing::uniform;
      spec.gated = !input_scale;
      spec.bias = true;
      spec.mxfp8 = mxfp8;
      spec.input_scale = input_scale;
      ref::Problem p = make_problem(spec, rng);
      Knobs k = mxfp8 ? mxfp8_knobs() : Knobs{};
      k.comm_workers = 1;
      k.compute_workers = 3;
      for (bool accumulate : {false, true}) {
        k.accumulate = accumulate;
        k.recompute = accumulate;
        Outputs whole = run_layer(p, k);
        CHECK(all_ok(whole));
        for (auto [parts, slots] : {std::pair{"3", "0"}, {"-3", "0"}, {"-200", "0"}, {"7", "3"}, {"-200", "6"}}) {
          setenv("MOK_HOST_ROW_PARTS", parts, 1);
          setenv("MOK_HOST_BULK_SLOTS", slots, 1);
          Outputs o = run_layer(p, k);
          unsetenv("MOK_HOST_ROW_PARTS");
          unsetenv("MOK_HOST_BULK_SLOTS");
          bool bias_same = o.dbgate == whole.dbgate && o.dbup == whole.dbup && o.dbdown == whole.dbdown &&
                           o.main_bgate == whole.main_bgate && o.main_bup == whole.main_bup &&
                           o.main_bdown == whole.main_bdown && o.dsrouter == whole.dsrouter &&
                           o.main_srouter == whole.main_srouter;
          CHECK_MSG(all_ok(o) && same(whole, o) && bias_same,
                    "mxfp8 %d input_scale %d accumulate %d: row jobs in parts %s (%s bulk slots) differ from whole",
                    mxfp8, input_scale, accumulate, parts, slots);
          if (std::strcmp(slots, "0") == 0) continue;
          // The slots carried rows: with their copies lost, the layer's results are not the whole job's.
          setenv("MOK_HOST_ROW_PARTS", parts, 1);
          setenv("MOK_HOST_BULK_SLOTS", slots, 1);
          setenv("MOK_HOST_FAULT_BULK_LOST", "1", 1);
          Outputs lost = run_layer(p, k);
          unsetenv("MOK_HOST_ROW_PARTS");
          unsetenv("MOK_HOST_BULK_SLOTS");
          unsetenv("MOK_HOST_FAULT_BULK_LOST");
          CHECK_MSG(!same(whole, lost), "mxfp8 %d input_scale %d: the slots of parts %s carried no row", mxfp8,
                    input_scale, parts);
        }
      }
    }
}

// Fewer threads than workers (MOK_HOST_FAULT_THREADS caps them, as a thread limit would): the calling
// thread serves too, the pass runs on the workers there are, and the bits stay the same.
TEST(fewer_threads_than_workers_give_the_same_bits) {
  std::mt19937_64 rng(seed() + 43);
  ref::Problem p = make_problem(uneven(2), rng);
  Outputs full = run_layer(p, workers(2, 5));
  setenv("MOK_HOST_FAULT_THREADS", "2", 1);
  Outputs capped = run_layer(p, workers(2, 5));
  Knobs split = workers(2, 5);
  split.backward_comm_workers = 6;  // more than the 2 threads leave: capped like comm_workers
  Outputs capped_split = run_layer(p, split);
  unsetenv("MOK_HOST_FAULT_THREADS");
  CHECK(all_ok(full) && all_ok(capped) && all_ok(capped_split));
  CHECK(same(full, capped));
  CHECK(same(full, capped_split));
}

// No thread at all (MOK_HOST_FAULT_THREADS=0, as a thread limit reached before the first would be): the
// calling thread is the pool's only worker (thread_pool.hpp). Each pass still completes with the same
// bits, or the layer is refused at mokLayerCreate; never a pass that runs out its timeout.
TEST(no_threads_at_all_still_run_the_pass_or_refuse_the_layer) {
  std::mt19937_64 rng(seed() + 44);
  ref::Problem p = make_problem(uneven(2), rng);
  Outputs full = run_layer(p, workers(1, 2));
  Knobs k = workers(1, 2);
  k.timeout_ms = 2000;  // a pass that cannot run fails within this instead of the default minute
  setenv("MOK_HOST_FAULT_THREADS", "0", 1);
  Outputs lone = run_layer(p, k);
  unsetenv("MOK_HOST_FAULT_THREADS");
  CHECK(all_ok(full));
  bool refused = true;
  for (size_t r = 0; r < lone.status.size(); ++r)
    refused = refused && lone.status[r] != mokSuccess && lone.detail[r].find("mokLayerCreate") != std::string::npos;
  CHECK_MSG(refused || (all_ok(lone) && same(full, lone)), "rank 0: %s: %s",
            mokGetStatusString(lone.status.empty() ? mokSuccess : lone.status[0]),
            lone.detail.empty() ? "" : lone.detail[0].c_str());
}

// MOK_HOST_FAULT_EXIT="<rank>:<worker>": that worker leaves every pass at once, as a dead thread
// would. Rank 1 fails with the local wait that missed it, rank 0 with the timeout or abort that
// follows, within their bounds: worker 0 gone, the others wait three timeouts for its release.
TEST(a_worker_that_is_gone_fails_the_pass_with_a_named_local_wait) {
  constexpr int kTimeoutMs = 500;
  std::mt19937_64 rng(seed() + 47);
  ref::Problem p = make_problem(uneven(2), rng);
  struct Case {
    const char* spec;
    const char* wait;
  };
  for (Case c : {Case{"1:3", "tasks finished (local workers)"}, Case{"1:0", "pass start (local workers)"}}) {
    Knobs k = workers(1, 3);
    k.timeout_ms = kTimeoutMs;
    setenv("MOK_HOST_FAULT_EXIT", c.spec, 1);
    auto start = std::chrono::steady_clock::now();
    Outputs o = run_layer(p, k);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    unsetenv("MOK_HOST_FAULT_EXIT");
    CHECK_MSG(ms < 4 * kTimeoutMs + 2000, "%s: took %.0f ms with a %d ms timeout", c.spec, ms, kTimeoutMs);
    CHECK_MSG(o.status[1] == mokTimeout, "%s: rank 1: %s", c.spec, mokGetStatusString(o.status[1]));
    CHECK_MSG(std::string(o.error[1].wait) == c.wait, "%s: rank 1 names wait '%s', want '%s'", c.spec, o.error[1].wait,
              c.wait);
    CHECK_MSG(o.status[0] == mokTimeout || o.status[0] == mokPeerAbort, "%s: rank 0: %s", c.spec,
              mokGetStatusString(o.status[0]));
    std::printf("  %s: rank 1 '%s', rank 0 '%s' (%s), %.0f ms\n", c.spec, o.error[1].wait, o.error[0].wait,
                mokGetStatusString(o.status[0]), ms);
  }
}

MOK_TEST_MAIN
