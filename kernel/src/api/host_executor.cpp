// The host executor (kernel/src/host) behind api/executor.hpp's interface: its calls report their failures in
// words (host::Detail), which become this thread's detail here.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <new>

#include "api/error.hpp"
#include "api/error_record.hpp"
#include "api/executor.hpp"
#include "host/layer.hpp"

namespace mok::api {
namespace {

// The host executor's status, with its words as this thread's detail.
mokStatus_t reported(mokStatus_t status, const host::Detail& why) {
  return status == mokSuccess ? status : fail(status, "%s", why.text);
}

class HostLayer final : public LayerExecutor {
 public:
  explicit HostLayer(host::Layer* layer) : l_(layer) {}
  ~HostLayer() override { delete l_; }
  HostLayer(const HostLayer&) = delete;
  HostLayer& operator=(const HostLayer&) = delete;

  const core::LayerShape& shape() const override { return l_->shape; }
  bool host_tensors() const override { return true; }
  int tokens() const override { return l_->group.tokens; }
  // The host executor runs every call on the calling thread: there is no stream to enqueue a pass on.
  mokStatus_t check_stream(void* stream, const char* func) const override {
    if (stream == nullptr) return mokSuccess;
    return fail(mokInvalidArgument,
                "%s: argument 'stream' (%p) must be NULL: the host executor runs on the calling thread: stream must "
                "be NULL",
                func, stream);
  }
  // A call's workers are done when it returns, so its failure is seen before the next call is numbered.
  void begin_pass(uint64_t pass) override { calls_.begin(pass, core::failed(l_->group)); }
  void drop_schedule() override { host::drop_schedule(*l_); }
  mokStatus_t build_schedule(const void* topk_ids, bool int64_ids, int tokens, void*) override {
    host::Detail why;
    return reported(host::build_schedule(*l_, topk_ids, int64_ids, tokens, why), why);
  }
  mokStatus_t forward(const mokLayerWeights_t& weights, const uint16_t* x, const float* topk_weights, uint16_t* out,
                      bool with_output, void*) override {
    host::Detail why;
    return reported(host::forward(*l_, weights, x, topk_weights, out, with_output, why), why);
  }
  mokStatus_t backward(const mokLayerWeights_t& weights, const float* topk_weights, const uint16_t* dout,
                       const mokLayerGrads_t& grads, void*) override {
    host::Detail why;
    return reported(host::backward(*l_, weights, topk_weights, dout, grads, why), why);
  }
  mokStatus_t get_slots(uint16_t* y_slots, void*) override {
    host::Detail why;
    return reported(host::get_slots(*l_, y_slots, why), why);
  }
  mokStatus_t restore_context(const uint16_t* x, const uint16_t* y_slots, void*) override {
    host::Detail why;
    return reported(host::restore_context(*l_, x, y_slots, why), why);
  }
  void reject(mokStatus_t status, const char* detail) override { host::reject(*l_, status, detail); }
  void abort(const char* reason) override {
    host::abort(*l_, reason);
    calls_.settle(core::failed(l_->group));
  }

  void error(mokLayerError_t* out) override {
    calls_.settle(core::failed(l_->group));
    core::ErrorRecord rec{};
    if (!core::read_record(&l_->group.error, &rec)) {
      out->pass = calls_.current();  // no failure: the calls made so far
      return;
    }
    record_fields(rec, out);
    std::snprintf(out->wait, sizeof(out->wait), "%s",
                  rec.wait == 0 ? "aborted by mokLayerAbort" : core::wait_name(static_cast<core::WaitId>(rec.wait)));
    host::error_detail(*l_, rec, out->detail, sizeof(out->detail));
    out->pass = calls_.failed();
    out->abort_rank = host::abort_rank(*l_, rec);
  }

 private:
  host::Layer* l_;
  CallNumbers calls_;
};

}  // namespace

mokStatus_t create_host_layer(const core::LayerShape& shape, uint64_t timeout_ns, const mokLayerMemory_t& memory,
                              std::unique_ptr<LayerExecutor>* out) {
  host::Layer* layer = nullptr;
  host::Detail why;
  if (mokStatus_t s = host::create(shape, timeout_ns, memory, &layer, why); s != mokSuccess) return reported(s, why);
  out->reset(new (std::nothrow) HostLayer(layer));
  if (!*out) {
    delete layer;
    return fail(mokOutOfMemory, "mokLayerCreate: out of memory");
  }
  return mokSuccess;
}

}  // namespace mok::api
