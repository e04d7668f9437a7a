// mok._mok's layer part: the C ABI's mokLayer* calls over raw pointers (torch's data_ptr()).
// Python (mok/host.py) owns the tensors and checks each one's dtype, shape, device and layout (contiguous, no
// stride 0) before its address comes here; libmok checks pointers and values again.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "errors.hpp"
#include "mok/mok.h"

namespace nb = nanobind;

namespace {

template <typename T>
T* ptr(const nb::dict& d, const char* key) {
  return d.contains(key) ? reinterpret_cast<T*>(nb::cast<uintptr_t>(d[key])) : nullptr;
}

template <typename T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// An int config field. A value that is no int, or does not fit one, is a ValueError naming the field (nanobind's
// own cast would raise an unnamed std::bad_cast); libmok then checks the field's range.
int config_int(const nb::dict& d, const char* name) {
  nb::handle value = d[name];
  if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr()))
    throw nb::value_error((std::string("config: '") + name + "' must be an int").c_str());
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow != 0 || v < INT32_MIN || v > INT32_MAX)
    throw nb::value_error((std::string("config: '") + name + "' (" + nb::str(value).c_str() +
                           ") must fit a 32-bit int (see mokLayerConfig_t in mok.h)")
                              .c_str());
  return static_cast<int>(v);
}

// The activation by its Python name ("swiglu" or "swiglu_oai"); any other value is a ValueError naming the key.
mokActivation_t config_activation(const nb::dict& d) {
  nb::handle value = d["activation"];
  if (PyUnicode_Check(value.ptr())) {
    std::string name = nb::cast<std::string>(value);
    if (name == "swiglu") return mokActivationSwiglu;
    if (name == "swiglu_oai") return mokActivationSwigluOai;
  }
  throw nb::value_error("config: 'activation' must be \"swiglu\" or \"swiglu_oai\"");
}

// The executor by its name (mokExecutorName: "host", "cuda", ...); any other value is a ValueError naming the key.
// Whether this libmok runs it is libmok's to say (mokLayerGetSizes, mokLayerCreate).
mokExecutor_t config_executor(const nb::dict& d) {
  nb::handle value = d["executor"];
  if (PyUnicode_Check(value.ptr())) {
    std::string name = nb::cast<std::string>(value);
    for (int e = 0; e < mokNumExecutors; ++e)
      if (name == mokExecutorName(static_cast<mokExecutor_t>(e))) return static_cast<mokExecutor_t>(e);
  }
  std::string names;
  for (int e = 0; e < mokNumExecutors; ++e)
    names += std::string(e ? ", \"" : "\"") + mokExecutorName(static_cast<mokExecutor_t>(e)) + "\"";
  throw nb::value_error(("config: 'executor' must be one of " + names + " (mokExecutor_t)").c_str());
}

mokLayerConfig_t make_config(const nb::dict& d) {
  mokLayerConfig_t c = MOK_LAYER_CONFIG_INIT;
  int* const ints[] = {&c.world,      &c.rank,         &c.experts_per_rank,    &c.hidden,         &c.intermediate,
                       &c.top_k,      &c.max_tokens,   &c.shared_intermediate, &c.expert_padding, &c.minibatch,
                       &c.macrobatch, &c.comm_workers, &c.compute_workers,     &c.timeout_ms};
  const char* const names[] = {"world",      "rank",         "experts_per_rank",    "hidden",         "intermediate",
                               "top_k",      "max_tokens",   "shared_intermediate", "expert_padding", "minibatch",
                               "macrobatch", "comm_workers", "compute_workers",     "timeout_ms"};
  size_t known = 0;
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i) {
    if (d.contains(names[i])) *ints[i] = config_int(d, names[i]), ++known;
  }
  if (d.contains("mxfp8")) c.precision = nb::cast<bool>(d["mxfp8"]) ? mokPrecisionMXFP8 : mokPrecisionBF16, ++known;
  if (d.contains("swiglu_limit")) c.swiglu_limit = nb::cast<float>(d["swiglu_limit"]), ++known;
  if (d.contains("activation")) c.activation = config_activation(d), ++known;
  if (d.contains("executor")) c.executor = config_executor(d), ++known;
  if (d.contains("swiglu_alpha")) c.swiglu_alpha = nb::cast<float>(d["swiglu_alpha"]), ++known;
  if (d.contains("backward_comm_workers")) c.backward_comm_workers = config_int(d, "backward_comm_workers"), ++known;
  // An int as a C caller stores it: libmok rejects one past the enum (naming config.routing_scale).
  if (d.contains("routing_scale")) *reinterpret_cast<int*>(&c.routing_scale) = config_int(d, "routing_scale"), ++known;
  if (known != d.size()) throw nb::value_error("config: unknown key (see mokLayerConfig_t in mok.h)");
  return c;
}

