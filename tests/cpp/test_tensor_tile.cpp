// core's tensor-core tile (core/tensor_tile.hpp) run on the host as the fused executor's CTA runs it: the chunks and
// blocks of core's walk, the panels filled by core::fill_piece in a shuffled order (threads split them any way), the
// MMA's sum over the panels as core::panel_offset lays them out (test_tensor_tile_cute holds that against CuTe's
// MMA), and core's epilogue; a chunk with a value that is not a bf16 goes to core::gemm_element.
//
// The tensor cores' order of the fp32 sum is not the contract's, so the emulation sums in double, and the operands
// are integers (bf16, and e4m3 with scales 1 and 2): every partial sum is then exact in fp32 whatever its order, and
// the tile must give reference_gemm's bits. A wrong walk, orientation, offset, padding, part order, bias or epilogue
// changes them.
#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "check.hpp"
#include "core/gemm_element.hpp"
#include "core/tensor_tile.hpp"

using namespace mok_test;
namespace core = mok::core;
using core::kMmaCols;
using core::kMmaDepth;
using core::kMmaRows;
using core::kPanelValues;

namespace {

struct Counts {
  int tensor = 0, elements = 0;  // chunks through the tensor cores, and through gemm_element
};

Counts run_tensor_tile(const core::Gemm& g, std::mt19937_64& rng) {
  Counts n;
  std::vector<core::Piece> pieces(core::kBlockPieces);  // the panels, 16-byte aligned as in shared memory
  core::bf16_t* panels = pieces[0].values;
  std::vector<int> order(core::kBlockPieces);
  std::iota(order.begin(), order.end(), 0);
  std::vector<double> acc(kMmaRows * kMmaCols);
  for (int chunk = 0; chunk < core::tensor_chunks(g); ++chunk) {
    bool exact = true;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int block = 0; block < core::chunk_blocks(g); ++block) {
      core::MmaBlock b = core::chunk_block(g, chunk, block);
      std::fill(panels, panels + 2 * kPanelValues, core::bf16_t(0x7fc0));  // NaN: a value the fill misses shows
      std::shuffle(order.begin(), order.end(), rng);
      for (int p : order) core::fill_piece(g, b, p, panels, exact);
      for (int i = 0; i < kMmaRows; ++i)
        for (int j = 0; j < kMmaCols; ++j)
          for (int k = 0; k < kMmaDepth; ++k)
            acc[i * kMmaCols + j] += static_cast<double>(core::bf16_to_float(panels[core::panel_offset(i, k)])) *
                                     core::bf16_to_float(panels[kPanelValues + core::panel_offset(j, k)]);
    }
    int row0 = core::chunk_row0(g, chunk), col0 = core::chunk_col0(g, chunk);
    if (!exact) core::gemm_elements(g, row0, col0, kMmaRows, kMmaCols, core::kWhole);
    for (int i = 0; exact && i < kMmaRows; ++i)
      for (int j = 0; j < kMmaCols; ++j)
        core::tensor_epilogue(g, row0 + i, col0 + j, static_cast<float>(acc[i * kMmaCols + j]));
    ++(exact ? n.tensor : n.elements);
  }
  return n;
}

// One operand's storage: [rows, depth] values, bf16 (K- or MN-major) or e4m3 (K-major, scales 2^0 or 2^1).
struct Stored {
  std::vector<core::bf16_t> bf16;
  std::vector<uint8_t> codes, scales;
  core::Operand op{};
};

