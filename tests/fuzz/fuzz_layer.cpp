// libFuzzer target over the layer's C ABI (clang, ASan + UBSan, the enum check included).
//
// One input is a group of 1..3 ranks as threads and a short sequence of C ABI calls, decoded one byte per
// decision (past the end of the input every byte reads 0, the plain valid choice): configs with bad values
// and one-field mismatches between ranks, heap or shared-memory peer memory, then GetSizes, Create,
// BuildSchedule, Forward, Recompute, Backward, GetSlots, GetError, Abort, Destroy and Mxfp8Quantize with NULL,
// misaligned and exactly sized buffers, ids -1 / out of range / beyond int32, NaN and Inf data. Every output is
// pre-filled with a canary. A finding aborts (libFuzzer keeps the input): a sanitizer report, a status outside
// mokStatus_t or mokInternalError, a failed call without a detail, a rejected call (mokInvalidArgument,
// mokInvalidUsage, mokUnsupported) that wrote output, a bad argument the call accepted, or a shared-memory
// segment left behind. Every wait is 200 ms, so an input runs for seconds at most; libFuzzer's -timeout
// catches a hang. MOK_FUZZ_VERBOSE=1 prints every call and its status (replaying one input shows the
// sequence that led to a finding).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mok/mok.h"

extern "C" {
void fuzz_set_precision(mokLayerConfig_t* config, int value);
void fuzz_set_executor(mokLayerConfig_t* config, int value);
void fuzz_set_routing_scale(mokLayerConfig_t* config, int value);
int fuzz_routing_scale(const mokLayerConfig_t* config);
mokStatus_t fuzz_build_schedule(mokLayer_t layer, const void* topk_ids, int index_type, int num_tokens);
mokStatus_t fuzz_quantize(const void* src, int dtype, int64_t batch, int64_t rows, int64_t cols, uint8_t* rowwise_data,
                          uint8_t* rowwise_scales, uint8_t* colwise_data, uint8_t* colwise_scales);
}

namespace {

constexpr int kMaxThreads = 3;
constexpr int kTimeoutMs = 200;           // every wait of the group: an input never runs long
constexpr int kLongestTimeoutMs = 1000;   // a config asking for more makes no collective call
constexpr size_t kMaxBytes = 16u << 20;   // larger valid configs are sized and created, never run
constexpr int64_t kMaxWeights = 1 << 18;  // elements of one weight tensor worth running
constexpr uint8_t kCanary = 0xA5;

// Bytes of one [rows, cols] matrix's MXFP8 scales as mok.h documents them: 128-row by 4-block tiles of 512.
size_t mx_scale_bytes(int64_t rows, int64_t cols) {
  int64_t k_tiles = ((cols + 31) / 32 + 3) / 4;
  return static_cast<size_t>((rows + 127) / 128 * k_tiles * 512);
}

bool verbose() {
  static const bool on = std::getenv("MOK_FUZZ_VERBOSE") != nullptr;
  return on;
}

void say(const char* fmt, ...) {
  if (!verbose()) return;
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
}

[[noreturn]] void finding(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::fprintf(stderr, "\n==mok-fuzz== FINDING: ");
  std::vfprintf(stderr, fmt, args);
  std::fprintf(stderr, "\n");
  va_end(args);
  std::abort();
}

// The input, one decision per byte; 0 is always the plain, valid choice.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  int below(int n) { return byte() % n; }
  int range(int lo, int hi) { return lo + below(hi - lo + 1); }
  bool one_in(int n) { return byte() % n == n - 1; }
  uint32_t word() {
    uint32_t w = 0;
    for (int i = 0; i < 4; ++i) w = w << 8 | byte();
    return w;
  }
  // Values on and beyond the edges of the documented rules.
  int64_t wild() {
    static const int64_t edges[] = {-1,
                                    0,
                                    1,
                                    2,
                                    31,
                                    32,
                                    33,
                                    72,
                                    73,
                                    1 << 10,
                                    (1 << 10) + 1,
                                    1 << 16,
                                    (1 << 20) + 1,
                                    (1 << 24) + 1,
                                    (1 << 26) + 1,
                                    24ll * 3600 * 1000 + 1,
                                    std::numeric_limits<int32_t>::max(),
                                    std::numeric_limits<int32_t>::min(),
                                    -2,
                                    1ll << 31,
                                    1ll << 32,
                                    (1ll << 32) + 1,
                                    -(1ll << 33),
                                    std::numeric_limits<int64_t>::max(),
                                    std::numeric_limits<int64_t>::min()};
    constexpr int n = sizeof(edges) / sizeof(edges[0]);
    int i = below(n + 1);
    return i < n ? edges[i] : static_cast<int32_t>(word());
  }

 private:
  const uint8_t* data_;
  size_t size_, at_ = 0;
};

