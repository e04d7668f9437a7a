// Every numeric limit the C ABI enforces, in one place. The checks (layer_checks.cpp, quantize.cpp)
// compare against these names; mok.h and docs/c-api.md state the same numbers with the same
// comparison. Every bound is inclusive: a value equal to a max is accepted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "core/shape.hpp"

namespace mok::api::limits {

// mokLayerConfig_t fields, each in [its min, its max].
constexpr int kMaxWorld = core::kMaxWorld;  // 72: ranks a context keeps peer pointers for
constexpr int kMaxExpertsPerRank = 1 << 20;
constexpr int kMaxHidden = 1 << 20;
constexpr int kMaxIntermediate = 1 << 20;
constexpr int kMaxSharedIntermediate = 1 << 20;
constexpr int kMaxTopK = 1 << 10;
constexpr int kMaxTokens = 1 << 24;
constexpr int kMaxExpertPadding = 1 << 16;
constexpr int kMaxMinibatch = 1 << 24;
constexpr int kMaxMacrobatch = 1 << 26;
constexpr int kMaxCommWorkers = 64;
constexpr int kMaxComputeWorkers = 256;
constexpr int kMaxTimeoutMs = 24 * 3600 * 1000;  // 24 h

// world x max_tokens x top_k + experts_per_rank x expert_padding, an upper bound of the receive rows
// (core::max_recv_rows): row indices and expert segment starts are int32.
constexpr int64_t kMaxReceiveRows = INT32_MAX;

// The largest tensors the layer keeps, in elements: the peer buffer's y_slots and dx_slots
// [max_tokens, top_k, hidden], the staged expert weights [experts_per_rank, intermediate, hidden],
// the ring buffers [macrobatch, hidden] and [macrobatch, intermediate]. With every field within its
// max, these bounds keep mokLayerGetSizes' byte counts below 2^47 (docs/c-api.md), far from a size_t overflow.
constexpr int64_t kMaxTensorElements = int64_t{1} << 40;

// mokLayerMemory_t::shm_name: 1 to this many characters ("/<name>-<rank>" fits a 256-byte path).
constexpr size_t kMaxShmName = 200;

// mokMxfp8Quantize: batch x rows x cols.
constexpr int64_t kMaxQuantizeElements = int64_t{1} << 40;

// a x b x ..., or INT64_MAX when that overflows (then above every limit); factors are >= 0.
inline int64_t product(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(p, f, &p)) return INT64_MAX;
  return p;
}

static_assert(sizeof(size_t) == 8, "the layouts count bytes in a 64-bit size_t");

}  // namespace mok::api::limits