void make_operand(Stored& s, bool e4m3, bool mn_major, int rows, int depth, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> value(-8, 8);
  size_t n = static_cast<size_t>(rows) * depth;
  if (!e4m3) {
    s.bf16.resize(n);
    for (auto& v : s.bf16) v = core::float_to_bf16(static_cast<float>(value(rng)));
    s.op = mn_major ? core::bf16_operand(s.bf16.data(), 1, rows, false)
                    : core::bf16_operand(s.bf16.data(), depth, 1, false);
    return;
  }
  core::MxScaleLayout layout = core::MxScaleLayout::of(rows, depth);
  s.codes.resize(n);
  for (auto& c : s.codes) c = core::e4m3_encode(static_cast<float>(value(rng)));
  s.scales.assign(static_cast<size_t>(layout.matrix_bytes()), core::kMxPadScale);
  for (int r = 0; r < rows; ++r)
    for (int64_t b = 0; b < layout.k_blocks; ++b)
      s.scales[layout.offset(r, b)] = core::e8m0_encode(static_cast<int>(rng() % 2));
  s.op = core::e4m3_operand(s.codes.data(), depth, s.scales.data(), layout);
}

struct TileCase {
  std::vector<Stored> operands;
  std::vector<core::bf16_t> bias;
  std::vector<float> c;  // bf16 values as floats' room, or the fp32 sums
  core::Gemm g{};
  std::string text;
};

void make_case(TileCase& t, std::mt19937_64& rng) {
  core::Gemm& g = t.g;
  g.rows = 1 + static_cast<int>(rng() % 300);
  g.cols = 1 + static_cast<int>(rng() % 300);
  g.num_parts = 1 + static_cast<int>(rng() % 2);
  g.epilogue = rng() % 2 ? core::Epilogue::store_bf16 : core::Epilogue::accumulate_f32;
  t.text = std::to_string(g.rows) + "x" + std::to_string(g.cols);
  t.operands.resize(2 * g.num_parts);
  for (int p = 0; p < g.num_parts; ++p) {
    int depth = 1 + static_cast<int>(rng() % 200);
    if (rng() % 2) depth = (depth + 7) / 8 * 8;  // K-major bf16 rows on 16 bytes: fill_piece's one copy
    bool a_e4m3 = rng() % 2, b_e4m3 = rng() % 2, a_mn = rng() % 2, b_mn = rng() % 2;
    make_operand(t.operands[2 * p], a_e4m3, a_mn, g.rows, depth, rng);
    make_operand(t.operands[2 * p + 1], b_e4m3, b_mn, g.cols, depth, rng);
    g.parts[p] = core::GemmPart{t.operands[2 * p].op, t.operands[2 * p + 1].op, depth};
    t.text += "; part " + std::to_string(p) + " depth " + std::to_string(depth) +
              (a_e4m3 ? " a e4m3"
               : a_mn ? " a bf16 MN"
                      : " a bf16") +
              (b_e4m3 ? " b e4m3"
               : b_mn ? " b bf16 MN"
                      : " b bf16");
  }
  g.c_stride = g.cols + static_cast<int>(rng() % 3);
  std::uniform_int_distribution<int> value(-64, 64);
  t.c.resize(static_cast<size_t>(g.rows) * g.c_stride);
  for (float& v : t.c) v = static_cast<float>(value(rng));
  g.c = t.c.data();
  if (g.epilogue == core::Epilogue::store_bf16 && rng() % 2) {
    t.bias.resize(static_cast<size_t>(g.cols));
    for (auto& b : t.bias) b = core::float_to_bf16(static_cast<float>(value(rng)));
    g.bias = t.bias.data();
    t.text += "; bias";
  }
  t.text += g.epilogue == core::Epilogue::store_bf16 ? "; store bf16" : "; accumulate fp32";
}

// The tile's c against reference_gemm's from the same start, every word.
bool same_as_reference(TileCase& t, std::mt19937_64& rng, Counts* counts) {
  std::vector<float> start = t.c, scratch(core::gemm_scratch_floats(t.g.rows, t.g.cols, 400, true));
  *counts = run_tensor_tile(t.g, rng);
  std::vector<float> tiled = t.c;
  t.c = start;
  core::reference_gemm(t.g, scratch.data());
  size_t wrong = 0, first = 0;
  for (size_t e = 0; e < t.c.size(); ++e)
    if (core::float_bits(tiled[e]) != core::float_bits(t.c[e]) && wrong++ == 0) first = e;
  CHECK_MSG(wrong == 0, "%s: %zu of %zu words differ, the first at %zu: %a, reference %a", t.text.c_str(), wrong,
            t.c.size(), first, static_cast<double>(tiled[first]), static_cast<double>(t.c[first]));
  return wrong == 0;
}

}  // namespace