// A heap block of exactly `bytes` (ASan sees any access past its end), optionally shifted off alignment.
class Block {
 public:
  Block() = default;
  Block(size_t bytes, size_t shift, size_t align = 64) : bytes_(bytes) {
    if (posix_memalign(&raw_, align, bytes + shift + (bytes + shift == 0)) != 0) finding("out of memory");
    p_ = static_cast<uint8_t*>(raw_) + shift;
  }
  Block(Block&& o) noexcept { *this = std::move(o); }
  Block& operator=(Block&& o) noexcept {
    std::swap(raw_, o.raw_);
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~Block() { std::free(raw_); }
  uint8_t* p() const { return p_; }
  size_t bytes() const { return bytes_; }
  void fill(uint8_t v) { std::memset(p_, v, bytes_); }
  bool holds(uint8_t v) const {
    for (size_t i = 0; i < bytes_; ++i)
      if (p_[i] != v) return false;
    return true;
  }

 private:
  void* raw_ = nullptr;
  uint8_t* p_ = nullptr;
  size_t bytes_ = 0;
};

// bf16 words: mostly ordinary values, with NaN, Inf, denormals and the largest finite mixed in.
void fill_bf16(Block& b, uint32_t seed, bool specials) {
  static const uint16_t odd[] = {0x7fc0, 0x7f80, 0xff80, 0x0001, 0x7f7f, 0x8000, 0xffff};
  for (size_t i = 0; i < b.bytes() / 2; ++i) {  // memcpy: the block may be misaligned on purpose
    seed = seed * 1664525u + 1013904223u;
    uint16_t w =
        specials && (seed >> 28) == 0 ? odd[(seed >> 8) % 7] : static_cast<uint16_t>(0x3c00 + (seed >> 16) % 0x800);
    std::memcpy(b.p() + 2 * i, &w, 2);
  }
}

void fill_f32(Block& b, uint32_t seed, bool specials) {
  static const float odd[] = {NAN, INFINITY, -INFINITY, 1e38f, -0.0f, 1e-45f};
  for (size_t i = 0; i < b.bytes() / 4; ++i) {
    seed = seed * 1664525u + 1013904223u;
    float f = specials && (seed >> 28) == 0 ? odd[(seed >> 8) % 6] : static_cast<float>((seed >> 8) % 1000) / 999.0f;
    std::memcpy(b.p() + 4 * i, &f, 4);
  }
}

void fill_bytes(Block& b, uint32_t seed) {
  for (size_t i = 0; i < b.bytes(); ++i) {
    seed = seed * 1664525u + 1013904223u;
    b.p()[i] = static_cast<uint8_t>(seed >> 24);
  }
}

bool rejected(mokStatus_t s) {
  return s == mokInvalidArgument || s == mokInvalidUsage || s == mokUnsupported;
}

// Every status: a mokStatus_t other than mokInternalError, with a detail when it is a failure.
mokStatus_t checked(mokStatus_t s, int rank, const char* call) {
  int v = static_cast<int>(s);
  say("  rank %d: %s -> %s %s\n", rank, call, v >= 0 && v < mokNumStatus ? mokGetStatusString(s) : "?",
      s == mokSuccess ? "" : mokGetLastError());
  if (v < 0 || v >= mokNumStatus || s == mokInternalError)
    finding("%s on rank %d returned status %d: %s", call, rank, v, mokGetLastError());
  if (s != mokSuccess && mokGetLastError()[0] == '\0')
    finding("%s on rank %d failed (%d) without a detail", call, rank, v);
  if (s == mokSuccess && mokGetLastError()[0] != '\0')
    finding("%s on rank %d succeeded with a stale detail: %s", call, rank, mokGetLastError());
  return s;
}

void expect_rejected(mokStatus_t s, bool must, int rank, const char* call, const char* why) {
  if (must && s == mokSuccess) finding("%s on rank %d accepted %s", call, rank, why);
}

void expect_untouched(mokStatus_t s, const Block& b, int rank, const char* call, const char* what) {
  if (rejected(s) && !b.holds(kCanary))
    finding("%s on rank %d was rejected (%s) but wrote '%s'", call, rank, mokGetStatusString(s), what);
}

// ---- the group's configs ----------------------------------------------------------------------

// Field 17 stays the executor and routing_scale comes last, so that older corpus bytes pick the same fields.
constexpr int kFields = 19;

void set_field(mokLayerConfig_t& c, int field, int64_t v, Bytes& in) {
  int i = static_cast<int>(v);
  switch (field) {
    case 0: c.size = v < 0 ? sizeof(c) - 4 : static_cast<size_t>(v); break;
    case 1: c.world = i; break;
    case 2: c.rank = i; break;
    case 3: c.experts_per_rank = i; break;
    case 4: c.hidden = i; break;
    case 5: c.intermediate = i; break;
    case 6: c.top_k = i; break;
    case 7: c.max_tokens = i; break;
    case 8: c.shared_intermediate = i; break;
    case 9: fuzz_set_precision(&c, i); break;
    case 10: {
      static const float limits[] = {-1.0f, NAN, INFINITY, -0.0f, 1e-30f, 0.5f, 7.0f, -INFINITY};
      c.swiglu_limit = limits[in.below(8)];
      break;
    }
    case 11: c.expert_padding = i; break;
    case 12: c.minibatch = i; break;
    case 13: c.macrobatch = i; break;
    case 14: c.comm_workers = i; break;
    case 15: c.compute_workers = i; break;
    case 16: c.timeout_ms = i; break;
    case 17: fuzz_set_executor(&c, i); break;
    default: fuzz_set_routing_scale(&c, i); break;
  }
}

mokLayerConfig_t base_config(Bytes& in, int world) {
  mokLayerConfig_t c = MOK_LAYER_CONFIG_INIT;
  c.world = world;
  c.experts_per_rank = in.range(1, 3);
  c.hidden = in.range(1, 48);
  c.intermediate = in.range(1, 40);
  c.top_k = in.range(1, 3);
  c.max_tokens = in.range(1, 8);
  c.shared_intermediate = in.one_in(3) ? in.range(1, 12) : 0;
  bool mxfp8 = in.one_in(3);
  c.precision = mxfp8 ? mokPrecisionMXFP8 : mokPrecisionBF16;
  static const float limits[] = {0.0f, 7.0f, 0.75f, 1e-3f};
  c.swiglu_limit = limits[in.below(4)];
  static const int paddings[] = {8, 1, 2, 4, 16, 32};
  c.expert_padding = mxfp8 ? 32 : paddings[in.below(6)];
  c.minibatch = c.expert_padding * in.range(1, 3);
  c.macrobatch = c.minibatch * in.range(1, 3);
  c.comm_workers = in.range(1, 2);
  c.compute_workers = in.range(1, 2);
  c.timeout_ms = kTimeoutMs;
  return c;
}

// ---- one rank's buffers -------------------------------------------------------------------------

struct Weights {
  std::vector<Block> blocks;
  mokLayerWeights_t w = MOK_LAYER_WEIGHTS_INIT;
  int64_t eih = 0, sih = 0;

