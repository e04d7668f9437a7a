// The orders and orientations docs/semantics.md fixes, made observable and checked bit for bit: the host
// executor against an fp32 emulation of the documented evaluation, written here from the docs (not from
// core/): every GEMM row an fp32 dot in index order with each product rounded before it is added, the shared
// term first and then k in order in both per-token sums, weight gradients summed over an expert's rows in
// canonical order, and MXFP8 weight-gradient operands quantised in 32-row blocks along the tokens.
//
// Random inputs (test_layer) cannot see these: with values of one magnitude, a sum's order moves only its
// last fp32 bits and a block's orientation barely changes its scale. Here tokens carry scales 2^[-16, 16] and
// channels 2^[-4, 4] (together 2^+-20), router weights span 2^+-12 with both signs, and a third of the tokens
// route twice to one expert with weights w and -w, |w| in 2^[8, 20]: big terms that cancel exactly, so what
// remains is the rounding of the small ones (the shared term, the third route), which depends on when they
// were added. Weight gradients are compared in fp32
// (main_grad starting at 0), not after a bf16 rounding.
#include <cmath>

#include "group.hpp"

using namespace mok_test;

namespace {

using Floats = std::vector<float>;

// Nearest-even bf16 of a finite float.
float bf(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&v, &u, 4);
  return v;
}

Floats floats(const std::vector<uint16_t>& b, size_t at, size_t n) {
  Floats v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(ref::bf16_value(b[at + i]));
  return v;
}

// reference.hpp's codec (a search over the e4m3 values; its results are exact in float).
Floats round_trip(const Floats& v) {
  ref::Vec d = ref::mx_round_trip(ref::Vec(v.begin(), v.end()));
  return Floats(d.begin(), d.end());
}

Floats mx_matrix(const Floats& m, int rows, int cols, bool along_cols) {
  ref::Vec d = ref::mx_matrix(ref::Vec(m.begin(), m.end()), rows, cols, along_cols);
  return Floats(d.begin(), d.end());
}

// sum_i a[i] * b[i * stride] in index order, starting from `acc`, each product rounded to fp32 first.
float dot(const float* a, const float* b, int n, int stride = 1, float acc = 0.0f) {
  for (int i = 0; i < n; ++i) {
    volatile float product = a[i] * b[static_cast<int64_t>(i) * stride];  // volatile: never fused into an FMA
    acc += product;
  }
  return acc;
}

float sigmoid(float z) {
  return 1.0f / (1.0f + expf(-z));
}

struct Weights {
  Floats gate, up, down;     // forward operands [I, H], [I, H], [H, I]
  Floats bgate, bup, bdown;  // backward operands (MXFP8: the column-wise forms)
};

struct Activations {
  Floats x, g, u, h, y;
};

struct Gradients {
  Floats dy, dg, du, dx;
};

struct Row {
  Floats x, dy, h, dg, du;
};

class Emulation {
 public:
  explicit Emulation(const ref::Problem& p) : p_(p) {
    int H = p.hidden, I = p.inter;
    size_t ih = static_cast<size_t>(I) * H;
    for (int q = 0; q < p.world; ++q)
      for (int e = 0; e < p.experts; ++e) {
        Weights w{
            floats(p.gate[q], e * ih, ih), floats(p.up[q], e * ih, ih), floats(p.down[q], e * ih, ih), {}, {}, {}};
        if (p.mxfp8) {
          w.bgate = mx_matrix(w.gate, I, H, false);
          w.bup = mx_matrix(w.up, I, H, false);
          w.bdown = mx_matrix(w.down, H, I, false);
          w.gate = mx_matrix(w.gate, I, H, true);
          w.up = mx_matrix(w.up, I, H, true);
          w.down = mx_matrix(w.down, H, I, true);
        } else {
          w.bgate = w.gate;
          w.bup = w.up;
          w.bdown = w.down;
        }
        routed_.push_back(w);
      }
  }