TEST(tensor_tiles_give_the_references_bits_on_integers) {
  std::mt19937_64 rng(seed() + 7);
  int chunks = 0;
  for (int n = 0; n < 24; ++n) {
    TileCase t;
    make_case(t, rng);
    Counts counts;
    if (!same_as_reference(t, rng, &counts)) return;
    CHECK_MSG(counts.elements == 0, "%s: %d integer chunks left to gemm_element", t.text.c_str(), counts.elements);
    chunks += counts.tensor;
  }
  CHECK_MSG(chunks > 24, "only %d chunks", chunks);
}

// Rows 128 and on of an e4m3 a hold 1.875 x 2^-6 scaled by 2^-127: 1.875 x 2^-133, an fp32 but no bf16 (whose
// subnormals step by 2^-133). Their chunks go to gemm_element, the others to the tensor cores, and the whole tile is
// still reference_gemm's bits.
TEST(chunks_with_values_that_are_not_bf16_are_computed_element_by_element) {
  std::mt19937_64 rng(seed() + 8);
  TileCase t;
  t.g.rows = 200;
  t.g.cols = 100;
  t.g.num_parts = 1;
  t.g.epilogue = core::Epilogue::store_bf16;
  t.g.c_stride = t.g.cols;
  t.operands.resize(2);
  make_operand(t.operands[0], true, false, t.g.rows, 96, rng);
  make_operand(t.operands[1], false, false, t.g.cols, 96, rng);
  Stored& a = t.operands[0];
  core::MxScaleLayout layout = core::MxScaleLayout::of(t.g.rows, 96);
  for (int r = kMmaRows; r < t.g.rows; ++r)
    for (int k = 0; k < 96; ++k) {
      a.codes[static_cast<size_t>(r) * 96 + k] = core::e4m3_encode(1.875f * 0x1p-6f);
      a.scales[layout.offset(r, k / 32)] = 0;  // e8m0 0: 2^-127
    }
  t.g.parts[0] = core::GemmPart{a.op, t.operands[1].op, 96};
  t.c.assign(static_cast<size_t>(t.g.rows) * t.g.c_stride, 0.0f);
  t.g.c = t.c.data();
  t.text = "200x100, rows 128.. below bf16";
  CHECK(core::stored_value(a.op, 150, 3) == 1.875f * 0x1p-133f);
  Counts counts;
  if (!same_as_reference(t, rng, &counts)) return;
  CHECK_MSG(counts.tensor == 1 && counts.elements == 1, "%d tensor chunks, %d element chunks", counts.tensor,
            counts.elements);
}

// What the tensor cores cannot take stays with gemm_element: an MXFP8 round trip on read, an fp32 operand, no depth.
TEST(tensor_gemm_refuses_what_the_tensor_cores_cannot_take) {
  std::vector<core::bf16_t> x(64, 0x3f80);
  std::vector<float> f(64, 1.0f);
  core::Operand bf = core::bf16_operand(x.data(), 8, 1, false);
  core::Gemm g{};
  g.rows = g.cols = 8;
  g.num_parts = 1;
  g.parts[0] = core::GemmPart{bf, bf, 8};
  CHECK(core::tensor_gemm(g));
  g.parts[0].a.quantize = true;
  CHECK(!core::tensor_gemm(g));
  g.parts[0].a = bf;
  g.parts[0].b.dtype = core::Dtype::f32;
  g.parts[0].b.data = f.data();
  CHECK(!core::tensor_gemm(g));
  g.parts[0].b = bf;
  g.parts[0].depth = 0;
  CHECK(!core::tensor_gemm(g));
}

MOK_TEST_MAIN
