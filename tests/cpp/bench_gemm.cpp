// Throughput of host::gemm (each ISA path) against core::reference_gemm at the layer's tile shapes,
// checking on the way that every path gives the reference's bits. Times are the thread's CPU time;
// still, read the ratios: the machine may be shared. Usage: bench_gemm [--tiny] [repeats]   (--tiny: shapes / 8, what
// CTest runs)
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "core/gemm.hpp"
#include "host/gemm.hpp"

using mok::core::Dtype;
using mok::host::GemmIsa;

namespace {

struct Shape {
  const char* name;
  int rows, cols, depth;
  bool a_mn, b_mn;  // MN-major storage (row_stride 1) instead of K-major
  bool accumulate;  // accumulate_f32 into c instead of store_bf16
  bool mxfp8;       // a: bf16 with the MXFP8 round trip on read; b: e4m3 codes + e8m0 scales (K-major)
};

const Shape kShapes[] = {
    {"gate/up bf16 K-major", 128, 512, 1024, false, false, false, false},
    {"gate/up bf16 b MN-major", 128, 512, 1024, false, true, false, false},
    {"down bf16 K-major", 128, 1024, 512, false, false, false, false},
    {"down bf16 b MN-major", 128, 1024, 512, false, true, false, false},
    {"wgrad bf16 MN-major, accumulate", 512, 1024, 128, true, true, true, false},
    {"gate/up mxfp8 (a quantized)", 128, 512, 1024, false, false, false, true},
};

// The thread's CPU time: on a shared machine, time spent descheduled does not count.
double seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Inputs {
  std::vector<uint16_t> a, b;
  std::vector<uint8_t> codes, scales;
  mok::core::Gemm g{};
};

void make_inputs(Inputs& in, const Shape& s, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  in.a.resize(static_cast<size_t>(s.rows) * s.depth);
  in.b.resize(static_cast<size_t>(s.cols) * s.depth);
  for (auto& x : in.a) x = mok::core::float_to_bf16(value(rng));
  for (auto& x : in.b) x = mok::core::float_to_bf16(value(rng));
  mok::core::Gemm& g = in.g;
  g.rows = s.rows;
  g.cols = s.cols;
  g.num_parts = 1;
  g.parts[0].depth = s.depth;
  g.parts[0].a = s.a_mn ? mok::core::bf16_operand(in.a.data(), 1, s.rows, s.mxfp8)
                        : mok::core::bf16_operand(in.a.data(), s.depth, 1, s.mxfp8);
  g.parts[0].b = s.b_mn ? mok::core::bf16_operand(in.b.data(), 1, s.cols, false)
                        : mok::core::bf16_operand(in.b.data(), s.depth, 1, false);
  if (s.mxfp8) {
    mok::core::MxScaleLayout layout = mok::core::MxScaleLayout::of(s.cols, s.depth);
    in.codes.resize(in.b.size());
    in.scales.resize(static_cast<size_t>(layout.matrix_bytes()));
    for (auto& q : in.codes) q = static_cast<uint8_t>(rng() % 0x7f) | static_cast<uint8_t>(rng() % 2 ? 0x80 : 0);
    for (auto& e : in.scales) e = static_cast<uint8_t>(120 + rng() % 8);
    g.parts[0].b = mok::core::e4m3_operand(in.codes.data(), s.depth, in.scales.data(), layout);
  }
  g.c_stride = s.cols;
  g.epilogue = s.accumulate ? mok::core::Epilogue::accumulate_f32 : mok::core::Epilogue::store_bf16;
}

// The best of `repeats` runs in seconds; c (fp32 words or bf16 halves) as the last run left it.
template <class Run>
double best_time(int repeats, const std::vector<float>& c0, std::vector<float>& c, Run run) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    c = c0;
    double t0 = seconds();
    run(c.data());
    best = std::min(best, seconds() - t0);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  bool tiny = argc > 1 && std::strcmp(argv[1], "--tiny") == 0;
  int repeats = argc > 1 + tiny ? std::atoi(argv[1 + tiny]) : 5;
  int scale = tiny ? 8 : 1;
  std::mt19937_64 rng(1);
  std::vector<GemmIsa> isas;  // widest first
  for (GemmIsa isa : {GemmIsa::avx512, GemmIsa::avx2, GemmIsa::scalar})
    if (mok::host::gemm_isa_available(isa)) isas.push_back(isa);
  std::printf("%-34s %-16s", "shape", "rows x cols x depth");
  for (GemmIsa isa : isas) std::printf(" %9s", mok::host::gemm_isa_name(isa));
  std::printf(" %9s   GFLOP/s; host / reference time ratio:", "reference");
  for (GemmIsa isa : isas) std::printf(" %s", mok::host::gemm_isa_name(isa));
  std::printf("\n");
  int mismatches = 0;
  for (Shape s : kShapes) {
    s.rows /= scale;
    s.cols /= scale;
    s.depth /= scale;
    Inputs in;
    make_inputs(in, s, rng);
    double flops = 2.0 * s.rows * s.cols * s.depth;
    std::vector<float> c0(static_cast<size_t>(s.rows) * s.cols), want, got;
    std::uniform_real_distribution<float> start(-1.0f, 1.0f);
    for (float& x : c0) x = start(rng);
    std::vector<float> ref_scratch(mok::core::gemm_scratch_floats(s.rows, s.cols, s.depth, true));
    double t_ref = best_time(std::max(1, repeats / 3), c0, want, [&](float* c) {
      mok::core::Gemm g = in.g;
      g.c = c;
      mok::core::reference_gemm(g, ref_scratch.data());
    });
    std::vector<float> scratch(mok::host::gemm_scratch_floats(s.rows, s.cols, s.depth));
    std::printf("%-34s %4d x %4d x %4d", s.name, s.rows, s.cols, s.depth);
    std::vector<double> t_host;
    for (GemmIsa isa : isas) {
      t_host.push_back(best_time(repeats, c0, got, [&](float* c) {
        mok::core::Gemm g = in.g;
        g.c = c;
        mok::host::gemm(g, scratch.data(), scratch.size(), isa);
      }));
      // bf16 results fill the first half of c's words; comparing all words is then still exact
      if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0) {
        std::printf("\n  %s: result differs from reference_gemm\n", mok::host::gemm_isa_name(isa));
        ++mismatches;
      }
      std::printf(" %9.2f", flops / t_host.back() * 1e-9);
    }
    std::printf(" %9.2f  ", flops / t_ref * 1e-9);
    for (double t : t_host) std::printf(" %7.1fx", t_ref / t);
    std::printf("\n");
  }
  return mismatches;
}
