// mok._mok.task_graph: core's task graph of one pass on one rank as numpy arrays, for models of a pass
// (mok.perf). Everything comes from core: the schedule (build_schedule), the queues (build_task_graph),
// the weight-gradient parts (plan_parts) and each task's dependencies (task_deps.hpp). No C ABI call:
// nothing runs, nothing is allocated beyond the arrays returned.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/task_deps.hpp"

namespace nb = nanobind;
namespace core = mok::core;

namespace {

// A vector handed to numpy, which frees it.
template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T>&& v, size_t rows = 0, size_t cols = 0) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  if (cols == 0) return nb::ndarray<nb::numpy, T>(owned->data(), {owned->size()}, owner);
  return nb::ndarray<nb::numpy, T>(owned->data(), {rows, cols}, owner);
}

int field(const nb::dict& d, const char* name, int fallback, int low, int high) {
  if (!d.contains(name)) {
    if (fallback >= low) return fallback;
    throw nb::value_error((std::string("shape: '") + name + "' is required").c_str());
  }
  int v = nb::cast<int>(d[name]);
  if (v < low || v > high)
    throw nb::value_error((std::string("shape: '") + name + "' (" + std::to_string(v) + ") must be in [" +
                           std::to_string(low) + ", " + std::to_string(high) + "]")
                              .c_str());
  return v;
}

core::PassKind pass_kind(const std::string& name) {
  if (name == "forward") return core::PassKind::forward;
  if (name == "recompute") return core::PassKind::recompute;
  if (name == "backward") return core::PassKind::backward;
  if (name == "backward_kept") return core::PassKind::backward_kept;
  throw nb::value_error("kind: must be \"forward\", \"recompute\", \"backward\" or \"backward_kept\"");
}

using Ids = nb::ndarray<const int32_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;