  // Everything for every rank: out, dx (bf16 values), dw, and the fp32 weight-gradient sums.
  void run() {
    const ref::Problem& p = p_;
    int H = p.hidden, I = p.inter, K = p.top_k, Is = p.shared_inter;
    std::vector<std::vector<Row>> rows(routed_.size());
    size_t eih = static_cast<size_t>(p.experts) * I * H, sih = static_cast<size_t>(Is) * H;
    for (int r = 0; r < p.world; ++r) {
      int T = p.tokens[r];
      out.emplace_back(static_cast<size_t>(T) * H);
      dx.emplace_back(static_cast<size_t>(T) * H);
      dw.emplace_back(static_cast<size_t>(T) * K);
      for (auto* v : {&dgate, &dup, &ddown}) v->emplace_back(eih, 0.0f);
      for (auto* v : {&dsgate, &dsup, &dsdown}) v->emplace_back(sih, 0.0f);
      Weights shared;
      if (Is > 0)
        shared = {floats(p.sgate[r], 0, sih), floats(p.sup[r], 0, sih), floats(p.sdown[r], 0, sih), {}, {}, {}};
      shared.bgate = shared.gate, shared.bup = shared.up, shared.bdown = shared.down;
      for (int t = 0; t < T; ++t) {
        Floats x = floats(p.x[r], static_cast<size_t>(t) * H, H), d = floats(p.dout[r], static_cast<size_t>(t) * H, H);
        Floats out_acc(H, 0.0f), dx_acc(H, 0.0f);
        if (Is > 0) {  // the shared term comes first in both sums
          Activations a = forward(x, shared, Is, false);
          Gradients g = backward(a, d, shared, Is, false);
          out_acc = a.y;
          dx_acc = g.dx;
          for (int o = 0; o < H; ++o)
            for (int i = 0; i < Is; ++i) add_product(dsdown[r][o * Is + i], d[o], a.h[i]);
          for (int i = 0; i < Is; ++i)
            for (int j = 0; j < H; ++j) {
              add_product(dsgate[r][i * H + j], g.dg[i], x[j]);
              add_product(dsup[r][i * H + j], g.du[i], x[j]);
            }
        }
        for (int k = 0; k < K; ++k) {
          int64_t id = p.ids[r][t * K + k];
          if (id < 0) continue;
          float w = p.topk_weights[r][t * K + k];
          Activations a = forward(x, routed_[id], I, p.mxfp8);
          Floats dy(H);
          for (int o = 0; o < H; ++o) {
            add_product(out_acc[o], w, a.y[o]);
            dy[o] = bf(w * d[o]);
          }
          dw[r][t * K + k] = dot(d.data(), a.y.data(), H);
          Gradients g = backward(a, dy, routed_[id], I, p.mxfp8);
          for (int o = 0; o < H; ++o) dx_acc[o] += g.dx[o];
          rows[id].push_back(Row{x, dy, a.h, g.dg, g.du});
        }
        for (int o = 0; o < H; ++o) {
          out[r][t * H + o] = bf(out_acc[o]);
          dx[r][t * H + o] = bf(dx_acc[o]);
        }
      }
    }
    for (size_t id = 0; id < rows.size(); ++id) weight_gradients(rows[id], static_cast<int>(id));
  }

  std::vector<Floats> out, dx, dw, dgate, dup, ddown, dsgate, dsup, dsdown;

 private:
  static void add_product(float& acc, float a, float b) {
    volatile float product = a * b;
    acc += product;
  }

  // g, u = bf16(x W^T); h = bf16((a * sigmoid(a)) * b); y = bf16(h W_down^T); MXFP8 operands along H, I.
  Activations forward(const Floats& x, const Weights& w, int n, bool mx) const {
    int H = p_.hidden;
    float limit = p_.limit > 0 ? static_cast<float>(p_.limit) : INFINITY;
    Activations a{x, Floats(n), Floats(n), Floats(n), Floats(H)};
    Floats xq = mx ? round_trip(x) : x;
    for (int i = 0; i < n; ++i) {
      a.g[i] = bf(dot(xq.data(), &w.gate[static_cast<size_t>(i) * H], H));
      a.u[i] = bf(dot(xq.data(), &w.up[static_cast<size_t>(i) * H], H));
      float ga = std::fmin(a.g[i], limit), ub = std::fmin(std::fmax(a.u[i], -limit), limit);
      volatile float silu = ga * sigmoid(ga);
      a.h[i] = bf(silu * ub);
    }
    Floats hq = mx ? round_trip(a.h) : a.h;
    for (int o = 0; o < H; ++o) a.y[o] = bf(dot(hq.data(), &w.down[static_cast<size_t>(o) * n], n));
    return a;
  }