  const uint8_t* add(size_t bytes, uint32_t seed, bool bf16) {
    blocks.emplace_back(bytes, 0, 16);
    if (bf16)
      fill_bf16(blocks.back(), seed, false);
    else
      fill_bytes(blocks.back(), seed);  // any byte is a valid e4m3 or e8m0 code (NaN ones included)
    return blocks.back().p();
  }

  void make(const mokLayerConfig_t& c, uint32_t seed) {
    int64_t E = c.experts_per_rank, I = c.intermediate, H = c.hidden;
    eih = E * I * H;
    sih = static_cast<int64_t>(c.shared_intermediate) * H;
    if (c.precision == mokPrecisionMXFP8) {
      // The SM100 layout's bytes per matrix: rows padded to 128, blocks of 32 to 4 (docs/mxfp8.md).
      size_t sh = static_cast<size_t>(E * mx_scale_bytes(I, H)), si = static_cast<size_t>(E * mx_scale_bytes(H, I));
      mokMxfp8Matrix_t* m[6] = {&w.gate_rowwise, &w.gate_colwise, &w.up_rowwise,
                                &w.up_colwise,   &w.down_rowwise, &w.down_colwise};
      size_t scales[6] = {sh, si, sh, si, si, sh};  // blocks along H for gate/up rowwise, along I otherwise
      for (int i = 0; i < 6; ++i) *m[i] = {add(eih, seed + i, false), add(scales[i], seed + 10 + i, false)};
    } else {
      w.gate = add(eih * 2, seed, true);
      w.up = add(eih * 2, seed + 1, true);
      w.down = add(eih * 2, seed + 2, true);
    }
    if (sih) {
      w.shared_gate = add(sih * 2, seed + 3, true);
      w.shared_up = add(sih * 2, seed + 4, true);
      w.shared_down = add(sih * 2, seed + 5, true);
    }
  }
};

struct Rank {
  mokLayerConfig_t config;
  bool sized = false;  // GetSizes accepted the config
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  Block workspace;
  mokLayer_t layer = nullptr;
  Weights weights;
  int tokens = 0;  // of the last schedule this rank passed valid arguments to
  int fault = 0;   // its memory fault (below)
};

// ---- calls ---------------------------------------------------------------------------------------

enum Kind { kSchedule, kForward, kBackward, kRecompute, kSlots, kError, kAbort, kKinds };

struct Op {
  Kind kind;
  int victim;  // the rank given a bad argument, -1 for none
  int fault;
  uint32_t seed;
  bool specials;                // NaN / Inf in the data
  int tokens[kMaxThreads];      // schedule: each rank's token count, as a fraction of max_tokens
  bool int64_ids[kMaxThreads];  // schedule: the id type of each rank
};

bool collective(Kind k) {
  return k == kSchedule || k == kForward || k == kBackward || k == kRecompute;
}

// The pointer of a block, or NULL / a misaligned copy when this call's fault says so.
struct Arg {
  Block block;
  void* ptr;
  bool bad;  // NULL or misaligned where the rule needs a pointer: the call must reject it
};

Arg make_arg(size_t bytes, size_t align, bool null, bool misalign) {
  Arg a{Block(bytes, misalign && align > 1 ? 1 : 0, 16), nullptr, false};
  a.block.fill(kCanary);
  a.ptr = null ? nullptr : a.block.p();
  a.bad = bytes > 0 && (null || (misalign && align > 1));
  return a;
}

mokStatus_t call_schedule(Rank& r, int rank, const Op& op) {
  const mokLayerConfig_t& c = r.config;
  int tokens = op.tokens[rank] % (c.max_tokens + 1);
  bool mine = op.victim == rank, int64_ids = op.int64_ids[rank];
  int type = int64_ids ? mokIndexInt64 : mokIndexInt32;
  int64_t n = static_cast<int64_t>(tokens) * c.top_k, experts = static_cast<int64_t>(c.world) * c.experts_per_rank;
  int what = mine ? op.fault % 6 : -1;
  bool bad = false;
  if (what == 4) {  // num_tokens outside [0, max_tokens]
    static const int wrong[] = {-1, 0, std::numeric_limits<int>::max(), std::numeric_limits<int>::min()};
    tokens = (op.seed & 3) == 1 ? c.max_tokens + 1 : wrong[op.seed & 3];
    bad = tokens < 0 || tokens > c.max_tokens;
    n = bad ? 0 : static_cast<int64_t>(tokens) * c.top_k;
  }
  if (what == 5) type = mokIndexInt64, int64_ids = true;
  Arg ids = make_arg(static_cast<size_t>(n) * (int64_ids ? 8 : 4), int64_ids ? 8 : 4, what == 0, what == 1);
  bad |= ids.bad;
  uint32_t s = op.seed + rank * 7919u;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    int64_t id = static_cast<int64_t>(s >> 8) % (experts + 1) - 1;  // -1 (no route) or an expert
    if (int64_ids)
      std::memcpy(ids.block.p() + i * 8, &id, 8);
    else {
      int32_t v = static_cast<int32_t>(id);
      std::memcpy(ids.block.p() + i * 4, &v, 4);
    }
  }
  if ((what == 3 || what == 5) && n > 0) {  // one id out of range; with 5, a valid id plus 2^32 (int32 reads it valid)
    static const int64_t wrong[] = {-2, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), 0};
    int64_t id = what == 5 ? (1ll << 32) + (op.seed % experts) : (op.seed & 3) == 3 ? experts : wrong[op.seed & 3];
    int64_t at = static_cast<int64_t>(op.seed >> 4) % n;
    if (int64_ids)
      std::memcpy(ids.block.p() + at * 8, &id, 8);
    else {
      int32_t v = static_cast<int32_t>(id);
      std::memcpy(ids.block.p() + at * 4, &v, 4);
    }
    bad = true;
  }
  if (what == 2) {
    static const int types[] = {2, -1, 255, 1 << 20};
    type = types[op.seed & 3];
    bad = true;
  }
  mokStatus_t st = checked(fuzz_build_schedule(r.layer, ids.ptr, type, tokens), rank, "mokLayerBuildSchedule");
  expect_rejected(st, bad, rank, "mokLayerBuildSchedule", "a bad argument");
  if (!bad) r.tokens = tokens;  // the context now describes this schedule, whatever the group did
  return st;
}

