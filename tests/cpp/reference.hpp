// The layer's math as a naive per-token loop in double, written from the contracts and independently
// of core/: its own bf16 rounding, its own MXFP8 codec (a search over the e4m3 values), its own
// row order. Rounding points as in contracts.md; sums in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ref {

using Vec = std::vector<double>;

// Nearest bf16 (8 significant bits), ties to even; inputs here stay in the normal range.
inline double bf16(double v) {
  if (v == 0.0 || !std::isfinite(v)) return v;
  int e;
  double m = std::frexp(v, &e);  // |m| in [0.5, 1)
  return std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8);
}

inline uint16_t bf16_bits(double v) {
  float f = static_cast<float>(bf16(v));
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

inline double bf16_value(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- MXFP8 ---------------------------------------------------------------------------------------

// Every finite e4m3fn value by code (codes 0x7f and 0xff are NaN).
inline double e4m3_value(int code) {
  int e = (code >> 3) & 15, m = code & 7;
  double a = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (code & 0x80) ? -a : a;
}

// Nearest finite e4m3 code to v (|v| <= 448), ties to the even code; the sign is kept (a negative
// value that rounds to zero gives -0, as a float8 cast does).
inline int e4m3_nearest(double v) {
  int sign = std::signbit(v) ? 0x80 : 0, best = sign;
  double best_err = INFINITY;
  for (int c = sign; c < sign + 0x7f; ++c) {
    double err = std::fabs(e4m3_value(c) - v);
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_err = err;
    }
  }
  return best;
}

// Smallest e in [-127, 127] with amax / 2^e <= 448.
inline int mx_exponent(double amax) {
  if (amax == 0.0) return -127;
  int e = -127;
  while (e < 127 && amax > 448.0 * std::ldexp(1.0, e)) ++e;
  return e;
}

struct MxBlock {
  int exponent;
  std::vector<int> codes;
};

inline MxBlock mx_quantize(const Vec& v) {
  double amax = 0;
  for (double x : v) amax = std::fmax(amax, std::fabs(x));
  MxBlock b{mx_exponent(amax), {}};
  for (double x : v) b.codes.push_back(e4m3_nearest(std::fmin(std::fmax(std::ldexp(x, -b.exponent), -448.0), 448.0)));
  return b;
}

// The values a GEMM sees after quantising v in blocks of 32 from its start. A block holding a NaN
// or an infinity has e8m0's NaN scale: all of it is NaN.
inline Vec mx_round_trip(const Vec& v) {
  Vec out(v.size());
  for (size_t b = 0; b < v.size(); b += 32) {
    Vec block(v.begin() + b, v.begin() + std::min(v.size(), b + 32));
    if (!std::all_of(block.begin(), block.end(), [](double x) { return std::isfinite(x); })) {
      std::fill(out.begin() + b, out.begin() + b + block.size(), NAN);
      continue;
    }
    MxBlock q = mx_quantize(block);
    for (size_t i = 0; i < block.size(); ++i) out[b + i] = std::ldexp(e4m3_value(q.codes[i]), q.exponent);
  }
  return out;
}

// A [rows, cols] matrix quantised along its rows (blocks along cols) or its columns.
inline Vec mx_matrix(const Vec& m, int rows, int cols, bool along_cols) {
  Vec out(m.size());
  int lines = along_cols ? rows : cols, len = along_cols ? cols : rows;
  for (int l = 0; l < lines; ++l) {
    Vec line(len);
    for (int i = 0; i < len; ++i) line[i] = along_cols ? m[l * cols + i] : m[i * cols + l];
    line = mx_round_trip(line);
    for (int i = 0; i < len; ++i) (along_cols ? out[l * cols + i] : out[i * cols + l]) = line[i];
  }
  return out;
}

// ---- the layer -----------------------------------------------------------------------------------

struct Problem {
  int world = 1, experts = 1, hidden = 8, inter = 8, top_k = 1, shared_inter = 0;
  double limit = 0;  // SwiGLU clamp; 0 = none
  double alpha = 0;  // 0: swiglu; > 0: swiglu_oai with this alpha
  bool mxfp8 = false;
  // mokRoutingScaleInput (Llama4): expert k reads bf16(w_k x) and out adds y_k unweighted; false: out adds w_k y_k.
  bool input_scale = false;
  std::vector<int> tokens;                               // per rank
  std::vector<std::vector<int64_t>> ids;                 // [rank][T*K]
  std::vector<std::vector<float>> topk_weights;          // [rank][T*K]
  std::vector<std::vector<uint16_t>> x, dout;            // [rank][T*H] bf16
  std::vector<std::vector<uint16_t>> gate, up, down;     // [rank][E*I*H], [E*I*H], [E*H*I] bf16
  std::vector<std::vector<uint16_t>> sgate, sup, sdown;  // [rank][Is*H], [Is*H], [H*Is] bf16
  std::vector<std::vector<uint16_t>> bgate, bup, bdown;  // [rank][E*I], [E*I], [E*H] bf16; empty: no bias
  bool gated = false;                                    // the shared expert scaled by sigmoid(x . r)
  std::vector<std::vector<uint16_t>> srouter;            // [rank][H] bf16: r, when gated
};

struct Result {
  std::vector<Vec> out, dx, dw;           // per rank
  std::vector<Vec> dw_terms;              // per rank, each dw's sum of its terms' magnitudes
  std::vector<Vec> dgate, dup, ddown;     // per rank, its local experts (fp32 sums)
  std::vector<Vec> dsgate, dsup, dsdown;  // per rank (fp32 sums)
  std::vector<Vec> dbgate, dbup, dbdown;  // per rank, its local experts' bias gradients (sums)
  std::vector<Vec> dsrouter;              // per rank, [H] when gated (fp32 sums)
};

inline Vec values(const std::vector<uint16_t>& b, size_t at, size_t n) {
  Vec v(n);
  for (size_t i = 0; i < n; ++i) v[i] = bf16_value(b[at + i]);
  return v;
}

struct Expert {
  Vec gate, up, down;                 // forward operands [I,H], [I,H], [H,I]
  Vec bgate, bup, bdown;              // dgrad operands
  Vec gate_bias, up_bias, down_bias;  // [I], [I], [H]: zeros without a bias
};

// Expert e's bias of `width` from b (bf16 [E, width]), or zeros when there is none.
inline Vec bias_of(const std::vector<uint16_t>& b, int e, int width) {
  return b.empty() ? Vec(width, 0.0) : values(b, static_cast<size_t>(e) * width, width);
}

inline double silu(double z) {
  return z / (1.0 + std::exp(-z));
}

// The clamps min(v, L) and clamp(v, -L, L), a NaN kept as NaN.
inline double clamp_max(double v, double L) {
  return v > L ? L : v;
}
inline double clamp_abs(double v, double L) {
  return v > L ? L : (v < -L ? -L : v);
}

class Layer {
 public:
  explicit Layer(const Problem& p) : p_(p), L_(p.limit > 0 ? p.limit : INFINITY) {
    size_t ih = static_cast<size_t>(p.inter) * p.hidden;
    for (int q = 0; q < p.world; ++q)
      for (int e = 0; e < p.experts; ++e) {
        Expert x{values(p.gate[q], e * ih, ih),
                 values(p.up[q], e * ih, ih),
                 values(p.down[q], e * ih, ih),
                 {},
                 {},
                 {},
                 {},
                 {},
                 {}};
        if (p.mxfp8) {
          x.bgate = mx_matrix(x.gate, p.inter, p.hidden, false);
          x.bup = mx_matrix(x.up, p.inter, p.hidden, false);
          x.bdown = mx_matrix(x.down, p.hidden, p.inter, false);
          x.gate = mx_matrix(x.gate, p.inter, p.hidden, true);
          x.up = mx_matrix(x.up, p.inter, p.hidden, true);
          x.down = mx_matrix(x.down, p.hidden, p.inter, true);
        } else {
          x.bgate = x.gate;
          x.bup = x.up;
          x.bdown = x.down;
        }
        x.gate_bias = bias_of(q < static_cast<int>(p.bgate.size()) ? p.bgate[q] : std::vector<uint16_t>{}, e, p.inter);
        x.up_bias = bias_of(q < static_cast<int>(p.bup.size()) ? p.bup[q] : std::vector<uint16_t>{}, e, p.inter);
        x.down_bias = bias_of(q < static_cast<int>(p.bdown.size()) ? p.bdown[q] : std::vector<uint16_t>{}, e, p.hidden);
        experts_.push_back(x);
      }
  }

  Vec operand(const Vec& v) const { return p_.mxfp8 ? mx_round_trip(v) : v; }

  // g, u = bf16(x W^T + b); h = bf16(silu(min(g, L)) * clamp(u)).
  void gate_up(const Vec& x, const Vec& wg, const Vec& wu, int n, Vec& g, Vec& u, Vec& h, bool quantise,
               const Vec* bg = nullptr, const Vec* bu = nullptr) const {
    Vec a = quantise ? operand(x) : x;
    size_t hd = x.size();
    g.assign(n, 0);
    u.assign(n, 0);
    h.assign(n, 0);
    for (int i = 0; i < n; ++i) {
      double sg = 0, su = 0;
      for (size_t j = 0; j < hd; ++j) {
        sg += a[j] * wg[i * hd + j];
        su += a[j] * wu[i * hd + j];
      }
      g[i] = bf16(sg + (bg ? (*bg)[i] : 0.0));
      u[i] = bf16(su + (bu ? (*bu)[i] : 0.0));
      h[i] = bf16(act(g[i], u[i]));
    }
  }

  // out[o] = bf16(sum_i a[i] w[o][i] + bias[o]) for w [n_out, n_in].
  static Vec times_wt(const Vec& a, const Vec& w, int n_out, const Vec* bias = nullptr) {
    Vec out(n_out);
    size_t n_in = a.size();
    for (int o = 0; o < n_out; ++o) {
      double s = bias ? (*bias)[o] : 0.0;
      for (size_t i = 0; i < n_in; ++i) s += a[i] * w[o * n_in + i];
      out[o] = bf16(s);
    }
    return out;
  }

  // out[j] = sum_i a[i] w[i][j] for w [n_in, n_out] (unrounded).
  static Vec times_w(const Vec& a, const Vec& w, int n_out) {
    Vec out(n_out, 0.0);
    for (size_t i = 0; i < a.size(); ++i)
      for (int j = 0; j < n_out; ++j) out[j] += a[i] * w[i * n_out + j];
    return out;
  }

  // swiglu: silu(g') u'; swiglu_oai: g' sigmoid(alpha g') (u' + 1).
  double act(double g, double u) const {
    double gc = clamp_max(g, L_), uc = clamp_abs(u, L_);
    if (p_.alpha == 0) return silu(gc) * uc;
    return gc / (1.0 + std::exp(-p_.alpha * gc)) * (uc + 1.0);
  }

  void swiglu_bwd(const Vec& g, const Vec& u, const Vec& dh, Vec& dg, Vec& du) const {
    dg.assign(g.size(), 0);
    du.assign(g.size(), 0);
    double a = p_.alpha == 0 ? 1.0 : p_.alpha;
    for (size_t i = 0; i < g.size(); ++i) {
      double gc = clamp_max(g[i], L_), uc = clamp_abs(u[i], L_), f = p_.alpha == 0 ? uc : uc + 1.0;
      double s = 1.0 / (1.0 + std::exp(-a * gc));
      // The gradient stops where the clamp moved the value (never at a NaN, which passes as NaN).
      dg[i] = g[i] > L_ ? 0.0 : bf16(dh[i] * f * s * (1.0 + a * gc * (1.0 - s)));
      du[i] = (u[i] > L_ || u[i] < -L_) ? 0.0 : bf16(dh[i] * gc * s);
    }
  }

  // Everything, for every rank.
  Result run() const {
    const Problem& p = p_;
    int H = p.hidden, I = p.inter, K = p.top_k, Is = p.shared_inter;
    Result r;
    r.out.resize(p.world);
    r.dx.resize(p.world);
    r.dw.resize(p.world);
    r.dw_terms.resize(p.world);
    r.dgate.assign(p.world, Vec(static_cast<size_t>(p.experts) * I * H, 0.0));
    r.dup = r.dgate;
    r.ddown = r.dgate;
    r.dsgate.assign(p.world, Vec(static_cast<size_t>(Is) * H, 0.0));
    r.dsup = r.dsgate;
    r.dsdown = r.dsgate;
    r.dbgate.assign(p.world, Vec(static_cast<size_t>(p.experts) * I, 0.0));
    r.dbup = r.dbgate;
    r.dbdown.assign(p.world, Vec(static_cast<size_t>(p.experts) * H, 0.0));
    r.dsrouter.assign(p.world, Vec(p.gated ? H : 0, 0.0));
    // Per-row wgrad operands, gathered per expert in canonical order (rank, token, k).
    struct Row {
      Vec x, dy, h, dg, du;
    };
    std::vector<std::vector<Row>> rows(static_cast<size_t>(p.world) * p.experts);
    for (int rk = 0; rk < p.world; ++rk) {
      int T = p.tokens[rk];
      r.out[rk].assign(static_cast<size_t>(T) * H, 0);
      r.dx[rk].assign(static_cast<size_t>(T) * H, 0);
      r.dw[rk].assign(static_cast<size_t>(T) * K, 0);
      r.dw_terms[rk].assign(static_cast<size_t>(T) * K, 0);
      for (int t = 0; t < T; ++t) {
        Vec x = values(p.x[rk], static_cast<size_t>(t) * H, H), d = values(p.dout[rk], static_cast<size_t>(t) * H, H);
        Vec out(H, 0.0), dx(H, 0.0);
        if (Is > 0) shared_token(rk, x, d, out, dx, r);
        for (int k = 0; k < K; ++k) {
          int64_t id = p.ids[rk][t * K + k];
          if (id < 0) continue;
          const Expert& ex = experts_[id];
          double w = p.topk_weights[rk][t * K + k];
          // The weight scales the expert's input row (rounded to bf16) or its output and dOut.
          Vec xk = x;
          if (p.input_scale)
            for (double& v : xk) v = bf16(w * v);
          Vec g, u, h;
          gate_up(xk, ex.gate, ex.up, I, g, u, h, true, &ex.gate_bias, &ex.up_bias);
          Vec y = times_wt(operand(h), ex.down, H, &ex.down_bias);
          Vec dy(H);
          double dw = 0, terms = 0;
          for (int o = 0; o < H; ++o) {
            out[o] += (p.input_scale ? 1.0 : w) * y[o];
            dy[o] = p.input_scale ? d[o] : bf16(w * d[o]);
            dw += d[o] * y[o];
            terms += std::fabs(d[o] * y[o]);
          }
          Vec dh = times_w(operand(dy), ex.bdown, I);
          for (double& v : dh) v = bf16(v);
          Vec dg, du;
          swiglu_bwd(g, u, dh, dg, du);
          Vec a = times_w(operand(dg), ex.bgate, H), b = times_w(operand(du), ex.bup, H);
          // dx_k: the slot's bf16 gradient w.r.t. its input row; with input scaling x gets w dx_k and the
          // weight <x, dx_k> (x unscaled).
          if (p.input_scale) dw = terms = 0;
          for (int o = 0; o < H; ++o) {
            double dxk = bf16(a[o] + b[o]);
            dx[o] += (p.input_scale ? w : 1.0) * dxk;
            if (p.input_scale) dw += x[o] * dxk, terms += std::fabs(x[o] * dxk);
          }
          r.dw[rk][t * K + k] = dw;
          r.dw_terms[rk][t * K + k] = terms;
          rows[id].push_back(Row{xk, dy, h, dg, du});
        }
        for (int o = 0; o < H; ++o) {
          r.out[rk][t * H + o] = bf16(out[o]);
          r.dx[rk][t * H + o] = bf16(dx[o]);
        }
      }
    }
    for (int64_t id = 0; id < static_cast<int64_t>(rows.size()); ++id) wgrad(rows[id], id, r);
    return r;
  }

 private:
  void shared_token(int rk, const Vec& x, const Vec& d, Vec& out, Vec& dx, Result& r) const {
    const Problem& p = p_;
    int H = p.hidden, Is = p.shared_inter;
    Vec wg = values(p.sgate[rk], 0, Is * H), wu = values(p.sup[rk], 0, Is * H), wd = values(p.sdown[rk], 0, H * Is);
    Vec g, u, h;
    gate_up(x, wg, wu, Is, g, u, h, false);
    Vec s = times_wt(h, wd, H);
    // Gated (Qwen2-MoE): the output is gate * s, gate = sigmoid(x . r); the shared expert's backward
    // reads dy = bf16(gate * dOut), and the gate's logit gradient dlogit = (dOut . s) gate (1 - gate)
    // adds dlogit * r to its bf16 dx and dlogit * x to dr.
    double gate = 1, dlogit = 0;
    Vec r_in, dy = d;
    if (p.gated) {
      r_in = values(p.srouter[rk], 0, H);
      // The gate is one fp32 scalar per token whose bits the contract fixes: z summed in fp32 over h in
      // order, no FMA (the volatile keeps the product apart), sigmoid = 1 / (1 + expf(-z)); taken so here,
      // bf16(gate * dOut) rounds where the layer's does.
      float z = 0.0f;
      for (int o = 0; o < H; ++o) {
        volatile float product = static_cast<float>(x[o]) * static_cast<float>(r_in[o]);
        z = z + product;
      }
      float gate32 = 1.0f / (1.0f + std::exp(-z));
      gate = gate32;
      double ds = 0;
      for (int o = 0; o < H; ++o) {
        ds += d[o] * s[o];
        dy[o] = bf16(gate * d[o]);
      }
      dlogit = ds * gate * (1.0 - gate);
      for (int o = 0; o < H; ++o) r.dsrouter[rk][o] += dlogit * x[o];
    }
    Vec dh = times_w(dy, wd, Is);
    for (double& v : dh) v = bf16(v);
    Vec dg, du;
    swiglu_bwd(g, u, dh, dg, du);
    Vec a = times_w(dg, wg, H), b = times_w(du, wu, H);
    for (int o = 0; o < H; ++o) {
      out[o] = gate * s[o];
      dx[o] = bf16(a[o] + b[o]);
      if (p.gated) dx[o] = bf16(dx[o] + dlogit * r_in[o]);
    }
    for (int o = 0; o < H; ++o)
      for (int i = 0; i < Is; ++i) r.dsdown[rk][o * Is + i] += dy[o] * h[i];
    for (int i = 0; i < Is; ++i)
      for (int j = 0; j < H; ++j) {
        r.dsgate[rk][i * H + j] += dg[i] * x[j];
        r.dsup[rk][i * H + j] += du[i] * x[j];
      }
  }

  // Weight gradients of global expert `id` over its rows in canonical order; in MXFP8 mode each
  // operand column is first quantised in blocks of 32 rows from the segment's first row.
  template <class Rows>
  void wgrad(Rows& rows, int64_t id, Result& r) const {
    const Problem& p = p_;
    int H = p.hidden, I = p.inter, q = static_cast<int>(id / p.experts), e = static_cast<int>(id % p.experts);
    if (p.mxfp8) {
      auto quantise = [&](auto member, int width) {
        for (size_t b = 0; b < rows.size(); b += 32) {
          size_t n = std::min(rows.size() - b, size_t{32});
          for (int c = 0; c < width; ++c) {
            Vec col(n);
            for (size_t i = 0; i < n; ++i) col[i] = (rows[b + i].*member)[c];
            col = mx_round_trip(col);
            for (size_t i = 0; i < n; ++i) (rows[b + i].*member)[c] = col[i];
          }
        }
      };
      using Row = typename Rows::value_type;
      quantise(&Row::x, H);
      quantise(&Row::dy, H);
      quantise(&Row::h, I);
      quantise(&Row::dg, I);
      quantise(&Row::du, I);
    }
    size_t base = static_cast<size_t>(e) * I * H;
    for (const auto& row : rows) {
      for (int o = 0; o < H; ++o) r.dbdown[q][static_cast<size_t>(e) * H + o] += row.dy[o];
      for (int i = 0; i < I; ++i) {
        r.dbgate[q][static_cast<size_t>(e) * I + i] += row.dg[i];
        r.dbup[q][static_cast<size_t>(e) * I + i] += row.du[i];
      }
      for (int o = 0; o < H; ++o)
        for (int i = 0; i < I; ++i) r.ddown[q][base + o * I + i] += row.dy[o] * row.h[i];
      for (int i = 0; i < I; ++i)
        for (int j = 0; j < H; ++j) {
          r.dgate[q][base + i * H + j] += row.dg[i] * row.x[j];
          r.dup[q][base + i * H + j] += row.du[i] * row.x[j];
        }
    }
  }

  const Problem& p_;
  double L_;
  std::vector<Expert> experts_;
};

}  // namespace ref