  Gradients backward(const Activations& a, const Floats& dy, const Weights& w, int n, bool mx) const {
    int H = p_.hidden;
    float limit = p_.limit > 0 ? static_cast<float>(p_.limit) : INFINITY;
    Gradients g{dy, Floats(n), Floats(n), Floats(H)};
    Floats dyq = mx ? round_trip(dy) : dy;
    for (int i = 0; i < n; ++i) {
      float dh = bf(dot(dyq.data(), &w.bdown[i], H, n));
      float ga = std::fmin(a.g[i], limit), ub = std::fmin(std::fmax(a.u[i], -limit), limit);
      float s = sigmoid(ga);
      volatile float one_minus_s = 1.0f - s;
      volatile float a_one_minus_s = ga * one_minus_s;
      volatile float dsilu = s * (1.0f + a_one_minus_s);
      volatile float dh_b = dh * ub;
      volatile float a_s = ga * s;
      g.dg[i] = a.g[i] <= limit ? bf(dh_b * dsilu) : 0.0f;
      g.du[i] = (a.u[i] >= -limit && a.u[i] <= limit) ? bf(dh * a_s) : 0.0f;
    }
    Floats dgq = mx ? round_trip(g.dg) : g.dg, duq = mx ? round_trip(g.du) : g.du;
    for (int o = 0; o < H; ++o) {
      float acc = dot(dgq.data(), &w.bgate[o], n, H);  // one accumulation: the gate terms, then the up terms
      g.dx[o] = bf(dot(duq.data(), &w.bup[o], n, H, acc));
    }
    return g;
  }

  // Sums over the expert's rows in canonical order; MXFP8: every column of every operand quantised in blocks
  // of 32 rows from the segment's first row.
  void weight_gradients(std::vector<Row>& rows, int id) {
    int H = p_.hidden, I = p_.inter, q = id / p_.experts, e = id % p_.experts;
    if (p_.mxfp8) {
      for (auto member : {&Row::x, &Row::dy, &Row::h, &Row::dg, &Row::du})
        for (size_t b = 0; b < rows.size(); b += 32) {
          size_t n = std::min(rows.size() - b, size_t{32});
          for (size_t c = 0; c < (rows[b].*member).size(); ++c) {
            Floats column(n);
            for (size_t i = 0; i < n; ++i) column[i] = (rows[b + i].*member)[c];
            column = round_trip(column);
            for (size_t i = 0; i < n; ++i) (rows[b + i].*member)[c] = column[i];
          }
        }
    }
    size_t base = static_cast<size_t>(e) * I * H;
    for (const Row& row : rows) {
      for (int o = 0; o < H; ++o)
        for (int i = 0; i < I; ++i) add_product(ddown[q][base + o * I + i], row.dy[o], row.h[i]);
      for (int i = 0; i < I; ++i)
        for (int j = 0; j < H; ++j) {
          add_product(dgate[q][base + i * H + j], row.dg[i], row.x[j]);
          add_product(dup[q][base + i * H + j], row.du[i], row.x[j]);
        }
    }
  }

  const ref::Problem& p_;
  std::vector<Weights> routed_;
};

// ---- inputs -------------------------------------------------------------------------------------

uint16_t scaled(uint16_t b, int exponent) {
  return ref::bf16_bits(std::ldexp(ref::bf16_value(b), exponent));  // exact: a power of two, far from limits
}