mokMxfp8Matrix_t mx(const nb::dict& d, const char* key) {
  if (!d.contains(key)) return {nullptr, nullptr};
  auto [data, scales] = nb::cast<std::tuple<uintptr_t, uintptr_t>>(d[key]);
  return {ptr<const uint8_t>(data), ptr<const uint8_t>(scales)};
}

mokLayerWeights_t make_weights(const nb::dict& d) {
  mokLayerWeights_t w = MOK_LAYER_WEIGHTS_INIT;
  w.gate = ptr<const void>(d, "gate");
  w.up = ptr<const void>(d, "up");
  w.down = ptr<const void>(d, "down");
  w.gate_rowwise = mx(d, "gate_rowwise");
  w.gate_colwise = mx(d, "gate_colwise");
  w.up_rowwise = mx(d, "up_rowwise");
  w.up_colwise = mx(d, "up_colwise");
  w.down_rowwise = mx(d, "down_rowwise");
  w.down_colwise = mx(d, "down_colwise");
  w.shared_gate = ptr<const void>(d, "shared_gate");
  w.shared_up = ptr<const void>(d, "shared_up");
  w.shared_down = ptr<const void>(d, "shared_down");
  w.shared_router = ptr<const void>(d, "shared_router");
  w.gate_bias = ptr<const void>(d, "gate_bias");
  w.up_bias = ptr<const void>(d, "up_bias");
  w.down_bias = ptr<const void>(d, "down_bias");
  return w;
}

// One rank's layer context. Passes release the GIL: on the host executor they block until the whole group is done;
// a device executor's return once enqueued on the stream.
class Layer {
 public:
  // The peers' memory from a shared-memory name libmok creates and maps (the host executor's processes)...
  Layer(const nb::dict& config, const std::string& shm_name, uintptr_t workspace, size_t workspace_bytes) {
    mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
    m.shm_name = shm_name.c_str();
    create(config, m, workspace, workspace_bytes, false);
  }
  // ... or the caller's: every rank's peer buffer by address, the own one at config['rank'] (host memory shared
  // among threads, or device pointers: cudaMalloc'd, CUDA IPC, symmetric memory).
  Layer(const nb::dict& config, const std::vector<uintptr_t>& peer_bases, uintptr_t workspace, size_t workspace_bytes) {
    bases_.reserve(peer_bases.size());
    for (uintptr_t base : peer_bases) bases_.push_back(ptr<void>(base));
    mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
    m.peer_bases = bases_.data();
    create(config, m, workspace, workspace_bytes, true);
  }
  ~Layer() { close(); }

  void close() {
    if (layer_) mokLayerDestroy(layer_);
    layer_ = nullptr;
  }

  // `stream`: the address of the stream the pass runs on (a cudaStream_t for a device executor); 0 on the host
  // executor, which refuses any other (ValueError naming 'stream').
  void build_schedule(uintptr_t ids, bool int64, int num_tokens, uintptr_t stream) {
    mokLayer_t layer = get();
    mok::python::released([&] {
      return mokLayerBuildSchedule(layer, ptr<const void>(ids), int64 ? mokIndexInt64 : mokIndexInt32, num_tokens,
                                   ptr<void>(stream));
    });
  }

