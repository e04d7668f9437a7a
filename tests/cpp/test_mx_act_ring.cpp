// MXFP8 mode's h, dg and du rings hold the bytes a block-scaled GEMM reads (core/compute_tasks.hpp,
// run_swiglu and run_swiglu_bwd through quantize_ring_block): the SwiGLU stages run here on a pass view
// of core's own workspace layout, one tile at a time, and afterwards every real and padding row of the
// tile, in the ring's bytes at core's offsets, equals the test's own codec (reference.hpp, in double)
// applied to the stage's bf16 outputs: forward h in blocks of 32 along I (the [macrobatch, I] scale
// matrix); backward dg, du, h both along I and, per column, in blocks of 32 ring rows from the tile's
// first row (the tile slot's [I, P] scale matrix, codes in the second half of each row's 2 I bytes).
// Padding rows are zero codes, padding scales 2^0. The operands the consuming GEMMs get (ring_rows for
// down and dgrad_x, ring_columns for the weight gradients) decode to the same values. Inputs carry a
// per-token and a per-channel scale, their product spanning 2^-20 .. 2^20, so a block quantised along
// the wrong dimension or starting a row off has other scales and codes. The workspace starts as 0xA5
// bytes, which no quantised block leaves behind. Each stage runs whole and in parts (core::run_rows, as a CTA's
// threads share it), the parts in both orders: every split must give those bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>

#include "check.hpp"
#include "core/pass.hpp"
#include "reference.hpp"

namespace core = mok::core;
using bf16_t = core::bf16_t;