// make_problem's draw, then the dynamic range and the cancelling pairs that make orders observable.
ref::Problem wide_problem(const Spec& s, std::mt19937_64& rng) {
  ref::Problem p = make_problem(s, rng);
  std::uniform_int_distribution<int> token_exp(-16, 16), channel_exp(-4, 4), weight_exp(-12, 12), pair_exp(8, 20),
      third(0, 2);
  std::uniform_real_distribution<float> mantissa(0.5f, 1.0f);
  std::vector<int> channel(s.hidden);
  for (int& c : channel) c = channel_exp(rng);
  for (int r = 0; r < p.world; ++r) {
    for (int t = 0; t < p.tokens[r]; ++t) {
      int tx = token_exp(rng), td = token_exp(rng) * 3 / 4;  // dOut's range a little narrower: no overflow
      for (int h = 0; h < s.hidden; ++h) {
        uint16_t& x = p.x[r][t * s.hidden + h];
        x = scaled(x, tx + channel[h]);
        uint16_t& d = p.dout[r][t * s.hidden + h];
        d = scaled(d, td);
      }
      for (int k = 0; k < s.top_k; ++k) {
        float sign = rng() & 1 ? -1.0f : 1.0f;
        p.topk_weights[r][t * s.top_k + k] = sign * std::ldexp(mantissa(rng), weight_exp(rng));
      }
      if (s.top_k >= 3 && third(rng) == 0) {  // k = 0 and k = 1: one expert, weights w and -w
        p.ids[r][t * s.top_k + 1] = p.ids[r][t * s.top_k];
        if (p.ids[r][t * s.top_k] < 0) p.ids[r][t * s.top_k] = p.ids[r][t * s.top_k + 1] = 0;
        float big = std::ldexp(mantissa(rng), pair_exp(rng)) * (rng() & 1 ? -1.0f : 1.0f);
        p.topk_weights[r][t * s.top_k] = big;
        p.topk_weights[r][t * s.top_k + 1] = -big;
      }
    }
  }
  return p;
}

// ---- the checks ----------------------------------------------------------------------------------

// Bit for bit (as values: a zero's sign is not part of the contract); reports the first difference.
bool same(const char* what, int rank, const Floats& got, const Floats& want) {
  if (got.size() != want.size()) {
    CHECK_MSG(false, "%s rank %d: %zu values, expected %zu", what, rank, got.size(), want.size());
    return false;
  }
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i]) && differ++ == 0) first = i;
  CHECK_MSG(differ == 0, "%s rank %d: %zu of %zu values differ; first at %zu: got %.9g, want %.9g", what, rank, differ,
            got.size(), first, differ ? got[first] : 0.0f, differ ? want[first] : 0.0f);
  return differ == 0;
}

Floats bf16_values(const std::vector<uint16_t>& v) {
  Floats f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(ref::bf16_value(v[i]));
  return f;
}

void check_bitwise(const Spec& spec, Knobs knobs) {
  std::mt19937_64 rng(seed() + spec.world * 17 + spec.mxfp8);
  ref::Problem p = wide_problem(spec, rng);
  knobs.accumulate = true;  // fp32 weight gradients: every bit of the sum is visible
  knobs.main_grad_start = 0.0f;
  Outputs o = run_layer(p, knobs);
  if (!all_ok(o)) {
    CHECK(false);
    return;
  }
  Emulation want(p);
  want.run();
  for (int r = 0; r < p.world; ++r) {
    same("out", r, bf16_values(o.out[r]), want.out[r]);
    same("dx", r, bf16_values(o.dx[r]), want.dx[r]);
    same("dtopk_weights", r, o.dw[r], want.dw[r]);
    same("dgate", r, o.main_gate[r], want.dgate[r]);
    same("dup", r, o.main_up[r], want.dup[r]);
    same("ddown", r, o.main_down[r], want.ddown[r]);
    if (spec.shared_inter == 0) continue;
    same("dshared_gate", r, o.main_sgate[r], want.dsgate[r]);
    same("dshared_up", r, o.main_sup[r], want.dsup[r]);
    same("dshared_down", r, o.main_sdown[r], want.dsdown[r]);
  }
}

Spec orders_spec(bool mxfp8) {
  Spec s;
  s.world = 2;
  s.experts = 2;
  s.hidden = 40;  // MXFP8: a full and a partial block along H
  s.inter = 24;   // and a partial one along I
  s.top_k = 3;
  s.shared_inter = 16;
  s.max_tokens = 40;  // an expert gets more than 32 rows: several token blocks, the last one partial
  s.routing = Routing::minus_one;
  s.mxfp8 = mxfp8;
  return s;
}

}  // namespace

TEST(bf16_orders_bitwise) {
  check_bitwise(orders_spec(false), Knobs{});
}

TEST(mxfp8_orders_and_token_blocks_bitwise) {
  check_bitwise(orders_spec(true), mxfp8_knobs());
}

TEST(swiglu_clamp_bitwise) {
  Spec s = orders_spec(false);
  s.limit = 2.0;  // with these magnitudes both sides of every clamp occur
  check_bitwise(s, Knobs{});
}

MOK_TEST_MAIN