  void forward(const nb::dict& weights, uintptr_t x, uintptr_t topk_weights, uintptr_t out, uintptr_t stream) {
    mokLayerWeights_t w = make_weights(weights);
    mokLayer_t layer = get();
    mok::python::released([&] {
      return mokLayerForward(layer, &w, ptr<const void>(x), ptr<const float>(topk_weights), ptr<void>(out),
                             ptr<void>(stream));
    });
  }

  void recompute(const nb::dict& weights, uintptr_t x, uintptr_t stream) {
    mokLayerWeights_t w = make_weights(weights);
    mokLayer_t layer = get();
    mok::python::released([&] { return mokLayerRecompute(layer, &w, ptr<const void>(x), ptr<void>(stream)); });
  }

  void recompute_weighted(const nb::dict& weights, uintptr_t x, uintptr_t topk_weights, uintptr_t stream) {
    mokLayerWeights_t w = make_weights(weights);
    mokLayer_t layer = get();
    mok::python::released([&] {
      return mokLayerRecomputeWeighted(layer, &w, ptr<const void>(x), ptr<const float>(topk_weights),
                                       ptr<void>(stream));
    });
  }

  void backward(const nb::dict& weights, uintptr_t topk_weights, uintptr_t dout, const nb::dict& grads,
                uintptr_t stream) {
    mokLayerWeights_t w = make_weights(weights);
    mokLayerGrads_t g = MOK_LAYER_GRADS_INIT;
    g.dx = ptr<void>(grads, "dx");
    g.dtopk_weights = ptr<float>(grads, "dtopk_weights");
    g.accumulate = grads.contains("accumulate") ? nb::cast<int>(grads["accumulate"]) : 0;
    g.dgate = ptr<void>(grads, "gate");
    g.dup = ptr<void>(grads, "up");
    g.ddown = ptr<void>(grads, "down");
    g.dshared_gate = ptr<void>(grads, "shared_gate");
    g.dshared_up = ptr<void>(grads, "shared_up");
    g.dshared_down = ptr<void>(grads, "shared_down");
    g.dshared_router = ptr<void>(grads, "shared_router");
    g.dgate_bias = ptr<void>(grads, "gate_bias");
    g.dup_bias = ptr<void>(grads, "up_bias");
    g.ddown_bias = ptr<void>(grads, "down_bias");
    mokLayer_t layer = get();
    mok::python::released([&] {
      return mokLayerBackward(layer, &w, ptr<const float>(topk_weights), ptr<const void>(dout), &g, ptr<void>(stream));
    });
  }

  void slots(uintptr_t y_slots, uintptr_t stream) {
    mokLayer_t layer = get();
    mok::python::released([&] { return mokLayerGetSlots(layer, ptr<void>(y_slots), ptr<void>(stream)); });
  }

  void restore_context(uintptr_t x, uintptr_t y_slots, uintptr_t stream) {
    mokLayer_t layer = get();
    mok::python::released(
        [&] { return mokLayerRestoreContext(layer, ptr<const void>(x), ptr<const void>(y_slots), ptr<void>(stream)); });
  }

  nb::dict error() {
    mokLayerError_t e = MOK_LAYER_ERROR_INIT;
    mok::python::check(mokLayerGetError(get(), &e));
    nb::dict d;
    d["status"] = static_cast<int>(e.status);
    d["rank"] = e.rank;
    d["task"] = std::string(e.task);
    d["task_index"] = e.task_index;
    d["wait"] = std::string(e.wait);
    d["detail"] = std::string(e.detail);
    d["pass"] = e.pass;
    d["abort_rank"] = e.abort_rank;
    return d;
  }

  // reason None: libmok's "no reason given".
  void abort(std::optional<std::string> reason) {
    mok::python::check(mokLayerAbort(get(), reason ? reason->c_str() : nullptr));
  }

