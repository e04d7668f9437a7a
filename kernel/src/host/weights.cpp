// The caller's weights as core reads them: in place, no copies (the executor only passes pointers on).
#include "host/layer.hpp"

namespace mok::host {
namespace {

core::MxWeight mx(const mokMxfp8Matrix_t& m) {
  return core::MxWeight{m.data, m.scales};
}

const core::bf16_t* bf16(const void* p) {
  return static_cast<const core::bf16_t*>(p);
}

}  // namespace

core::LayerWeights weights_in_place(const mokLayerWeights_t& w) {
  return core::LayerWeights{bf16(w.gate),       bf16(w.up),          bf16(w.down),       mx(w.gate_rowwise),
                            mx(w.up_rowwise),   mx(w.down_rowwise),  mx(w.gate_colwise), mx(w.up_colwise),
                            mx(w.down_colwise), bf16(w.shared_gate), bf16(w.shared_up),  bf16(w.shared_down),
                            bf16(w.gate_bias),  bf16(w.up_bias),     bf16(w.down_bias),  bf16(w.shared_router)};
}

}  // namespace mok::host