nb::dict task_graph(const nb::dict& d, Ids ids, int rank, const std::string& kind_name) {
  core::LayerShape s{};
  s.world = static_cast<int>(ids.shape(0));
  if (s.world < 1 || s.world > core::kMaxWorld) throw nb::value_error("ids: its first dim (world) must be in [1, 72]");
  if (rank < 0 || rank >= s.world) throw nb::value_error("rank: must be in [0, world)");
  s.rank = rank;
  s.max_tokens = static_cast<int>(ids.shape(1));
  s.top_k = static_cast<int>(ids.shape(2));
  if (s.top_k < 1) throw nb::value_error("ids: its last dim (top_k) must be at least 1");
  s.experts_per_rank = field(d, "experts_per_rank", 0, 1, 1 << 20);
  s.hidden = field(d, "hidden", 0, 1, 1 << 20);
  s.intermediate = field(d, "intermediate", 0, 1, 1 << 20);
  s.shared_intermediate = field(d, "shared_intermediate", 0, 0, 1 << 20);
  s.mxfp8 = field(d, "mxfp8", 0, 0, 1);
  s.expert_padding = field(d, "expert_padding", 0, 1, 1 << 20);
  s.minibatch = field(d, "minibatch", 0, 1, 1 << 30);
  s.macrobatch = field(d, "macrobatch", 0, 1, 1 << 30);
  s.swiglu_limit = 1e30f;
  s.comm_workers = s.compute_workers = 1;  // the graph does not depend on the split
  if (s.minibatch % s.expert_padding != 0)
    throw nb::value_error("shape: 'minibatch' must be a multiple of 'expert_padding'");
  if (s.macrobatch % s.minibatch != 0) throw nb::value_error("shape: 'macrobatch' must be a multiple of 'minibatch'");
  core::PassKind kind = pass_kind(kind_name);
  std::vector<int32_t> tokens(static_cast<size_t>(s.world), s.max_tokens);
  if (d.contains("tokens")) {
    nb::list t = nb::cast<nb::list>(d["tokens"]);
    if (static_cast<int>(t.size()) != s.world) throw nb::value_error("shape: 'tokens' must list one count per rank");
    for (int r = 0; r < s.world; ++r) {
      tokens[r] = nb::cast<int32_t>(t[r]);
      if (tokens[r] < 0 || tokens[r] > s.max_tokens)
        throw nb::value_error("shape: 'tokens' must each be in [0, ids.shape[1]]");
    }
  }
  int experts = s.world * s.experts_per_rank;
  const int32_t* all = ids.data();
  for (int64_t i = 0, n = static_cast<int64_t>(s.world) * s.max_tokens * s.top_k; i < n; ++i)
    if (all[i] < -1 || all[i] >= experts)
      throw nb::value_error("ids: each must be -1 or in [0, world * experts_per_rank)");
  std::vector<const int32_t*> rows_of(static_cast<size_t>(s.world));
  for (int r = 0; r < s.world; ++r) rows_of[r] = all + static_cast<int64_t>(r) * s.max_tokens * s.top_k;

  std::vector<int32_t> experts_table(2 * static_cast<size_t>(s.experts_per_rank));
  std::vector<core::RowRef> rows(static_cast<size_t>(core::max_recv_rows(s)));
  core::Schedule sched{experts_table.data(), rows.data(), 0};
  core::build_schedule(s, core::Routing{rows_of.data(), tokens.data()}, sched);
  std::vector<core::Task> tasks(static_cast<size_t>(core::max_tasks(s)));
  std::vector<core::WgradPart> parts(static_cast<size_t>(core::max_parts(s)));
  core::TaskGraph g{};
  g.comm = tasks.data();
  g.compute = g.comm + core::max_minibatches(s) * 2;  // as pass_view_at lays them out
  g.parts = parts.data();
  core::build_task_graph(s, kind, sched, tokens[rank], g);
  std::vector<int64_t> start, deps;
  if (!core::resolve_task_deps(s, kind, sched, g, start, deps))
    throw std::runtime_error("task_graph: a wait no task can meet (a broken graph)");

  int64_t n = g.num_comm + g.num_compute, tiles = sched.total_rows / s.expert_padding;
  int64_t minibatches = core::num_minibatches(s, sched.total_rows);
  std::vector<int32_t> queue(n), task_kind(n), index(n), block(n);
  for (int64_t t = 0; t < n; ++t) {
    const core::Task& task = core::task_at(g, t);
    queue[t] = t < g.num_comm ? 0 : 1;
    task_kind[t] = static_cast<int32_t>(task.kind);
    index[t] = task.index;
    block[t] = task.block;
  }
  std::vector<int32_t> tile_expert(tiles), tile_rows(tiles);
  for (int64_t t = 0; t < tiles; ++t) {
    tile_expert[t] = core::tile_expert(s, sched, t);
    tile_rows[t] = core::tile_rows(s, sched, t, tile_expert[t]);
  }
  // Routed rows of each minibatch per source rank: what its dispatch pulls from and its combine pushes to.
  std::vector<int32_t> from(static_cast<size_t>(minibatches * s.world), 0);
  for (int64_t j = 0; j < sched.total_rows; ++j)
    if (rows[j].rank >= 0) ++from[static_cast<size_t>(j / s.minibatch * s.world + rows[j].rank)];
  std::vector<int32_t> part_expert(g.num_parts), part_first(g.num_parts), part_end(g.num_parts);
  for (int64_t p = 0; p < g.num_parts; ++p) {
    part_expert[p] = parts[p].expert;
    part_first[p] = parts[p].first_tile;
    part_end[p] = parts[p].end_tile;
  }
  std::vector<int32_t> counts(s.experts_per_rank);
  for (int e = 0; e < s.experts_per_rank; ++e) counts[e] = core::expert_count(sched, e);

  nb::dict out;
  out["num_comm"] = g.num_comm;
  out["num_compute"] = g.num_compute;
  out["total_rows"] = sched.total_rows;
  out["tokens"] = tokens[rank];
  out["queue"] = to_numpy(std::move(queue));
  out["kind"] = to_numpy(std::move(task_kind));
  out["index"] = to_numpy(std::move(index));
  out["block"] = to_numpy(std::move(block));
  out["dep_start"] = to_numpy(std::move(start));
  out["deps"] = to_numpy(std::move(deps));
  out["tile_expert"] = to_numpy(std::move(tile_expert));
  out["tile_rows"] = to_numpy(std::move(tile_rows));
  out["minibatch_rows_from"] =
      to_numpy(std::move(from), static_cast<size_t>(minibatches), static_cast<size_t>(s.world));
  out["part_expert"] = to_numpy(std::move(part_expert));
  out["part_first_tile"] = to_numpy(std::move(part_first));
  out["part_end_tile"] = to_numpy(std::move(part_end));
  out["expert_rows"] = to_numpy(std::move(counts));
  nb::list names;
  for (int k = 0; k < static_cast<int>(core::TaskKind::count); ++k) names.append(std::string(core::task_name(k)));
  out["kind_names"] = names;
  return out;
}

}  // namespace

void bind_task_graph(nb::module_& m) {
  m.def("task_graph", &task_graph, nb::arg("shape"), nb::arg("ids"), nb::arg("rank"), nb::arg("kind"),
        "core's task graph of one pass on one rank: both queues (comm tasks are ids 0 .. num_comm - 1, then the "
        "compute queue), each task's kind, index and block, its dependencies as task ids (deps[dep_start[t] : "
        "dep_start[t + 1]], from core/task_deps.hpp), and the schedule's tiles, parts and rows per source rank. "
        "ids: int32 [world, max_tokens, top_k], every rank's routing; shape: experts_per_rank, hidden, "
        "intermediate, shared_intermediate, mxfp8, expert_padding, minibatch, macrobatch, and optionally tokens "
        "(one count per rank, the rank's first rows of ids).");
}