// Weights as given to one call: the rank's own, or with one fault.
mokLayerWeights_t weights_for(Rank& r, int what, uint32_t seed, bool* bad, Block& spare) {
  mokLayerWeights_t w = r.weights.w;
  bool mx = r.config.precision == mokPrecisionMXFP8;
  switch (what) {
    case 0: w.size = sizeof(w) - 4, *bad = true; break;  // no layout (sizeof - 8 is an older one)
    case 1:                                              // a routed weight missing (bf16: NULL, MXFP8: its scales)
      if (mx)
        w.up_colwise.scales = nullptr;
      else
        w.down = nullptr;
      *bad = true;
      break;
    case 2:  // a routed bf16 weight off its 2-byte alignment
      if (!mx) {
        spare = Block(static_cast<size_t>(r.weights.eih) * 2, 1, 16);
        fill_bf16(spare, seed, false);
        w.gate = spare.p();
        *bad = r.weights.eih > 0;
      }
      break;
    case 3:  // shared weights without a shared expert, or one of them missing with it
      spare = Block(64, 0, 16);
      if (r.config.shared_intermediate == 0)
        w.shared_up = spare.p();
      else
        w.shared_down = nullptr;
      *bad = true;
      break;
    default: break;
  }
  return w;
}

mokStatus_t call_forward(Rank& r, int rank, const Op& op, bool with_output) {
  const mokLayerConfig_t& c = r.config;
  const char* call = with_output ? "mokLayerForward" : "mokLayerRecompute";
  size_t th = static_cast<size_t>(r.tokens) * c.hidden, tk = static_cast<size_t>(r.tokens) * c.top_k;
  int what = op.victim == rank ? op.fault % 9 : -1;
  bool bad = false, null_weights = what == 8;
  Block spare;
  mokLayerWeights_t w = weights_for(r, what >= 0 && what < 4 ? what : -1, op.seed, &bad, spare);
  Arg x = make_arg(th * 2, 2, what == 4, what == 5);
  fill_bf16(x.block, op.seed ^ rank, op.specials);
  Arg weights = make_arg(tk * 4, 4, what == 6, what == 7);
  fill_f32(weights.block, op.seed + 1 + rank, op.specials);
  Arg out = make_arg(th * 2, 2, false, false);
  mokStatus_t st;
  if (with_output) {
    if (what == 4 || what == 5) {  // the fault moves to out: NULL or misaligned
      x = make_arg(th * 2, 2, false, false);
      fill_bf16(x.block, op.seed ^ rank, op.specials);
      out = make_arg(th * 2, 2, what == 4, what == 5);
    }
    st = mokLayerForward(r.layer, null_weights ? nullptr : &w, x.ptr, static_cast<const float*>(weights.ptr), out.ptr,
                         nullptr);
  } else {
    st = mokLayerRecompute(r.layer, null_weights ? nullptr : &w, x.ptr, nullptr);
  }
  checked(st, rank, call);
  expect_rejected(st, bad || null_weights || x.bad || out.bad || (with_output && weights.bad), rank, call,
                  "a bad argument");
  if (with_output) expect_untouched(st, out.block, rank, call, "out");
  return st;
}