 private:
  void create(const nb::dict& config, mokLayerMemory_t& m, uintptr_t workspace, size_t workspace_bytes, bool bases) {
    mokLayerConfig_t c = make_config(config);
    if (bases && static_cast<int>(bases_.size()) != c.world)
      throw nb::value_error(("peer_bases: " + std::to_string(bases_.size()) + " addresses for config 'world' " +
                             std::to_string(c.world) + " (one per rank)")
                                .c_str());
    m.workspace = ptr<void>(workspace);
    m.workspace_bytes = workspace_bytes;
    mok::python::released([&] { return mokLayerCreate(&c, &m, &layer_); });
  }
  mokLayer_t get() const {
    if (!layer_) throw std::runtime_error("mok: this layer context was closed");
    return layer_;
  }
  std::vector<void*> bases_;  // libmok reads peer_bases only in mokLayerCreate; kept for the layer's life anyway
  mokLayer_t layer_ = nullptr;
};

}  // namespace

void bind_layer(nb::module_& m) {
  m.def(
      "layer_sizes",
      [](const nb::dict& config) {
        mokLayerConfig_t c = make_config(config);
        mokLayerSizes_t s = MOK_LAYER_SIZES_INIT;
        mok::python::check(mokLayerGetSizes(&c, &s));
        return nb::make_tuple(s.peer_bytes, s.workspace_bytes);
      },
      "(peer_bytes, workspace_bytes) that a layer with this config needs");

  nb::class_<Layer>(m, "Layer")
      .def(nb::init<const nb::dict&, const std::string&, uintptr_t, size_t>(), nb::arg("config"), nb::arg("shm_name"),
           nb::arg("workspace"), nb::arg("workspace_bytes"))
      .def(nb::init<const nb::dict&, const std::vector<uintptr_t>&, uintptr_t, size_t>(), nb::arg("config"),
           nb::arg("peer_bases"), nb::arg("workspace"), nb::arg("workspace_bytes"))
      .def("close", &Layer::close)
      .def("build_schedule", &Layer::build_schedule, nb::arg("ids"), nb::arg("int64"), nb::arg("num_tokens"),
           nb::arg("stream") = 0)
      .def("forward", &Layer::forward, nb::arg("weights"), nb::arg("x"), nb::arg("topk_weights"), nb::arg("out"),
           nb::arg("stream") = 0)
      .def("recompute", &Layer::recompute, nb::arg("weights"), nb::arg("x"), nb::arg("stream") = 0)
      .def("recompute_weighted", &Layer::recompute_weighted, nb::arg("weights"), nb::arg("x"), nb::arg("topk_weights"),
           nb::arg("stream") = 0)
      .def("backward", &Layer::backward, nb::arg("weights"), nb::arg("topk_weights"), nb::arg("dout"), nb::arg("grads"),
           nb::arg("stream") = 0)
      .def("slots", &Layer::slots, nb::arg("y_slots"), nb::arg("stream") = 0)
      .def("restore_context", &Layer::restore_context, nb::arg("x"), nb::arg("y_slots"), nb::arg("stream") = 0)
      .def("error", &Layer::error)
      .def("abort", &Layer::abort, nb::arg("reason").none() = nb::none());

  m.def(
      "mxfp8_quantize",
      [](uintptr_t src, bool fp32, int64_t batch, int64_t rows, int64_t cols, uintptr_t rw_data, uintptr_t rw_scales,
         uintptr_t cw_data, uintptr_t cw_scales, uintptr_t stream) {
        mok::python::released([&] {
          return mokMxfp8Quantize(ptr<const void>(src), fp32 ? mokDataFloat32 : mokDataBF16, batch, rows, cols,
                                  ptr<uint8_t>(rw_data), ptr<uint8_t>(rw_scales), ptr<uint8_t>(cw_data),
                                  ptr<uint8_t>(cw_scales), ptr<void>(stream));
        });
      },
      nb::arg("src"), nb::arg("fp32"), nb::arg("batch"), nb::arg("rows"), nb::arg("cols"), nb::arg("rowwise_data"),
      nb::arg("rowwise_scales"), nb::arg("colwise_data"), nb::arg("colwise_scales"), nb::arg("stream") = 0);
}