namespace {

constexpr int kI = 96, kP = 64;       // 3 k blocks (1 of padding per scale tile row), 96 < 128 scale rows
constexpr int kCounts[2] = {50, 77};  // tile 0: 50 rows; tiles 1, 2: 64 and 13 (tile 2 wraps onto slot 0)

core::LayerShape shape() {
  core::LayerShape s{};
  s.world = 1;
  s.experts_per_rank = 2;
  s.hidden = 64;
  s.intermediate = kI;
  s.top_k = 2;
  s.max_tokens = 64;
  s.mxfp8 = 1;
  s.swiglu_limit = 7.0f;
  s.expert_padding = kP;
  s.minibatch = kP;
  s.macrobatch = 2 * kP;
  s.comm_workers = 1;
  s.compute_workers = 1;
  s.form = core::PassForm::fused;  // the tightest scratch: MXFP8's staging alone (the host's holds its GEMMs too)
  return s;
}

struct Mismatches {
  int count = 0;
  std::string first;
  void note(const std::string& what, int64_t row, int64_t col, double got, double want) {
    if (count++ == 0)
      first = what + " at tile row " + std::to_string(row) + ", column " + std::to_string(col) + ": " +
              std::to_string(got) + ", want " + std::to_string(want);
  }
};

// A workspace with core's layout and a pass view over it; tiles 0..2 of the two experts.
struct Fixture {
  core::LayerShape s = shape();
  core::LocalLayout l = core::local_layout(s);
  std::vector<uint64_t> work = std::vector<uint64_t>(l.bytes / 8 + 1);
  std::vector<uint64_t> header = std::vector<uint64_t>(core::kPeerHeaderBytes / 8);
  core::PeerHeader* headers[1];
  core::PassView v;
  Fixture(core::PassKind kind) {
    std::memset(work.data(), 0xA5, work.size() * 8);
    headers[0] = reinterpret_cast<core::PeerHeader*>(header.data());
    char* local = reinterpret_cast<char*>(work.data());
    std::memset(local + l.counters, 0, static_cast<size_t>(core::num_counters(s)) * 4);
    v = core::pass_view_at(s, kind, local, nullptr, headers, nullptr, 64, 3 * kP, 1000000000ull, nullptr);
    int32_t* experts = v.sched.experts;
    experts[0] = kCounts[0], experts[1] = 0, experts[2] = kCounts[1], experts[3] = kP;
  }
  uint8_t* bytes(bf16_t* ring) { return reinterpret_cast<uint8_t*>(ring); }
};

// g, u, dh of one tile's rows: uniform in [-1, 1] times 2^(a_t + b_c), a per token and b per channel in
// [-10, 10]; rows past the tile's real ones hold garbage the stage must not read.
std::vector<uint16_t> draw(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::uniform_int_distribution<int> e(-10, 10);
  std::vector<int> channel(kI);
  for (int& c : channel) c = e(rng);
  std::vector<uint16_t> v(static_cast<size_t>(kP) * kI);
  for (int r = 0; r < kP; ++r) {
    int token = e(rng);
    for (int c = 0; c < kI; ++c)
      v[static_cast<size_t>(r) * kI + c] = ref::bf16_bits(std::ldexp(u(rng), token + channel[c]));
  }
  return v;
}

// The stage's bf16 outputs from core's SwiGLU (the math is not under test here, the bytes are).
struct Outputs {
  std::vector<uint16_t> h, dg, du;
};
Outputs swiglu_outputs(const core::LayerShape& s, const std::vector<uint16_t>& g, const std::vector<uint16_t>& u,
                       const std::vector<uint16_t>& dh, int rows, bool backward) {
  core::Swiglu sw{s.swiglu_limit, nullptr};
  Outputs o{std::vector<uint16_t>(kP * kI, 0), std::vector<uint16_t>(kP * kI, 0), std::vector<uint16_t>(kP * kI, 0)};
  for (int r = 0; r < rows; ++r) {
    size_t at = static_cast<size_t>(r) * kI;
    if (!backward) {
      core::swiglu_row(sw, &g[at], &u[at], kI, &o.h[at]);
      continue;
    }
    std::copy(&g[at], &g[at] + kI, &o.dg[at]);
    std::copy(&u[at], &u[at] + kI, &o.du[at]);
    std::copy(&dh[at], &dh[at] + kI, &o.h[at]);
    core::swiglu_backward_row(sw, &o.dg[at], &o.du[at], &o.h[at], kI);
  }
  return o;
}

ref::Vec values(const std::vector<uint16_t>& v, size_t at, size_t n, size_t stride) {
  ref::Vec out;
  for (size_t i = 0; i < n; ++i) out.push_back(ref::bf16_value(v[at + i * stride]));
  return out;
}

// Tile `tile`'s ring bytes of one output (values: [P, I] bf16, padding rows 0) against the codec: each
// row along I, and with `tokens` each column's 32-row blocks along the tokens.
void check_bytes(Fixture& f, const char* name, bf16_t* ring, const core::MxRing& mx, int64_t tile,
                 const std::vector<uint16_t>& value, bool tokens, Mismatches& bad) {
  const core::LayerShape& s = f.s;
  int64_t at = tile * kP % s.macrobatch, stride = 2 * kI;
  const uint8_t* codes = f.bytes(ring);
  CHECK(mx.rows == codes && mx.tokens == codes + kI && mx.stride == stride);
  core::MxScaleLayout rl = core::ring_row_scales(s, kI), tl = core::ring_token_scales(s, kI);
  std::string what = name;
  for (int r = 0; r < kP; ++r)
    for (int b = 0; b < rl.padded_k_blocks(); ++b) {
      int scale = mx.row_scales[rl.offset(at + r, b)];
      if (b >= rl.k_blocks) {
        if (scale != 127) bad.note(what + " rowwise padding scale", r, b * 32, scale, 127);
        continue;
      }
      ref::MxBlock q = ref::mx_quantize(values(value, static_cast<size_t>(r) * kI + b * 32, 32, 1));
      if (scale != q.exponent + 127) bad.note(what + " rowwise scale", r, b * 32, scale, q.exponent + 127);
      for (int i = 0; i < 32; ++i) {
        int code = codes[(at + r) * stride + b * 32 + i];
        if (code != q.codes[i]) bad.note(what + " rowwise code", r, b * 32 + i, code, q.codes[i]);
      }
    }
  if (!tokens) return;
  const uint8_t* ts = mx.token_scales + (at / kP) * tl.matrix_bytes();
  for (int k = 0; k < kP / 32; ++k)
    for (int c = 0; c < kI; ++c) {
      ref::MxBlock q = ref::mx_quantize(values(value, static_cast<size_t>(k) * 32 * kI + c, 32, kI));
      int scale = ts[tl.offset(c, k)];
      if (scale != q.exponent + 127) bad.note(what + " token scale", k * 32, c, scale, q.exponent + 127);
      for (int r = 0; r < 32; ++r) {
        int code = codes[(at + k * 32 + r) * stride + kI + c];
        if (code != q.codes[r]) bad.note(what + " token code", k * 32 + r, c, code, q.codes[r]);
      }
    }
  for (int64_t c = 0; c < tl.padded_rows(); ++c)  // past P / 32 k blocks and past I rows
    for (int64_t b = 0; b < tl.padded_k_blocks(); ++b)
      if ((c >= kI || b >= tl.k_blocks) && ts[tl.offset(c, b)] != 127)
        bad.note(what + " token padding scale", c, b * 32, ts[tl.offset(c, b)], 127);
}

// The rowwise operand a consuming GEMM (down, dgrad_x) reads, decoded, against the codec's round trip
// of each real row along I.
void check_rows(const char* name, const core::Operand& o, const std::vector<uint16_t>& value, int rows,
                Mismatches& bad) {
  for (int r = 0; r < rows; ++r) {
    ref::Vec want = ref::mx_round_trip(values(value, static_cast<size_t>(r) * kI, kI, 1));
    for (int c = 0; c < kI; ++c) {
      double got = core::stored_value(o, r, c);
      if (got != want[c]) bad.note(std::string(name) + " rows operand", r, c, got, want[c]);
    }
  }
}

// The weight gradients' operand from channel `first` on (as add_tile cuts it), decoded, against the
// codec's round trip of each column's 32-row blocks along the tokens (padding rows zeros), real rows only.
void check_columns(const char* name, const core::Operand& o, int first, const std::vector<uint16_t>& value, int rows,
                   Mismatches& bad) {
  for (int c = first; c < kI; ++c)
    for (int k = 0; k < kP / 32; ++k) {
      ref::Vec want = ref::mx_round_trip(values(value, static_cast<size_t>(k) * 32 * kI + c, 32, kI));
      for (int r = 0; r < 32 && k * 32 + r < rows; ++r) {
        double got = core::stored_value(o, c - first, k * 32 + r);
        if (got != want[r]) bad.note(std::string(name) + " columns operand", k * 32 + r, c, got, want[r]);
      }
    }
}

void put_rows(Fixture& f, bf16_t* ring, int64_t tile, const std::vector<uint16_t>& value) {
  for (int r = 0; r < kP; ++r)
    std::memcpy(core::ring_row(f.v, ring, tile * kP + r, kI), &value[static_cast<size_t>(r) * kI], kI * 2);
}

// The stages' row jobs run as `parts` parts one after another, the last first when `reverse`: as a CTA's threads
// share them (core::run_rows): a part computes and quantises its own (row, scale block) pairs (the forward), or a
// block is staged whole by one job and quantised by the next (the backward).
struct PartedRows {
  float* scratch;
  int parts;
  bool reverse;
  void rows(const core::PassView& v, const core::RowJob& job) const {
    for (int i = 0; i < parts; ++i) core::run_rows(v, job, core::Part{reverse ? parts - 1 - i : i, parts});
  }
};

void run_tiles(bool backward, int parts, bool reverse) {
  std::mt19937_64 rng(mok_test::seed() + backward);
  Fixture f(backward ? core::PassKind::backward : core::PassKind::forward);
  core::PassView& v = f.v;
  core::TaskKind kind = backward ? core::TaskKind::swiglu_bwd : core::TaskKind::swiglu;
  uint32_t start = core::stage_start(f.s, v.kind, kind);
  // The worker's scratch as its layout sizes it, then guard words that no stage may write.
  constexpr size_t kGuard = 64;
  constexpr uint32_t kGuardWord = 0x7fa5a5a5u;
  std::vector<uint32_t> scratch(f.l.scratch_floats + kGuard, kGuardWord);
  for (int64_t tile = 0; tile < 3; ++tile) {
    std::vector<uint16_t> g = draw(rng), u = draw(rng), dh = draw(rng);
    put_rows(f, v.ring_g, tile, g);
    put_rows(f, v.ring_u, tile, u);
    put_rows(f, v.ring_h, tile, dh);
    v.c.stage[tile] = start;
    core::TileInfo t = core::tile_info(v, core::Task{kind, 0, static_cast<int32_t>(tile)}, kI);
    CHECK(t.rows == (tile == 0 ? 50 : tile == 1 ? 64 : 13));
    PartedRows ops{reinterpret_cast<float*>(scratch.data()), parts, reverse};
    core::Failure failure = backward ? core::run_swiglu_bwd(v, t, ops) : core::run_swiglu(v, t, ops);
    CHECK(failure.ok());
    for (size_t i = f.l.scratch_floats; i < scratch.size(); ++i)
      CHECK_MSG(scratch[i] == kGuardWord, "the stage wrote past its scratch of %zu floats, at %zu", f.l.scratch_floats,
                i);
    Outputs o = swiglu_outputs(f.s, g, u, dh, t.rows, backward);
    Mismatches bad;
    check_bytes(f, "h", v.ring_h, v.mx_h, tile, o.h, backward, bad);
    check_rows("h", core::ring_rows(v, v.ring_h, v.mx_h, t.row0, kI), o.h, t.rows, bad);
    if (backward) {
      check_bytes(f, "dg", v.ring_g, v.mx_g, tile, o.dg, true, bad);
      check_bytes(f, "du", v.ring_u, v.mx_u, tile, o.du, true, bad);
      check_rows("dg", core::ring_rows(v, v.ring_g, v.mx_g, t.row0, kI), o.dg, t.rows, bad);
      check_rows("du", core::ring_rows(v, v.ring_u, v.mx_u, t.row0, kI), o.du, t.rows, bad);
      for (int first : {0, 32}) {
        check_columns("h", core::from_row(core::ring_columns(v, v.ring_h, v.mx_h, t.row0, kI), first), first, o.h,
                      t.rows, bad);
        check_columns("dg", core::from_row(core::ring_columns(v, v.ring_g, v.mx_g, t.row0, kI), first), first, o.dg,
                      t.rows, bad);
        check_columns("du", core::from_row(core::ring_columns(v, v.ring_u, v.mx_u, t.row0, kI), first), first, o.du,
                      t.rows, bad);
      }
    }
    CHECK_MSG(bad.count == 0, "%s tile %d, %d parts%s: %d mismatches, first: %s", backward ? "backward" : "forward",
              static_cast<int>(tile), parts, reverse ? " last first" : "", bad.count, bad.first.c_str());
  }
}

// Whole, and in parts in both orders (I = 96: 3 column blocks and a padding block, 128 pairs and 128 columns; 200
// parts leave 72 with none).
struct Split {
  int parts;
  bool reverse;
};
constexpr Split kSplits[] = {{1, false}, {2, true}, {3, false}, {3, true}, {8, true}, {200, true}};

TEST(forward_h_ring_bytes_equal_the_codec_of_swiglu_rowwise) {
  for (Split split : kSplits) run_tiles(false, split.parts, split.reverse);
}

TEST(backward_dg_du_h_ring_bytes_equal_the_codec_in_both_orientations) {
  for (Split split : kSplits) run_tiles(true, split.parts, split.reverse);
}

}  // namespace