mokStatus_t call_backward(Rank& r, int rank, const Op& op) {
  const mokLayerConfig_t& c = r.config;
  size_t th = static_cast<size_t>(r.tokens) * c.hidden, tk = static_cast<size_t>(r.tokens) * c.top_k;
  int what = op.victim == rank ? op.fault % 13 : -1;
  bool bad = false;
  Block spare;
  mokLayerWeights_t w = weights_for(r, what >= 0 && what < 4 ? what : -1, op.seed, &bad, spare);
  Arg weights = make_arg(tk * 4, 4, what == 4, false);
  fill_f32(weights.block, op.seed + rank, op.specials);
  Arg dout = make_arg(th * 2, 2, false, what == 5);
  fill_bf16(dout.block, op.seed + 3 + rank, op.specials);
  int accumulate = op.seed >> 31;
  if (what == 6) accumulate = (op.seed & 1) ? 2 : -1, bad = true;
  size_t el = accumulate == 1 ? 4 : 2;
  Arg dx = make_arg(th * 2, 2, what == 7, false), dtw = make_arg(tk * 4, 4, false, what == 8);
  std::vector<Arg> dw;
  for (int i = 0; i < 6; ++i) {
    size_t n = static_cast<size_t>(i < 3 ? r.weights.eih : r.weights.sih) * el;
    dw.push_back(make_arg(n, el, what == 9 && i == (op.seed % 6), what == 10 && i == (op.seed % 6)));
  }
  mokLayerGrads_t g = MOK_LAYER_GRADS_INIT;
  g.dx = dx.ptr;
  g.dtopk_weights = static_cast<float*>(dtw.ptr);
  g.accumulate = accumulate;
  void** slots[6] = {&g.dgate, &g.dup, &g.ddown, &g.dshared_gate, &g.dshared_up, &g.dshared_down};
  for (int i = 0; i < 6; ++i) *slots[i] = dw[i].ptr;
  if (c.shared_intermediate == 0)  // no shared expert: its gradients are not given
    for (int i = 3; i < 6; ++i) *slots[i] = nullptr;
  if (what == 11) g.size = sizeof(g) - 4, bad = true;  // no layout (sizeof - 8 is an older one)
  if (what == 12) bad = true;                          // no grads at all
  mokStatus_t st = checked(mokLayerBackward(r.layer, &w, static_cast<const float*>(weights.ptr), dout.ptr,
                                            what == 12 ? nullptr : &g, nullptr),
                           rank, "mokLayerBackward");
  for (const Arg* a : {&weights, &dout, &dx, &dtw}) bad |= a->bad;
  for (const Arg& a : dw) bad |= a.bad && (&a - dw.data() < 3 || c.shared_intermediate > 0);
  expect_rejected(st, bad, rank, "mokLayerBackward", "a bad argument");
  expect_untouched(st, dx.block, rank, "mokLayerBackward", "grads.dx");
  expect_untouched(st, dtw.block, rank, "mokLayerBackward", "grads.dtopk_weights");
  for (int i = 0; i < 6; ++i) expect_untouched(st, dw[i].block, rank, "mokLayerBackward", "a weight gradient");
  return st;
}

void call_slots(Rank& r, int rank, const Op& op) {
  size_t n = static_cast<size_t>(r.tokens) * r.config.top_k * r.config.hidden * 2;
  int what = op.victim == rank ? op.fault % 2 : -1;
  Arg slots = make_arg(n, 2, what == 0, what == 1);
  mokStatus_t st = checked(mokLayerGetSlots(r.layer, slots.ptr, nullptr), rank, "mokLayerGetSlots");
  expect_rejected(st, slots.bad, rank, "mokLayerGetSlots", "a bad y_slots");
  expect_untouched(st, slots.block, rank, "mokLayerGetSlots", "y_slots");
}

