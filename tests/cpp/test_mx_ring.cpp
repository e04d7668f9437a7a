// MXFP8 mode's x and dy rings hold the bytes a block-scaled GEMM reads (core/comm_tasks.hpp,
// quantize_ring_block): after a forward and a backward through the C ABI, every ring row's e4m3 codes
// and e8m0 scales, read from the caller's workspace at core's offsets, equal the test's own codec
// (reference.hpp, in double) applied to the bf16 rows it dispatched, in both orientations: each row in
// blocks of 32 along H (the [macrobatch, H] scale matrix), and each column in blocks of 32 ring rows
// from its tile's first row (per tile slot, the [H, P] scale matrix); padding rows are zeros and every
// padding scale is 2^0. Tokens carry scales 2^-20 .. 2^20, so a block quantised along the wrong
// dimension, or starting a row off, has other scales and codes. The workspace starts as 0xA5 bytes,
// which no quantised row leaves behind. A second backward, which dispatches x again where the first
// kept the forward's, gives the same bits. Every case runs whole and with the row jobs in parts
// (MOK_HOST_ROW_PARTS).
#include <cstring>

#include "core/pass_view.hpp"
#include "group.hpp"

using namespace mok_test;
using mok::core::MxScaleLayout;

namespace {

constexpr int kH = 96, kI = 64, kExperts = 3, kTokens = 90, kTopK = 2;

// x or dout of one token: uniform in [-1, 1] times 2^s, s drawn per token in [-20, 20].
std::vector<uint16_t> scaled_rows(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::uniform_int_distribution<int> s(-20, 20);
  std::vector<uint16_t> v(static_cast<size_t>(kTokens) * kH);
  for (int t = 0; t < kTokens; ++t) {
    double scale = std::ldexp(1.0, s(rng));
    for (int c = 0; c < kH; ++c) v[static_cast<size_t>(t) * kH + c] = ref::bf16_bits(u(rng) * scale);
  }
  return v;
}

struct Mismatches {
  int count = 0;
  std::string first;
  void note(const char* what, int64_t row, int64_t col, int got, int want) {
    if (count++ == 0)
      first = std::string(what) + " at ring row " + std::to_string(row) + ", column " + std::to_string(col) + ": " +
              std::to_string(got) + ", want " + std::to_string(want);
  }
};

// The ring in `work` against the bf16 rows it should hold: value(j) gives ring row j's H values (its
// dispatched row, empty for a padding row). Checks each ring row's last occupant.
template <class Value>
Mismatches check_ring(const char* name, const mok::core::LayerShape& s, const char* work,
                      const mok::core::MxRingLayout& l, int64_t total, Value value) {
  const uint8_t *rows = reinterpret_cast<const uint8_t*>(work + l.rows),
                *row_scales = reinterpret_cast<const uint8_t*>(work + l.row_scales),
                *tokens = reinterpret_cast<const uint8_t*>(work + l.tokens),
                *token_scales = reinterpret_cast<const uint8_t*>(work + l.token_scales);
  MxScaleLayout rl = mok::core::ring_row_scales(s), tl = mok::core::ring_token_scales(s);
  int64_t M = s.macrobatch, P = s.expert_padding;
  Mismatches bad;
  std::string what = name;
  for (int64_t slot = 0; slot < M && slot < total; slot += 32) {
    int64_t j0 = slot + (total - 1 - slot) / M * M;  // the block's rows last written (total % 32 == 0)
    std::vector<ref::Vec> block;
    for (int r = 0; r < 32; ++r) {
      ref::Vec v = value(j0 + r);
      block.push_back(v.empty() ? ref::Vec(kH, 0.0) : v);
    }
    for (int r = 0; r < 32; ++r)  // rowwise: blocks of 32 along H
      for (int b = 0; b < rl.padded_k_blocks(); ++b) {
        int64_t at = slot + r;
        int scale = row_scales[rl.offset(at, b)];
        if (b >= rl.k_blocks) {
          if (scale != 127) bad.note((what + " rowwise padding scale").c_str(), at, b * 32, scale, 127);
          continue;
        }
        ref::Vec part(block[r].begin() + b * 32, block[r].begin() + std::min(kH, (b + 1) * 32));
        ref::MxBlock q = ref::mx_quantize(part);
        if (scale != q.exponent + 127) bad.note((what + " rowwise scale").c_str(), at, b * 32, scale, q.exponent + 127);
        for (size_t i = 0; i < part.size(); ++i) {
          int code = rows[at * kH + b * 32 + static_cast<int64_t>(i)];
          if (code != q.codes[i]) bad.note((what + " rowwise code").c_str(), at, b * 32 + i, code, q.codes[i]);
        }
      }
    const uint8_t* ts = token_scales + (slot / P) * tl.matrix_bytes();
    int64_t k_block = (slot % P) / 32;
    for (int c = 0; c < kH; ++c) {  // token-direction: each column's 32 rows
      ref::Vec column;
      for (int r = 0; r < 32; ++r) column.push_back(block[r][c]);
      ref::MxBlock q = ref::mx_quantize(column);
      int scale = ts[tl.offset(c, k_block)];
      if (scale != q.exponent + 127) bad.note((what + " token scale").c_str(), slot, c, scale, q.exponent + 127);
      for (int r = 0; r < 32; ++r) {
        int code = tokens[(slot + r) * kH + c];
        if (code != q.codes[r]) bad.note((what + " token code").c_str(), slot + r, c, code, q.codes[r]);
      }
    }
    if (slot % P == 0)  // the slot's padding scales: k blocks past P / 32 and rows past H
      for (int64_t c = 0; c < tl.padded_rows(); ++c)
        for (int64_t b = 0; b < tl.padded_k_blocks(); ++b)
          if ((c >= kH || b >= tl.k_blocks) && ts[tl.offset(c, b)] != 127)
            bad.note((what + " token padding scale").c_str(), slot, c, ts[tl.offset(c, b)], 127);
  }
  return bad;
}

void run_case(int padding, int minibatch, int macrobatch, uint64_t salt, const char* parts) {
  setenv("MOK_HOST_ROW_PARTS", parts, 1);  // read at creation
  std::mt19937_64 rng(seed() + salt);
  Spec spec;
  spec.world = 1;
  spec.experts = kExperts;
  spec.hidden = kH;
  spec.inter = kI;
  spec.top_k = kTopK;
  spec.max_tokens = kTokens;
  spec.ragged = false;
  spec.mxfp8 = true;
  ref::Problem p = make_problem(spec, rng);
  p.x[0] = scaled_rows(rng);
  p.dout[0] = scaled_rows(rng);
  Knobs k = mxfp8_knobs();
  k.padding = padding;
  k.minibatch = minibatch;
  k.macrobatch = macrobatch;
  mokLayerSizes_t sizes = sizes_for(p, k);
  AlignedBuffer peer(sizes.peer_bytes), work(sizes.workspace_bytes);
  std::memset(work.p, 0xA5, sizes.workspace_bytes);  // no quantised row leaves these bytes
  mokLayerConfig_t c = config_for(p, k, 0);
  auto step = [](mokStatus_t status, const char* call) {
    CHECK_MSG(status == mokSuccess, "%s: %s", call, mokGetLastError());
    return status == mokSuccess;
  };
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  void* bases[1] = {peer.p};
  m.peer_bases = bases;
  m.workspace = work.p;
  m.workspace_bytes = sizes.workspace_bytes;
  mokLayer_t layer = nullptr;
  if (!step(mokLayerCreate(&c, &m, &layer), "create")) return;
  MxWeights mx;
  mokLayerWeights_t w = MOK_LAYER_WEIGHTS_INIT;
  mx.wire(p, 0, w);
  std::vector<int32_t> ids(p.ids[0].begin(), p.ids[0].end());
  std::vector<uint16_t> out(static_cast<size_t>(kTokens) * kH);
  mok::core::LayerShape s = shape_of(c);
  mok::core::LocalLayout l = mok::core::local_layout(s);
  const char* ws = static_cast<const char*>(work.p);
  const auto* experts = reinterpret_cast<const int32_t*>(ws + l.schedule_experts);
  const auto* refs = reinterpret_cast<const mok::core::RowRef*>(ws + l.rows);
  auto x_of = [&](int64_t j) {
    mok::core::RowRef r = refs[j];
    return r.rank < 0 ? ref::Vec() : ref::values(p.x[0], static_cast<size_t>(r.token) * kH, kH);
  };
  auto dy_of = [&](int64_t j) {
    mok::core::RowRef r = refs[j];
    if (r.rank < 0) return ref::Vec();
    float wk = p.topk_weights[0][static_cast<size_t>(r.token) * kTopK + r.k];
    ref::Vec v = ref::values(p.dout[0], static_cast<size_t>(r.token) * kH, kH);
    for (double& d : v) d = ref::bf16(static_cast<double>(wk * static_cast<float>(d)));  // w·dout in fp32, bf16
    return v;
  };
  bool ok = step(mokLayerBuildSchedule(layer, ids.data(), mokIndexInt32, kTokens, nullptr), "schedule") &&
            step(mokLayerForward(layer, &w, p.x[0].data(), p.topk_weights[0].data(), out.data(), nullptr), "forward");
  int64_t total = 0;
  for (int e = 0; e < kExperts; ++e)
    total = std::max<int64_t>(total, experts[2 * e + 1] + (experts[2 * e] + padding - 1) / padding * padding);
  // Case 1's ring wraps; case 2's holds every row, so its first backward keeps the forward's x.
  CHECK_MSG((total > macrobatch) == (salt == 1), "case %d/%d/%d: %lld rows", padding, minibatch, macrobatch,
            static_cast<long long>(total));
  if (ok) {
    Mismatches bad = check_ring("x (forward)", s, ws, l.mx_x, total, x_of);
    CHECK_MSG(bad.count == 0, "P %d, minibatch %d, M %d, parts %s: %d mismatches, first: %s", padding, minibatch,
              macrobatch, parts, bad.count, bad.first.c_str());
  }
  Bf16Grads g(p, 0);
  mokLayerGrads_t grads = g.grads();
  ok = ok && step(mokLayerBackward(layer, &w, p.topk_weights[0].data(), p.dout[0].data(), &grads, nullptr), "backward");
  if (ok) {
    for (auto [name, ring, value] : {std::tuple{"x (backward)", l.mx_x, std::function<ref::Vec(int64_t)>(x_of)},
                                     std::tuple{"dy", l.mx_dy, std::function<ref::Vec(int64_t)>(dy_of)}}) {
      Mismatches bad = check_ring(name, s, ws, ring, total, value);
      CHECK_MSG(bad.count == 0, "P %d, minibatch %d, M %d, parts %s: %d mismatches, first: %s", padding, minibatch,
                macrobatch, parts, bad.count, bad.first.c_str());
    }
  }
  // A second backward of the context dispatches x again (the first one kept it when the ring held every
  // row): the same bits either way.
  Bf16Grads again(p, 0, 0x7fc0, -1.0f);
  grads = again.grads();
  ok = ok &&
       step(mokLayerBackward(layer, &w, p.topk_weights[0].data(), p.dout[0].data(), &grads, nullptr), "backward again");
  bool same = g.dx == again.dx && g.dgate == again.dgate && g.dup == again.dup && g.ddown == again.ddown &&
              std::memcmp(g.dw.data(), again.dw.data(), g.dw.size() * sizeof(float)) == 0;
  CHECK_MSG(!ok || same, "P %d, minibatch %d, M %d, parts %s: a second backward gives other bits", padding, minibatch,
            macrobatch, parts);
  mokLayerDestroy(layer);
}

// Whole, and with every row job in parts in both orders (H = 96: 3 column blocks and one of padding, 128 pairs and
// 128 columns to quantise; 200 parts leave 72 with none), as a CTA's threads share them: dispatch stages a block in
// one job and quantises it in the next.
void run_splits(int padding, int minibatch, int macrobatch, uint64_t salt) {
  for (const char* parts : {"1", "3", "-3", "-5", "-200"}) run_case(padding, minibatch, macrobatch, salt, parts);
  unsetenv("MOK_HOST_ROW_PARTS");
}

// Tiles of two token blocks in a ring of two minibatches that wraps (later rows overwrite earlier ones).
TEST(ring_bytes_equal_the_codec_of_the_dispatched_rows_in_both_orientations) {
  run_splits(64, 64, 128, 1);
}

// Tiles of one block, a minibatch per tile, and a ring that holds every row (the backward keeps x).
TEST(one_block_tiles_and_a_ring_that_holds_every_row) {
  run_splits(32, 32, 512, 2);
}

}  // namespace

MOK_TEST_MAIN
