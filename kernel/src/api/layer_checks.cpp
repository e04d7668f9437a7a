// Argument rules of the layer's C ABI.
#include "api/layer_checks.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "api/c_enum.hpp"
#include "api/error.hpp"
#include "api/executor.hpp"
#include "api/limits.hpp"
#include "api/stamp.hpp"
#include "core/mxfp8.hpp"
#include "core/schedule.hpp"

namespace mok::api {
namespace {

mokStatus_t invalid(const char* func, const char* fmt_rule, const char* name, long long value) {
  return fail(mokInvalidArgument, "%s: argument '%s' (%lld) %s", func, name, value, fmt_rule);
}

// The integer fields, each in [lo, hi].
mokStatus_t check_ranges(const mokLayerConfig_t* c, const char* func) {
  struct Rule {
    const char* name;
    long long value, lo, hi;
  };
  const Rule rules[] = {
      {"config.world", c->world, 1, limits::kMaxWorld},
      {"config.rank", c->rank, 0, static_cast<long long>(c->world) - 1},
      {"config.experts_per_rank", c->experts_per_rank, 1, limits::kMaxExpertsPerRank},
      {"config.hidden", c->hidden, 1, limits::kMaxHidden},
      {"config.intermediate", c->intermediate, 1, limits::kMaxIntermediate},
      {"config.top_k", c->top_k, 1, limits::kMaxTopK},
      {"config.max_tokens", c->max_tokens, 1, limits::kMaxTokens},
      {"config.shared_intermediate", c->shared_intermediate, 0, limits::kMaxSharedIntermediate},
      {"config.expert_padding", c->expert_padding, 1, limits::kMaxExpertPadding},
      {"config.minibatch", c->minibatch, 1, limits::kMaxMinibatch},
      {"config.macrobatch", c->macrobatch, 1, limits::kMaxMacrobatch},
      {"config.comm_workers", c->comm_workers, 1, limits::kMaxCommWorkers},
      {"config.compute_workers", c->compute_workers, 1, limits::kMaxComputeWorkers},
      {"config.timeout_ms", c->timeout_ms, 1, limits::kMaxTimeoutMs},
  };
  for (const Rule& r : rules)
    if (r.value < r.lo || r.value > r.hi)
      return fail(mokInvalidArgument, "%s: argument '%s' (%lld) must be in [%lld, %lld]", func, r.name, r.value, r.lo,
                  r.hi);
  return mokSuccess;
}

// precision and executor, read as the ints a C caller may have stored in them.
mokStatus_t check_enums(const mokLayerConfig_t* c, const char* func, mokPrecision_t* precision) {
  int32_t p = enum_bits(c->precision), e = enum_bits(c->executor);
  if (!enum_in_range(p, mokNumPrecisions))
    return invalid(func, "must be mokPrecisionBF16 (0) or mokPrecisionMXFP8 (1)", "config.precision", p);
  if (!enum_in_range(e, mokNumExecutors)) return invalid(func, kExecutorRule, "config.executor", e);
  if (!layer_compiled(static_cast<mokExecutor_t>(e)))
    return not_compiled(static_cast<mokExecutor_t>(e), "config.executor", func);
  *precision = static_cast<mokPrecision_t>(p);
  return mokSuccess;
}

// The activation and its alpha: alpha matters (and is checked) only for swiglu_oai.
mokStatus_t check_activation(const mokLayerConfig_t* c, const char* func, core::Activation* activation) {
  int32_t a = enum_bits(c->activation);
  if (!enum_in_range(a, mokNumActivations))
    return invalid(func, "must be mokActivationSwiglu (0) or mokActivationSwigluOai (1)", "config.activation", a);
  *activation = static_cast<core::Activation>(a);
  if (*activation == core::Activation::swiglu_oai && !(c->swiglu_alpha > 0.0f && std::isfinite(c->swiglu_alpha)))
    return fail(mokInvalidArgument,
                "%s: argument 'config.swiglu_alpha' (%g) must be finite and > 0 with mokActivationSwigluOai", func,
                static_cast<double>(c->swiglu_alpha));
  return mokSuccess;
}

// Where the routing weights apply: the output (today's default) or the experts' input (Llama4).
mokStatus_t check_routing_scale(const mokLayerConfig_t* c, const char* func, int* routing_scale) {
  int32_t r = enum_bits(c->routing_scale);
  if (!enum_in_range(r, mokNumRoutingScales))
    return invalid(func, "must be mokRoutingScaleOutput (0) or mokRoutingScaleInput (1)", "config.routing_scale", r);
  *routing_scale = r;
  return mokSuccess;
}

// The rules between fields: the clamp, and the tile, minibatch and macrobatch granularities.
mokStatus_t check_relations(const mokLayerConfig_t* c, mokPrecision_t precision, const char* func) {
  if (!(c->swiglu_limit >= 0.0f))
    return fail(mokInvalidArgument, "%s: argument 'config.swiglu_limit' (%g) must be > 0, or 0 for no clamp", func,
                static_cast<double>(c->swiglu_limit));
  if (precision == mokPrecisionMXFP8 && c->expert_padding % core::kMxBlock != 0)
    return invalid(func, "must be a multiple of 32 with MXFP8 precision (token-dim blocks start on tiles)",
                   "config.expert_padding", c->expert_padding);
  if (c->minibatch % c->expert_padding != 0)
    return invalid(func, "must be a multiple of config.expert_padding", "config.minibatch", c->minibatch);
  if (c->macrobatch < c->minibatch)
    return invalid(func, "must not be smaller than config.minibatch", "config.macrobatch", c->macrobatch);
  if (c->macrobatch % c->minibatch != 0)
    return invalid(func, "must be a multiple of config.minibatch", "config.macrobatch", c->macrobatch);
  // The backward splits the same threads: at least one of each class is left.
  int workers = c->comm_workers + c->compute_workers;
  if (c->backward_comm_workers != 0 && (c->backward_comm_workers < 1 || c->backward_comm_workers >= workers))
    return fail(mokInvalidArgument,
                "%s: argument 'config.backward_comm_workers' (%d) must be 0 (= config.comm_workers) or in [1, %d] "
                "(config.comm_workers + config.compute_workers - 1: the backward leaves a compute worker)",
                func, c->backward_comm_workers, workers - 1);
  return mokSuccess;
}

// The products that size the buffers, in exact integers: the receive rows fit int32 indices and
// no tensor exceeds limits::kMaxTensorElements, so every byte count of the layouts fits size_t.
mokStatus_t check_products(const mokLayerConfig_t* c, const char* func) {
  struct Rule {
    const char* what;
    int64_t value, max;
    const char* why;
  };
  int64_t rows = limits::product({c->world, c->max_tokens, c->top_k}),
          padding = limits::product({c->experts_per_rank, c->expert_padding});
  if (__builtin_add_overflow(rows, padding, &rows)) rows = INT64_MAX;
  const Rule rules[] = {
      {"world x max_tokens x top_k + experts_per_rank x expert_padding", rows, limits::kMaxReceiveRows,
       "receive rows, indexed by int32"},
      {"max_tokens x top_k x hidden", limits::product({c->max_tokens, c->top_k, c->hidden}), limits::kMaxTensorElements,
       "elements of the peer buffer's y_slots"},
      {"experts_per_rank x intermediate x hidden", limits::product({c->experts_per_rank, c->intermediate, c->hidden}),
       limits::kMaxTensorElements, "elements of each expert weight"},
      {"macrobatch x hidden", limits::product({c->macrobatch, c->hidden}), limits::kMaxTensorElements,
       "elements of a ring buffer"},
      {"macrobatch x intermediate", limits::product({c->macrobatch, c->intermediate}), limits::kMaxTensorElements,
       "elements of a ring buffer"},
  };
  for (const Rule& r : rules)
    if (r.value > r.max)
      return fail(mokInvalidArgument, "%s: argument 'config' gives %s = %lld (%s); it must be at most %lld", func,
                  r.what, static_cast<long long>(r.value), r.why, static_cast<long long>(r.max));
  return mokSuccess;
}

// memory.peer_bytes: 0 (not given; an older caller's layout has none), else at least the peer layout's bytes,
// and only with peer_bases (libmok sizes shared-memory segments itself).
mokStatus_t check_peer_bytes(const mokLayerMemory_t& m, const core::LayerShape& shape, const char* func) {
  if (m.peer_bytes == 0) return mokSuccess;
  if (m.shm_name != nullptr)
    return fail(mokInvalidArgument, "%s: argument 'memory.peer_bytes' (%zu) must be 0 with 'memory.shm_name'", func,
                m.peer_bytes);
  size_t need = core::peer_layout(shape).bytes;
  if (m.peer_bytes < need)
    return fail(mokInvalidArgument,
                "%s: argument 'memory.peer_bytes' (%zu) is smaller than the %zu bytes mokLayerGetSizes asks for "
                "these shapes",
                func, m.peer_bytes, need);
  return mokSuccess;
}

}  // namespace

mokStatus_t check_array(const void* ptr, const char* name, int64_t count, size_t align, const char* func) {
  if (count == 0) return mokSuccess;
  if (ptr == nullptr) return fail(mokInvalidArgument, "%s: argument '%s' must not be NULL", func, name);
  if (reinterpret_cast<uintptr_t>(ptr) % align != 0)
    return fail(mokInvalidArgument, "%s: argument '%s' must be %zu-byte aligned", func, name, align);
  return mokSuccess;
}

mokStatus_t check_config(const mokLayerConfig_t* config, const char* func, mokLayerConfig_t* copy,
                         core::LayerShape* shape) {
  if (mokStatus_t s = read_stamped(config, kLayerConfig, mokLayerConfig_t MOK_LAYER_CONFIG_INIT, "config", func, copy);
      s != mokSuccess)
    return s;
  const mokLayerConfig_t* c = copy;
  mokPrecision_t precision = mokPrecisionBF16;
  if (mokStatus_t s = check_ranges(c, func); s != mokSuccess) return s;
  if (mokStatus_t s = check_enums(c, func, &precision); s != mokSuccess) return s;
  core::Activation activation = core::Activation::swiglu;
  if (mokStatus_t s = check_activation(c, func, &activation); s != mokSuccess) return s;
  int routing_scale = 0;
  if (mokStatus_t s = check_routing_scale(c, func, &routing_scale); s != mokSuccess) return s;
  if (mokStatus_t s = check_relations(c, precision, func); s != mokSuccess) return s;
  if (mokStatus_t s = check_products(c, func); s != mokSuccess) return s;
  *shape = core::LayerShape{c->world,
                            c->rank,
                            c->experts_per_rank,
                            c->hidden,
                            c->intermediate,
                            c->top_k,
                            c->max_tokens,
                            c->shared_intermediate,
                            precision == mokPrecisionMXFP8 ? 1 : 0,
                            c->swiglu_limit > 0.0f ? c->swiglu_limit : INFINITY,
                            c->expert_padding,
                            c->minibatch,
                            c->macrobatch,
                            c->comm_workers,
                            c->compute_workers,
                            static_cast<int>(activation),
                            activation == core::Activation::swiglu_oai ? c->swiglu_alpha : 0.0f,
                            c->backward_comm_workers,
                            routing_scale,
                            pass_form(c->executor)};
  return mokSuccess;
}

mokStatus_t check_memory(const mokLayerMemory_t* memory, const core::LayerShape& shape, size_t workspace_need,
                         const char* func, mokLayerMemory_t* copy) {
  if (mokStatus_t s = read_stamped(memory, kLayerMemory, mokLayerMemory_t MOK_LAYER_MEMORY_INIT, "memory", func, copy);
      s != mokSuccess)
    return s;
  const mokLayerMemory_t* m = copy;
  if ((m->peer_bases == nullptr) == (m->shm_name == nullptr))
    return fail(mokInvalidArgument, "%s: exactly one of 'memory.peer_bases' and 'memory.shm_name' must be given", func);
  if (m->peer_bases) {
    for (int r = 0; r < shape.world; ++r) {
      char name[48];
      std::snprintf(name, sizeof(name), "memory.peer_bases[%d]", r);
      if (mokStatus_t s = check_array(m->peer_bases[r], name, 1, core::kAlign, func); s != mokSuccess) return s;
    }
  } else {
    size_t n = std::strlen(m->shm_name);
    if (n == 0 || n > limits::kMaxShmName ||
        std::strspn(m->shm_name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") != n)
      return fail(mokInvalidArgument,
                  "%s: argument 'memory.shm_name' (%zu characters) must be 1-%zu letters, digits, '_', '-' or '.'",
                  func, n, limits::kMaxShmName);
  }
  if (mokStatus_t s = check_array(m->workspace, "memory.workspace", 1, core::kAlign, func); s != mokSuccess) return s;
  size_t need = workspace_need;
  if (m->workspace_bytes < need)
    return fail(mokInvalidArgument,
                "%s: argument 'memory.workspace_bytes' (%zu) is smaller than the %zu bytes "
                "mokLayerGetSizes asks for these shapes",
                func, m->workspace_bytes, need);
  return check_peer_bytes(*m, shape, func);
}

mokStatus_t check_topk_ids(const void* ids, const mokIndexType_t& type, int tokens, const core::LayerShape& shape,
                           bool read_ids, const char* func) {
  int32_t bits = enum_bits(type);
  if (bits != mokIndexInt32 && bits != mokIndexInt64)
    return invalid(func, "must be mokIndexInt32 (0) or mokIndexInt64 (1)", "index_type", bits);
  bool wide = bits == mokIndexInt64;
  if (tokens < 0 || tokens > shape.max_tokens)
    return fail(mokInvalidArgument, "%s: argument 'num_tokens' (%d) must be in [0, config.max_tokens = %d]", func,
                tokens, shape.max_tokens);
  int64_t n = static_cast<int64_t>(tokens) * shape.top_k;
  if (mokStatus_t s = check_array(ids, "topk_ids", n, wide ? 8 : 4, func); s != mokSuccess) return s;
  int64_t experts = static_cast<int64_t>(shape.world) * shape.experts_per_rank;
  for (int64_t i = 0; read_ids && i < n; ++i) {
    int64_t id = core::topk_id(ids, wide, i);
    if (!core::valid_topk_id(shape, id))
      return fail(mokInvalidArgument, "%s: argument 'topk_ids' [%lld][%lld] = %lld must be -1 or in [0, %lld)", func,
                  static_cast<long long>(i / shape.top_k), static_cast<long long>(i % shape.top_k),
                  static_cast<long long>(id), static_cast<long long>(experts));
  }
  return mokSuccess;
}

mokStatus_t check_weights(const mokLayerWeights_t* weights, const core::LayerShape& s, const char* func,
                          mokLayerWeights_t* copy) {
  if (mokStatus_t st =
          read_stamped(weights, kLayerWeights, mokLayerWeights_t MOK_LAYER_WEIGHTS_INIT, "weights", func, copy);
      st != mokSuccess)
    return st;
  const mokLayerWeights_t* w = copy;
  int64_t eih = static_cast<int64_t>(s.experts_per_rank) * s.intermediate * s.hidden;
  if (s.mxfp8) {
    const mokMxfp8Matrix_t* m[6] = {&w->gate_rowwise, &w->gate_colwise, &w->up_rowwise,
                                    &w->up_colwise,   &w->down_rowwise, &w->down_colwise};
    const char* names[6] = {"weights.gate_rowwise", "weights.gate_colwise", "weights.up_rowwise",
                            "weights.up_colwise",   "weights.down_rowwise", "weights.down_colwise"};
    for (int i = 0; i < 6; ++i)
      if (!m[i]->data || !m[i]->scales)
        return fail(mokInvalidArgument, "%s: argument '%s' must have data and scales with MXFP8 precision", func,
                    names[i]);
  } else {
    const void* p[3] = {w->gate, w->up, w->down};
    const char* names[3] = {"weights.gate", "weights.up", "weights.down"};
    for (int i = 0; i < 3; ++i)
      if (mokStatus_t st = check_array(p[i], names[i], eih, 2, func); st != mokSuccess) return st;
  }
  const void* sp[3] = {w->shared_gate, w->shared_up, w->shared_down};
  const char* snames[3] = {"weights.shared_gate", "weights.shared_up", "weights.shared_down"};
  for (int i = 0; i < 3; ++i) {
    if (s.shared_intermediate == 0 && sp[i])
      return fail(mokInvalidArgument, "%s: argument '%s' is given but config.shared_intermediate is 0", func,
                  snames[i]);
    int64_t n = static_cast<int64_t>(s.shared_intermediate) * s.hidden;
    if (mokStatus_t st = check_array(sp[i], snames[i], n, 2, func); st != mokSuccess) return st;
  }
  // The expert biases are optional, each on its own (NULL: zero).
  const void* bp[3] = {w->gate_bias, w->up_bias, w->down_bias};
  const char* bnames[3] = {"weights.gate_bias", "weights.up_bias", "weights.down_bias"};
  for (int i = 0; i < 3; ++i) {
    int64_t n = static_cast<int64_t>(s.experts_per_rank) * (i < 2 ? s.intermediate : s.hidden);
    if (bp[i])
      if (mokStatus_t st = check_array(bp[i], bnames[i], n, 2, func); st != mokSuccess) return st;
  }
  // The gate scales the shared expert's output: without one it has nothing to scale.
  if (w->shared_router && s.shared_intermediate == 0)
    return fail(mokInvalidArgument, "%s: argument 'weights.shared_router' is given but config.shared_intermediate is 0",
                func);
  if (w->shared_router) return check_array(w->shared_router, "weights.shared_router", s.hidden, 2, func);
  return mokSuccess;
}

mokStatus_t check_grads(const mokLayerGrads_t* grads, const mokLayerWeights_t& w, const core::LayerShape& s, int tokens,
                        const char* func, mokLayerGrads_t* copy) {
  if (mokStatus_t st = read_stamped(grads, kLayerGrads, mokLayerGrads_t MOK_LAYER_GRADS_INIT, "grads", func, copy);
      st != mokSuccess)
    return st;
  const mokLayerGrads_t* g = copy;
  if (g->accumulate != 0 && g->accumulate != 1)
    return invalid(func, "must be 0 or 1", "grads.accumulate", g->accumulate);
  int64_t th = static_cast<int64_t>(tokens) * s.hidden, tk = static_cast<int64_t>(tokens) * s.top_k;
  if (mokStatus_t st = check_array(g->dx, "grads.dx", th, 2, func); st != mokSuccess) return st;
  if (mokStatus_t st = check_array(g->dtopk_weights, "grads.dtopk_weights", tk, 4, func); st != mokSuccess) return st;
  size_t el = g->accumulate ? 4 : 2;
  int64_t eih = static_cast<int64_t>(s.experts_per_rank) * s.intermediate * s.hidden;
  int64_t sih = static_cast<int64_t>(s.shared_intermediate) * s.hidden;
  const void* p[6] = {g->dgate, g->dup, g->ddown, g->dshared_gate, g->dshared_up, g->dshared_down};
  const char* names[6] = {"grads.dgate",        "grads.dup",        "grads.ddown",
                          "grads.dshared_gate", "grads.dshared_up", "grads.dshared_down"};
  for (int i = 0; i < 6; ++i)
    if (mokStatus_t st = check_array(p[i], names[i], i < 3 ? eih : sih, el, func); st != mokSuccess) return st;
  // A bias's gradient is required with the bias, and written whenever given (the gradient of a zero bias).
  const void* bias[3] = {w.gate_bias, w.up_bias, w.down_bias};
  void* db[3] = {g->dgate_bias, g->dup_bias, g->ddown_bias};
  const char* dbnames[3] = {"grads.dgate_bias", "grads.dup_bias", "grads.ddown_bias"};
  for (int i = 0; i < 3; ++i) {
    if (bias[i] && !db[i])
      return fail(mokInvalidArgument, "%s: argument '%s' must not be NULL when weights.%s is given", func, dbnames[i],
                  dbnames[i] + 7);
    int64_t n = static_cast<int64_t>(s.experts_per_rank) * (i < 2 ? s.intermediate : s.hidden);
    if (db[i])
      if (mokStatus_t st = check_array(db[i], dbnames[i], n, el, func); st != mokSuccess) return st;
  }
  bool gated = w.shared_router != nullptr;
  if (!gated && g->dshared_router)
    return fail(mokInvalidArgument, "%s: argument 'grads.dshared_router' is given but weights.shared_router is NULL",
                func);
  if (gated && !g->dshared_router)
    return fail(mokInvalidArgument,
                "%s: argument 'grads.dshared_router' must not be NULL when weights.shared_router is given", func);
  if (gated) return check_array(g->dshared_router, "grads.dshared_router", s.hidden, el, func);
  return mokSuccess;
}

}  // namespace mok::api