void call_error(Rank& r, int rank, const Op& op) {
  int what = op.victim == rank ? op.fault % 3 : -1;
  mokLayerError_t e;
  std::memset(&e, kCanary, sizeof(e));
  const mokLayerError_t init = MOK_LAYER_ERROR_INIT;
  e.magic = init.magic, e.version = init.version;
  e.size = what == 0 ? sizeof(e) - 4 : sizeof(e);
  mokStatus_t st =
      checked(mokLayerGetError(what == 1 ? nullptr : r.layer, what == 2 ? nullptr : &e), rank, "mokLayerGetError");
  expect_rejected(st, what >= 0, rank, "mokLayerGetError", "a bad argument");
  if (rejected(st) && what != 2) {
    auto* bytes = reinterpret_cast<const uint8_t*>(&e);
    for (size_t i = offsetof(mokLayerError_t, status); i < sizeof(e); ++i)
      if (bytes[i] != kCanary) finding("mokLayerGetError on rank %d was rejected but wrote 'error'", rank);
  }
  // A record holds what a failed collective call returned: a wait that ran out, an abort, a mismatch across
  // ranks or a rejected call (docs/c-api.md, Failures of the group). Read only after a successful call: before,
  // the struct holds the canary.
  if (st != mokSuccess) return;
  bool known = e.status == mokSuccess || e.status == mokTimeout || e.status == mokPeerAbort ||
               e.status == mokInvalidArgument || e.status == mokInvalidUsage;
  if (!known) finding("mokLayerGetError on rank %d: record status %d", rank, static_cast<int>(e.status));
}

// ---- Mxfp8Quantize -------------------------------------------------------------------------------

void call_quantize(Bytes& in) {
  int dtype = in.one_in(6) ? static_cast<int>(in.wild()) : in.below(2);
  int64_t dims[3] = {in.range(1, 2), in.range(1, 70), in.range(1, 70)};
  for (int64_t& d : dims)
    if (in.one_in(8)) d = in.wild();
  int shape = in.byte();  // which outputs are given, and whether src is misaligned or NULL
  uint32_t seed = in.word();
  bool valid_dims = dims[0] >= 1 && dims[1] >= 1 && dims[2] >= 1;
  long double count = static_cast<long double>(dims[0]) * dims[1] * dims[2];
  const long double limit = 1099511627776.0l;                    // 2^40, the documented bound of the product
  if (valid_dims && count > (1 << 16) && count < limit) return;  // accepted, and too large to run
  size_t n = valid_dims && count <= (1 << 16) ? static_cast<size_t>(count) : 4;
  size_t el = dtype == mokDataFloat32 ? 4 : 2;
  Arg src = make_arg(n * el, el, (shape & 0x30) == 0x10, (shape & 0x30) == 0x20);
  if (el == 4)
    fill_f32(src.block, seed, (shape & 0x40) != 0);
  else
    fill_bf16(src.block, seed, (shape & 0x40) != 0);
  bool nonfinite = false;
  for (size_t i = 0; i < n; ++i) {
    float v;
    if (el == 4) {
      std::memcpy(&v, src.block.p() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, src.block.p() + 2 * i, 2);
      uint32_t b = static_cast<uint32_t>(h) << 16;
      std::memcpy(&v, &b, 4);
    }
    nonfinite |= !std::isfinite(v);
  }
  bool real = valid_dims && count <= (1 << 16);  // otherwise the call must reject: small dummy outputs
  size_t rows = real ? static_cast<size_t>(dims[1]) : 1, cols = real ? static_cast<size_t>(dims[2]) : 1;
  size_t batch = real ? static_cast<size_t>(dims[0]) : 1;
  int row_mode = shape & 3,
      col_mode = (shape >> 2) & 3;  // 0: data and scales, 1: neither, 2: data only, 3: scales only
  Arg rd = make_arg(n, 1, row_mode == 1 || row_mode == 3, false);
  Arg rs = make_arg(batch * mx_scale_bytes(rows, cols), 1, row_mode == 1 || row_mode == 2, false);
  Arg cd = make_arg(n, 1, col_mode == 1 || col_mode == 3, false);
  Arg cs = make_arg(batch * mx_scale_bytes(cols, rows), 1, col_mode == 1 || col_mode == 2, false);
  bool pairs_bad = (!rd.ptr != !rs.ptr) || (!cd.ptr != !cs.ptr) || (!rd.ptr && !cd.ptr);
  bool bad = dtype < 0 || dtype > 1 || !valid_dims || count >= limit || src.bad || pairs_bad || nonfinite;
  mokStatus_t st = checked(
      fuzz_quantize(src.ptr, dtype, dims[0], dims[1], dims[2], static_cast<uint8_t*>(rd.ptr),
                    static_cast<uint8_t*>(rs.ptr), static_cast<uint8_t*>(cd.ptr), static_cast<uint8_t*>(cs.ptr)),
      -1, "mokMxfp8Quantize");
  expect_rejected(st, bad, -1, "mokMxfp8Quantize", nonfinite ? "a NaN or Inf in src" : "a bad argument");
  for (const Arg* a : {&rd, &rs, &cd, &cs}) expect_untouched(st, a->block, -1, "mokMxfp8Quantize", "an output");
}

// ---- the group ------------------------------------------------------------------------------------

enum MemoryFault {
  kNone,
  kNullBase,
  kMisalignedBase,
  kNoPeers,
  kBothPeers,
  kNullWorkspace,
  kMisalignedWorkspace,
  kShortWorkspace,
  kSmallMemory,
  kBadShmName,
  kMemoryFaults
};

