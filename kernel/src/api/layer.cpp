// C ABI of the layer: validate every argument, then hand over to the context's executor (api/executor.hpp),
// chosen at mokLayerCreate by config.executor.
#include <memory>
#include <new>

#include "api/error.hpp"
#include "api/executor.hpp"
#include "api/layer_checks.hpp"
#include "api/stamp.hpp"

using mok::api::check_array;
using mok::api::fail;

struct mokLayer {
  std::unique_ptr<mok::api::LayerExecutor> impl;
  uint64_t passes = 0;  // collective calls so far (made by the calling thread, one at a time)
};

namespace {

mokStatus_t check_layer(mokLayer_t layer, const char* func) {
  if (layer == nullptr || layer->impl == nullptr)
    return fail(mokInvalidArgument, "%s: argument 'layer' must be a context from mokLayerCreate", func);
  return mokSuccess;
}

// The rows this rank passes to a pass: the token count of its current schedule.
int tokens_of(mokLayer_t layer) {
  return layer->impl->tokens();
}

// Elements of a [tokens, width] tensor of this rank's current schedule.
int64_t per_token(mokLayer_t layer, int64_t width) {
  return static_cast<int64_t>(tokens_of(layer)) * width;
}

// A collective call's first step once its context is valid: it is numbered (the error record's `pass`), and the
// executor checks the stream (with a bad one the call is rejected as for any other argument).
mokStatus_t begin_pass(mokLayer_t layer, void* stream, const char* func) {
  layer->impl->begin_pass(++layer->passes);
  return layer->impl->check_stream(stream, func);
}

// A collective call with a live context whose arguments break a rule: the group is told why (its
// peers return mokPeerAbort with this message instead of waiting for this rank), nothing is written,
// and this rank returns `status`.
mokStatus_t rejected(mokLayer_t layer, mokStatus_t status) {
  layer->impl->reject(status, mok::api::last_error_message());
  return status;
}

// The first steps of a pass over the weights: a live context, the pass numbered on a good stream, and weights that
// fit its shape (`copy`: in this libmok's layout). What fails after the context check is rejected (the group hears).
mokStatus_t start_pass(mokLayer_t layer, const mokLayerWeights_t* weights, void* stream, const char* func,
                       mokLayerWeights_t* copy) {
  if (mokStatus_t s = check_layer(layer, func); s != mokSuccess) return s;
  if (mokStatus_t s = begin_pass(layer, stream, func); s != mokSuccess) return rejected(layer, s);
  if (mokStatus_t s = mok::api::check_weights(weights, layer->impl->shape(), func, copy); s != mokSuccess)
    return rejected(layer, s);
  return mokSuccess;
}

}  // namespace

