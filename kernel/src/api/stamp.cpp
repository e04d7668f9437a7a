// Struct stamps: the layouts every stamped struct of mok.h has had, and the check of a caller's stamp.
#include "api/stamp.hpp"

#include "api/error.hpp"

namespace mok::api {
namespace {

// The three fields every stamped struct begins with.
struct Stamp {
  size_t size;
  unsigned int magic;
  unsigned int version;
};
static_assert(offsetof(mokLayerConfig_t, magic) == offsetof(Stamp, magic) &&
                  offsetof(mokLayerConfig_t, version) == offsetof(Stamp, version) &&
                  offsetof(mokLayerMemory_t, version) == offsetof(Stamp, version) &&
                  offsetof(mokLayerError_t, version) == offsetof(Stamp, version) &&
                  offsetof(mokDeviceInfo_t, version) == offsetof(Stamp, version),
              "every stamped struct starts with size, magic, version");

// Layouts, oldest first. A struct grows only at its end, by whole fields that change its sizeof.
const size_t kDeviceInfoLayouts[] = {sizeof(mokDeviceInfo_t)};
// mokLayerConfig_t's first layout ended at executor; activation and swiglu_alpha came after it. The
// first layout's sizeof has 4 bytes of tail padding where activation now is: those are not read.
constexpr size_t kConfigFirstEnd = offsetof(mokLayerConfig_t, activation);
constexpr size_t kConfigFirstSize =
    (kConfigFirstEnd + alignof(mokLayerConfig_t) - 1) / alignof(mokLayerConfig_t) * alignof(mokLayerConfig_t);
// The second layout ended at swiglu_alpha, its sizeof with 4 bytes of tail padding where
// backward_comm_workers now is (not read); backward_comm_workers and routing_scale came after it.
constexpr size_t kConfigSecondEnd = offsetof(mokLayerConfig_t, backward_comm_workers);
constexpr size_t kConfigSecondSize =
    (kConfigSecondEnd + alignof(mokLayerConfig_t) - 1) / alignof(mokLayerConfig_t) * alignof(mokLayerConfig_t);
static_assert(kConfigFirstSize < kConfigSecondSize && kConfigSecondSize < sizeof(mokLayerConfig_t),
              "each layout is larger than the one before");
const size_t kLayerConfigLayouts[] = {kConfigFirstSize, kConfigSecondSize, sizeof(mokLayerConfig_t)};
const size_t kLayerConfigEnds[] = {kConfigFirstEnd, kConfigSecondEnd, sizeof(mokLayerConfig_t)};
const size_t kLayerSizesLayouts[] = {sizeof(mokLayerSizes_t)};
// mokLayerMemory_t's first layout ended at workspace_bytes; peer_bytes came after it.
const size_t kLayerMemoryLayouts[] = {offsetof(mokLayerMemory_t, peer_bytes), sizeof(mokLayerMemory_t)};
static_assert(offsetof(mokLayerMemory_t, peer_bytes) % alignof(mokLayerMemory_t) == 0,
              "the first layout's sizeof is where peer_bytes starts");
// mokLayerWeights_t's first layout ended at shared_down, mokLayerGrads_t's at dshared_down; the expert
// biases and their gradients came after them, then the shared expert's gate (shared_router, dshared_router).
// Pointers all: no tail padding in between.
const size_t kLayerWeightsLayouts[] = {offsetof(mokLayerWeights_t, gate_bias),
                                       offsetof(mokLayerWeights_t, shared_router), sizeof(mokLayerWeights_t)};
const size_t kLayerGradsLayouts[] = {offsetof(mokLayerGrads_t, dgate_bias), offsetof(mokLayerGrads_t, dshared_router),
                                     sizeof(mokLayerGrads_t)};
static_assert(offsetof(mokLayerWeights_t, gate_bias) % alignof(mokLayerWeights_t) == 0 &&
                  offsetof(mokLayerGrads_t, dgate_bias) % alignof(mokLayerGrads_t) == 0,
              "the first layouts' sizeof is where the biases start");
// mokLayerError_t's first layout (0.1) ended at detail; pass and abort_rank came after it (0.2).
const size_t kLayerErrorLayouts[] = {offsetof(mokLayerError_t, pass), sizeof(mokLayerError_t)};
static_assert(offsetof(mokLayerError_t, pass) % alignof(mokLayerError_t) == 0,
              "the first layout's sizeof is where pass starts");

const size_t kSelftestOptionsLayouts[] = {sizeof(mokSelftestOptions_t)};
const size_t kSelftestReportLayouts[] = {sizeof(mokSelftestReport_t)};

template <size_t N>
constexpr StampedType stamped(const char* name, const char* init, const size_t (&layouts)[N],
                              const size_t* field_ends = nullptr) {
  return {name, init, layouts, static_cast<int>(N), field_ends};
}

}  // namespace

const StampedType kDeviceInfo = stamped("mokDeviceInfo_t", "MOK_DEVICE_INFO_INIT", kDeviceInfoLayouts);
const StampedType kLayerConfig =
    stamped("mokLayerConfig_t", "MOK_LAYER_CONFIG_INIT", kLayerConfigLayouts, kLayerConfigEnds);
const StampedType kLayerSizes = stamped("mokLayerSizes_t", "MOK_LAYER_SIZES_INIT", kLayerSizesLayouts);
const StampedType kLayerMemory = stamped("mokLayerMemory_t", "MOK_LAYER_MEMORY_INIT", kLayerMemoryLayouts);
const StampedType kLayerWeights = stamped("mokLayerWeights_t", "MOK_LAYER_WEIGHTS_INIT", kLayerWeightsLayouts);
const StampedType kLayerGrads = stamped("mokLayerGrads_t", "MOK_LAYER_GRADS_INIT", kLayerGradsLayouts);
const StampedType kLayerError = stamped("mokLayerError_t", "MOK_LAYER_ERROR_INIT", kLayerErrorLayouts);
const StampedType kSelftestOptions =
    stamped("mokSelftestOptions_t", "MOK_SELFTEST_OPTIONS_INIT", kSelftestOptionsLayouts);
const StampedType kSelftestReport = stamped("mokSelftestReport_t", "MOK_SELFTEST_REPORT_INIT", kSelftestReportLayouts);

mokStatus_t check_stamp(const void* arg, const StampedType& type, const char* name, const char* func, size_t* size) {
  if (arg == nullptr) return fail(mokInvalidArgument, "%s: argument '%s' must not be NULL", func, name);
  Stamp stamp;
  std::memcpy(&stamp, arg, sizeof(stamp));
  if (stamp.magic != MOK_STRUCT_MAGIC)
    return fail(mokInvalidArgument, "%s: argument '%s' has no %s stamp (magic 0x%08x); initialise it with %s", func,
                name, type.name, stamp.magic, type.init);
  size_t newest = type.layouts[type.count - 1];
  unsigned v = stamp.version;
  if (stamp.size > newest)
    return fail(mokInvalidArgument,
                "%s: argument '%s' is a %s of %zu bytes from mok.h %u.%u.%u; this libmok (%s) knows %s up to %zu "
                "bytes: build against this libmok's mok.h, or load the libmok of that mok.h",
                func, name, type.name, stamp.size, v / 10000, v / 100 % 100, v % 100, MOK_VERSION_STRING, type.name,
                newest);
  for (int i = 0; i < type.count; ++i)
    if (stamp.size == type.layouts[i]) {
      *size = stamp.size;
      return mokSuccess;
    }
  return fail(mokInvalidArgument,
              "%s: argument '%s' has size %zu, which is no layout of %s (mok.h %u.%u.%u); initialise it with %s", func,
              name, stamp.size, type.name, v / 10000, v / 100 % 100, v % 100, type.init);
}

}  // namespace mok::api