std::string shm_prefix() {
  static std::atomic<unsigned> inputs{0};
  return "mokfuzz-" + std::to_string(getpid()) + "-" + std::to_string(inputs++);
}

void check_sizes(Rank& r, int rank) {
  mokLayerSizes_t s;
  std::memset(&s, kCanary, sizeof(s));
  const mokLayerSizes_t init = MOK_LAYER_SIZES_INIT;
  s.size = init.size, s.magic = init.magic, s.version = init.version;
  mokStatus_t st = checked(mokLayerGetSizes(&r.config, &s), rank, "mokLayerGetSizes");
  int routing_scale = fuzz_routing_scale(&r.config);  // an enum past its range is refused, whatever else holds
  if (st == mokSuccess && (routing_scale < 0 || routing_scale >= mokNumRoutingScales))
    finding("mokLayerGetSizes on rank %d accepted config.routing_scale = %d", rank, routing_scale);
  if (st != mokSuccess) {
    auto* b = reinterpret_cast<const uint8_t*>(&s);
    for (size_t i = offsetof(mokLayerSizes_t, peer_bytes); i < sizeof(s); ++i)
      if (b[i] != kCanary) finding("mokLayerGetSizes on rank %d failed but wrote 'sizes'", rank);
    return;
  }
  r.sized = true;
  r.sizes = s;
}

struct Group {
  int threads = 1;
  std::vector<Rank> ranks;
  bool shm = false;
  std::string shm_name;
  std::vector<Block> peers;
  std::vector<void*> bases;
  bool runnable = true;  // every rank's config is small enough to run collective calls
};

void create(Group& g, int rank) {
  Rank& r = g.ranks[rank];
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  size_t need = r.sized ? r.sizes.workspace_bytes : 256;
  r.workspace =
      Block(r.fault == kShortWorkspace && need > 0 ? need - 1 : need, r.fault == kMisalignedWorkspace ? 8 : 0);
  m.workspace = r.fault == kNullWorkspace ? nullptr : r.workspace.p();
  m.workspace_bytes = r.workspace.bytes();
  std::string bad_name = "bad/name";
  if (g.shm)
    m.shm_name = r.fault == kBadShmName ? bad_name.c_str() : g.shm_name.c_str();
  else
    m.peer_bases = g.bases.data();
  if (r.fault == kBadShmName) m.peer_bases = nullptr, m.shm_name = bad_name.c_str();
  if (r.fault == kNoPeers) m.peer_bases = nullptr, m.shm_name = nullptr;
  if (r.fault == kBothPeers) m.peer_bases = g.bases.data(), m.shm_name = g.shm_name.c_str();
  if (r.fault == kSmallMemory) m.size = sizeof(m) - 4;  // no layout of mokLayerMemory_t (sizeof - 8 is its first)
  std::vector<void*> bases = g.bases;                   // this rank's view, perhaps with a bad entry
  bool bad_base = false;
  if (!g.shm && (r.fault == kNullBase || r.fault == kMisalignedBase) && !bases.empty()) {
    int at = (rank + 1) % static_cast<int>(bases.size());
    bases[at] = r.fault == kNullBase ? nullptr : static_cast<char*>(bases[0]) + 8;
    m.peer_bases = bases.data();
    bad_base = at < r.config.world;
  }
  mokLayer_t layer = reinterpret_cast<mokLayer_t>(static_cast<uintptr_t>(0xA5A5A5A5));
  mokStatus_t st = checked(mokLayerCreate(&r.config, &m, &layer), rank, "mokLayerCreate");
  bool bad = !r.sized || bad_base || (r.fault != kNone && r.fault != kNullBase && r.fault != kMisalignedBase);
  expect_rejected(st, bad, rank, "mokLayerCreate", "a bad config or memory");
  if (st != mokSuccess) {
    if (layer != reinterpret_cast<mokLayer_t>(static_cast<uintptr_t>(0xA5A5A5A5)))
      finding("mokLayerCreate on rank %d failed but wrote 'layer'", rank);
    return;
  }
  if (layer == nullptr) finding("mokLayerCreate on rank %d succeeded with a NULL layer", rank);
  r.layer = layer;
  r.weights.make(r.config, static_cast<uint32_t>(rank) * 131u + 17u);
}

bool small_enough(const Rank& r) {
  const mokLayerConfig_t& c = r.config;
  return r.sized && r.sizes.peer_bytes <= kMaxBytes && r.sizes.workspace_bytes <= kMaxBytes &&
         static_cast<int64_t>(c.experts_per_rank) * c.intermediate * c.hidden <= kMaxWeights &&
         static_cast<int64_t>(c.shared_intermediate) * c.hidden <= kMaxWeights && c.timeout_ms <= kLongestTimeoutMs &&
         c.comm_workers + c.compute_workers <= 8 && c.world <= 8;
}