extern "C" {

MOK_API mokStatus_t mokLayerGetSizes(const mokLayerConfig_t* config, mokLayerSizes_t* sizes) {
  mok::api::clear_error();
  size_t layout = 0;
  if (mokStatus_t s = mok::api::check_stamp(sizes, mok::api::kLayerSizes, "sizes", __func__, &layout); s != mokSuccess)
    return s;
  mokLayerConfig_t c;
  mok::core::LayerShape shape;
  if (mokStatus_t s = mok::api::check_config(config, __func__, &c, &shape); s != mokSuccess) return s;
  mokLayerSizes_t out = MOK_LAYER_SIZES_INIT;
  out.peer_bytes = mok::core::peer_layout(shape).bytes;
  // check_config refused an executor without an entry, so there is one.
  if (mokStatus_t s = mok::api::executor_entry(c.executor)->workspace_bytes(shape, __func__, &out.workspace_bytes);
      s != mokSuccess)
    return s;
  mok::api::write_stamped(sizes, out, layout);
  return mokSuccess;
}

MOK_API mokStatus_t mokLayerCreate(const mokLayerConfig_t* config, const mokLayerMemory_t* memory, mokLayer_t* layer) {
  mok::api::clear_error();
  MOK_REQUIRE_OUT(layer);
  mokLayerConfig_t c;
  mokLayerMemory_t m;
  mok::core::LayerShape shape;
  if (mokStatus_t s = mok::api::check_config(config, __func__, &c, &shape); s != mokSuccess) return s;
  // check_config refused an executor without an entry, so there is one.
  const mok::api::ExecutorEntry* executor = mok::api::executor_entry(c.executor);
  size_t workspace_need = 0;
  if (mokStatus_t s = executor->workspace_bytes(shape, __func__, &workspace_need); s != mokSuccess) return s;
  if (mokStatus_t s = mok::api::check_memory(memory, shape, workspace_need, __func__, &m); s != mokSuccess) return s;
  auto handle = std::unique_ptr<mokLayer>(new (std::nothrow) mokLayer{});
  if (!handle) return fail(mokOutOfMemory, "mokLayerCreate: out of memory");
  uint64_t timeout_ns = static_cast<uint64_t>(c.timeout_ms) * 1000000ull;
  if (mokStatus_t s = executor->create(shape, timeout_ns, m, &handle->impl); s != mokSuccess) return s;
  *layer = handle.release();
  return mokSuccess;
}

MOK_API mokStatus_t mokLayerDestroy(mokLayer_t layer) {
  mok::api::clear_error();
  if (layer == nullptr) return mokSuccess;
  delete layer;
  return mokSuccess;
}

MOK_API mokStatus_t mokLayerBuildSchedule(mokLayer_t layer, const void* topk_ids, mokIndexType_t index_type,
                                          int num_tokens, void* stream) {
  mok::api::clear_error();
  if (mokStatus_t s = check_layer(layer, __func__); s != mokSuccess) return s;
  layer->impl->drop_schedule();
  if (mokStatus_t s = begin_pass(layer, stream, __func__); s != mokSuccess) return rejected(layer, s);
  if (mokStatus_t s = mok::api::check_topk_ids(topk_ids, index_type, num_tokens, layer->impl->shape(),
                                               layer->impl->host_tensors(), __func__);
      s != mokSuccess)
    return rejected(layer, s);
  return layer->impl->build_schedule(topk_ids, index_type == mokIndexInt64, num_tokens, stream);
}

MOK_API mokStatus_t mokLayerForward(mokLayer_t layer, const mokLayerWeights_t* weights, const void* x,
                                    const float* topk_weights, void* out, void* stream) {
  mok::api::clear_error();
  mokLayerWeights_t w;
  if (mokStatus_t s = start_pass(layer, weights, stream, __func__, &w); s != mokSuccess) return s;
  int64_t th = per_token(layer, layer->impl->shape().hidden), tk = per_token(layer, layer->impl->shape().top_k);
  if (mokStatus_t s = check_array(x, "x", th, 2, __func__); s != mokSuccess) return rejected(layer, s);
  if (mokStatus_t s = check_array(topk_weights, "topk_weights", tk, 4, __func__); s != mokSuccess)
    return rejected(layer, s);
  if (mokStatus_t s = check_array(out, "out", th, 2, __func__); s != mokSuccess) return rejected(layer, s);
  return layer->impl->forward(w, static_cast<const uint16_t*>(x), topk_weights, static_cast<uint16_t*>(out), true,
                              stream);
}

namespace {

// mokLayerRecompute and mokLayerRecomputeWeighted: the weights are read (and required) only when they scale
// the experts' inputs.
mokStatus_t recompute(mokLayer_t layer, const mokLayerWeights_t* weights, const void* x, const float* topk_weights,
                      void* stream, const char* func) {
  mokLayerWeights_t w;
  if (mokStatus_t s = start_pass(layer, weights, stream, func, &w); s != mokSuccess) return s;
  const mok::core::LayerShape& shape = layer->impl->shape();
  if (mokStatus_t s = check_array(x, "x", per_token(layer, shape.hidden), 2, func); s != mokSuccess)
    return rejected(layer, s);
  if (!mok::core::input_scaled(shape))
    topk_weights = nullptr;  // not read
  else if (topk_weights == nullptr && per_token(layer, shape.top_k) > 0)
    return rejected(layer, mok::api::fail(mokInvalidArgument,
                                          "%s: argument 'topk_weights' must not be NULL with config.routing_scale = "
                                          "mokRoutingScaleInput (the experts read bf16(w_k x)); use "
                                          "mokLayerRecomputeWeighted",
                                          func));
  else if (mokStatus_t s = check_array(topk_weights, "topk_weights", per_token(layer, shape.top_k), 4, func);
           s != mokSuccess)
    return rejected(layer, s);
  return layer->impl->forward(w, static_cast<const uint16_t*>(x), topk_weights, nullptr, false, stream);
}

}  // namespace

MOK_API mokStatus_t mokLayerRecompute(mokLayer_t layer, const mokLayerWeights_t* weights, const void* x, void* stream) {
  mok::api::clear_error();
  return recompute(layer, weights, x, nullptr, stream, __func__);
}

MOK_API mokStatus_t mokLayerRecomputeWeighted(mokLayer_t layer, const mokLayerWeights_t* weights, const void* x,
                                              const float* topk_weights, void* stream) {
  mok::api::clear_error();
  return recompute(layer, weights, x, topk_weights, stream, __func__);
}

MOK_API mokStatus_t mokLayerBackward(mokLayer_t layer, const mokLayerWeights_t* weights, const float* topk_weights,
                                     const void* dout, mokLayerGrads_t* grads, void* stream) {
  mok::api::clear_error();
  mokLayerWeights_t w;
  if (mokStatus_t s = start_pass(layer, weights, stream, __func__, &w); s != mokSuccess) return s;
  const mok::core::LayerShape& shape = layer->impl->shape();
  int64_t th = per_token(layer, shape.hidden), tk = per_token(layer, shape.top_k);
  if (mokStatus_t s = check_array(topk_weights, "topk_weights", tk, 4, __func__); s != mokSuccess)
    return rejected(layer, s);
  if (mokStatus_t s = check_array(dout, "dout", th, 2, __func__); s != mokSuccess) return rejected(layer, s);
  mokLayerGrads_t g;
  if (mokStatus_t s = mok::api::check_grads(grads, w, shape, tokens_of(layer), __func__, &g); s != mokSuccess)
    return rejected(layer, s);
  return layer->impl->backward(w, topk_weights, static_cast<const uint16_t*>(dout), g, stream);
}

MOK_API mokStatus_t mokLayerGetSlots(mokLayer_t layer, void* y_slots, void* stream) {
  mok::api::clear_error();
  if (mokStatus_t s = check_layer(layer, __func__); s != mokSuccess) return s;
  // Not collective: a refused stream is this call's failure alone, as its other arguments are.
  if (mokStatus_t s = layer->impl->check_stream(stream, __func__); s != mokSuccess) return s;
  const mok::core::LayerShape& shape = layer->impl->shape();
  int64_t count = per_token(layer, static_cast<int64_t>(shape.top_k) * shape.hidden);
  if (mokStatus_t s = check_array(y_slots, "y_slots", count, 2, __func__); s != mokSuccess) return s;
  return layer->impl->get_slots(static_cast<uint16_t*>(y_slots), stream);
}

MOK_API mokStatus_t mokLayerRestoreContext(mokLayer_t layer, const void* x, const void* y_slots, void* stream) {
  mok::api::clear_error();
  if (mokStatus_t s = check_layer(layer, __func__); s != mokSuccess) return s;
  // Not collective: a refused argument is this call's failure alone.
  if (mokStatus_t s = layer->impl->check_stream(stream, __func__); s != mokSuccess) return s;
  const mok::core::LayerShape& shape = layer->impl->shape();
  if (mokStatus_t s = check_array(x, "x", per_token(layer, shape.hidden), 2, __func__); s != mokSuccess) return s;
  int64_t count = per_token(layer, static_cast<int64_t>(shape.top_k) * shape.hidden);
  if (mokStatus_t s = check_array(y_slots, "y_slots", count, 2, __func__); s != mokSuccess) return s;
  return layer->impl->restore_context(static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(y_slots), stream);
}

MOK_API mokStatus_t mokLayerGetError(mokLayer_t layer, mokLayerError_t* error) {
  mok::api::clear_error();
  if (mokStatus_t s = check_layer(layer, __func__); s != mokSuccess) return s;
  size_t layout = 0;
  if (mokStatus_t s = mok::api::check_stamp(error, mok::api::kLayerError, "error", __func__, &layout); s != mokSuccess)
    return s;
  mokLayerError_t out = MOK_LAYER_ERROR_INIT;
  layer->impl->error(&out);
  mok::api::write_stamped(error, out, layout);
  return mokSuccess;
}

MOK_API mokStatus_t mokLayerAbort(mokLayer_t layer, const char* reason) {
  mok::api::clear_error();
  if (mokStatus_t s = check_layer(layer, __func__); s != mokSuccess) return s;
  layer->impl->abort(reason != nullptr ? reason : "no reason given");
  return mokSuccess;
}

}  // extern "C"