// A CTA's 255 threads share a 32-row block 200 or 256 columns wide (core::quantize_ring_block, both orientations;
// 200 has a padding scale block and padding columns): each thread alone writes some of the row-direction bytes
// (codes or scales) and some of the token-direction ones, no byte is written by two threads, and together they write
// the whole call's bytes. A split by scale block (a part every 32 columns) leaves all but 8 threads idle and fails
// it. The block is an input here: that no part reads what another writes in one job is the parted ring tests' above.
TEST(every_thread_of_a_cta_quantises_part_of_a_wide_block) {
  std::mt19937_64 rng(mok_test::seed() + 5);
  constexpr int kParts = 255;
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::uniform_int_distribution<int> e(-10, 10);
  for (int width : {200, 256}) {
    std::vector<bf16_t> block(static_cast<size_t>(core::kMxBlock) * width);
    for (bf16_t& value : block) value = ref::bf16_bits(std::ldexp(u(rng), e(rng)));
    core::MxScaleLayout rows = core::MxScaleLayout::of(core::kMxBlock, width);
    core::MxScaleLayout tokens = core::MxScaleLayout::of(width, core::kMxBlock);
    // The bytes one call writes, found by running it over two fills: the row direction's codes and scales, then the
    // token direction's.
    using Bytes = std::vector<std::vector<int>>;  // -1: not written
    auto quantise = [&](int part, int parts) {
      std::vector<std::vector<uint8_t>> runs[2];
      for (int fill : {0xA5, 0x5A}) {
        std::vector<std::vector<uint8_t>> b = {
            std::vector<uint8_t>(block.size(), fill), std::vector<uint8_t>(rows.matrix_bytes(), fill),
            std::vector<uint8_t>(block.size(), fill), std::vector<uint8_t>(tokens.matrix_bytes(), fill)};
        core::quantize_ring_block(core::kMxBlock, core::kMxBlock, width, 0, block.data(), b[0].data(), b[1].data(),
                                  b[2].data(), b[3].data(), width, part, parts);
        runs[fill == 0x5A] = b;
      }
      Bytes written(4);
      for (int a = 0; a < 4; ++a)
        for (size_t i = 0; i < runs[0][a].size(); ++i)
          written[a].push_back(runs[0][a][i] == runs[1][a][i] ? runs[0][a][i] : -1);
      return written;
    };
    auto count = [](const std::vector<int>& bytes) {
      return std::count_if(bytes.begin(), bytes.end(), [](int x) { return x >= 0; });
    };
    Bytes whole = quantise(0, 1), joined(4);
    for (int a = 0; a < 4; ++a) joined[a].assign(whole[a].size(), -1);
    int idle_rows = 0, idle_tokens = 0, twice = 0;
    for (int part = 0; part < kParts; ++part) {
      Bytes mine = quantise(part, kParts);
      idle_rows += count(mine[0]) + count(mine[1]) == 0;
      idle_tokens += count(mine[2]) + count(mine[3]) == 0;
      for (int a = 0; a < 4; ++a)
        for (size_t i = 0; i < mine[a].size(); ++i)
          if (mine[a][i] >= 0) {
            twice += joined[a][i] >= 0;
            joined[a][i] = mine[a][i];
          }
    }
    CHECK_MSG(idle_rows == 0 && idle_tokens == 0,
              "width %d: of %d threads, %d quantise nothing along the rows, %d along the tokens", width, kParts,
              idle_rows, idle_tokens);
    CHECK_MSG(twice == 0, "width %d: %d bytes written by two threads", width, twice);
    CHECK_MSG(joined == whole, "width %d: the threads' bytes are not the whole call's", width);
  }
}

MOK_TEST_MAIN