Group decode_group(Bytes& in) {
  Group g;
  g.threads = in.range(1, kMaxThreads);
  mokLayerConfig_t base = base_config(in, g.threads);
  if (in.one_in(4)) {  // one bad value, every rank (reads in order: field, value)
    int field = in.below(kFields);
    int64_t v = in.wild();
    set_field(base, field, v, in);
  }
  for (int r = 0; r < g.threads; ++r) {
    g.ranks.emplace_back();
    g.ranks[r].config = base;
    g.ranks[r].config.rank = r;
  }
  if (g.threads > 1 && in.one_in(3)) {  // one field differs on one rank
    int rank = in.below(g.threads), field = in.below(kFields);
    int64_t v = in.one_in(2) ? in.wild() : static_cast<int64_t>(in.range(1, 3));
    set_field(g.ranks[rank].config, field, v, in);
  }
  g.shm = in.one_in(5);
  if (in.one_in(4)) {  // one rank's memory is wrong
    int rank = in.below(g.threads);
    g.ranks[rank].fault = in.range(1, kMemoryFaults - 1);
  }
  return g;
}

// Peer memory for heap mode: as many zeroed buffers as the largest world any rank names.
void allocate_peers(Group& g) {
  size_t bytes = 64;
  int world = g.threads;
  for (const Rank& r : g.ranks) {
    if (r.sized && r.sizes.peer_bytes <= kMaxBytes) bytes = std::max(bytes, r.sizes.peer_bytes);
    if (r.sized) world = std::max(world, r.config.world);
  }
  for (int r = 0; r < world; ++r) {
    g.peers.emplace_back(bytes, 0);
    g.peers.back().fill(0);
    g.bases.push_back(g.peers.back().p());
  }
}

// Byte 0 (and the end of the input) takes the next step of a training iteration, so short inputs reach the
// backward; other bytes pick any call.
std::vector<Op> decode_ops(Bytes& in, int threads) {
  static const Kind iteration[] = {kSchedule, kForward, kSlots, kBackward, kRecompute, kBackward, kError};
  static const Kind kinds[] = {kSchedule, kForward, kBackward, kRecompute, kSlots, kError, kAbort};
  std::vector<Op> ops(4 + in.below(6));
  size_t step = 0;
  for (Op& op : ops) {
    int k = in.below(16);
    op.kind = k < 9 ? iteration[step++ % 7] : kinds[k - 9];
    op.victim = in.one_in(4) ? in.below(threads) : -1;
    op.fault = in.byte();
    op.seed = in.word();
    op.specials = in.one_in(2);
    for (int r = 0; r < kMaxThreads; ++r) {
      op.tokens[r] = 255 - in.byte();  // 0 reads as most of max_tokens
      op.int64_ids[r] = in.one_in(2);
    }
  }
  return ops;
}

void run_ops(Group& g, int rank, const std::vector<Op>& ops, bool collectives) {
  Rank& r = g.ranks[rank];
  if (!r.layer) return;
  for (const Op& op : ops) {
    if (collective(op.kind) && !collectives) continue;
    switch (op.kind) {
      case kSchedule: call_schedule(r, rank, op); break;
      case kForward: call_forward(r, rank, op, true); break;
      case kRecompute: call_forward(r, rank, op, false); break;
      case kBackward: call_backward(r, rank, op); break;
      case kSlots: call_slots(r, rank, op); break;
      case kError: call_error(r, rank, op); break;
      default:
        if (op.victim == rank) checked(mokLayerAbort(r.layer, nullptr), rank, "mokLayerAbort");
        break;
    }
  }
}

template <class F>
void on_threads(int n, F f) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(f, r);
  for (std::thread& t : threads) t.join();
}

void check_no_segments(const Group& g) {
  if (!g.shm) return;
  for (int r = 0; r <= 72; ++r) {
    std::string path = "/dev/shm/" + g.shm_name + "-" + std::to_string(r);
    struct stat st{};
    if (stat(path.c_str(), &st) == 0) {
      unlink(path.c_str());
      finding("shared-memory segment %s was left behind", path.c_str());
    }
  }
}

void run_group(Bytes& in) {
  Group g = decode_group(in);
  std::vector<Op> ops = decode_ops(in, g.threads);
  if (g.shm) g.shm_name = shm_prefix();
  say("group: %d ranks, %s, %zu calls\n", g.threads, g.shm ? g.shm_name.c_str() : "heap", ops.size());
  for (int r = 0; r < g.threads; ++r) check_sizes(g.ranks[r], r);
  for (const Rank& r : g.ranks) g.runnable = g.runnable && small_enough(r);
  if (!g.runnable) {  // creation only where it cannot wait long or allocate much: a lone rank, checks that fail
    for (int r = 0; r < g.threads; ++r)
      if (!g.ranks[r].sized) create(g, r);
    return;
  }
  allocate_peers(g);
  on_threads(g.threads, [&](int r) { create(g, r); });
  bool everyone = true;
  for (const Rank& r : g.ranks) everyone = everyone && r.layer;
  on_threads(g.threads, [&](int r) { run_ops(g, r, ops, everyone); });
  for (int r = 0; r < g.threads; ++r)
    if (g.ranks[r].layer) checked(mokLayerDestroy(g.ranks[r].layer), r, "mokLayerDestroy");
  check_no_segments(g);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  checked(mokLayerDestroy(nullptr), -1, "mokLayerDestroy(NULL)");
  run_group(in);
  for (int n = in.below(4); n > 0; --n) call_quantize(in);
  return 0;
}
