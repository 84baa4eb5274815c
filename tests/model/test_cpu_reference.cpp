// CPU reference forward: YaRN tables against the spec's known values, and the whole forward
// (GQA, sinks, sliding window, paged KV, router, clamped SwiGLU, MXFP4 experts) against a naive
// double-precision re-implementation on small in-memory weights. Plus hand-made cases whose
// answer is known exactly: router ties go to the lowest index, SwiGLU clamps gate and up.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "core/mxfp4.h"
#include "core/parallel.h"
#include "model/config.h"
#include "model/cpu_reference.h"
#include "model/rope.h"
#include "model/weights.h"

namespace {

using mx::bf16_to_f32;
using mx::f32_to_bf16;

TEST(Rope, YarnParams120bMatchSpec) {
  mx::ModelConfig c = mx::preset_config("120b");
  std::vector<float> inv(c.head_dim / 2);
  mx::YarnParams p = mx::yarn_inv_freq(c, inv.data());
  EXPECT_NEAR(p.low, 8.092779f, 2e-5);
  EXPECT_NEAR(p.high, 17.398024f, 2e-5);
  EXPECT_NEAR(p.concentration, 1.3465736f, 1e-6);
  // Below `low` pure extrapolation (the original frequency), above `high` pure interpolation.
  for (int i = 0; i < c.head_dim / 2; ++i) {
    double freq = std::pow(double(c.rope_theta), 2.0 * i / c.head_dim);
    double ramp = std::clamp((i - double(p.low)) / (p.high - p.low), 0.0, 1.0);
    double want = ramp / (c.rope_scaling.factor * freq) + (1 - ramp) / freq;
    // fp32 pow(theta, 2i/d): the rounded exponent costs ~ln(theta) * 2^-24 ~ 1e-6 relative.
    EXPECT_NEAR(inv[i], want, 3e-6 * want) << i;
  }
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
}

TEST(Rope, TruncateRoundsBounds) {
  mx::ModelConfig c = mx::preset_config("120b");
  c.rope_scaling.truncate = true;
  std::vector<float> inv(c.head_dim / 2);
  mx::YarnParams p = mx::yarn_inv_freq(c, inv.data());
  EXPECT_EQ(p.low, 8.0f);
  EXPECT_EQ(p.high, 18.0f);
}

TEST(Rope, RotateIsNeoxHalfSplit) {
  const int D = 8;
  float inv[4] = {1.0f, 0.5f, 0.25f, 0.125f};
  float x[D] = {1, 2, 3, 4, 5, 6, 7, 8};
  float y[D];
  std::copy(x, x + D, y);
  mx::rope_rotate_f32(y, D, 3, inv, 1.5f);
  for (int i = 0; i < 4; ++i) {
    double a = 3.0 * inv[i], c = std::cos(a) * 1.5, s = std::sin(a) * 1.5;
    EXPECT_NEAR(y[i], x[i] * c - x[i + 4] * s, 1e-5);
    EXPECT_NEAR(y[i + 4], x[i + 4] * c + x[i] * s, 1e-5);
  }
}

// Owns every weight tensor of a small model and binds a ModelWeights to them.
struct MiniModel {
  mx::ModelConfig cfg;
  std::vector<std::vector<uint16_t>> bf;  // bf16 tensors
  std::vector<std::vector<uint8_t>> u8;   // MXFP4 blocks / scales
  mx::ModelWeights w{};
  std::mt19937 rng{1234};

  const uint16_t* bf16(size_t n, float scale, float offset = 0.0f) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto& v = bf.emplace_back(n);
    for (auto& x : v) x = f32_to_bf16(offset + scale * nd(rng));
    return v.data();
  }
  const uint8_t* bytes(size_t n, int lo, int hi) {
    std::uniform_int_distribution<int> ud(lo, hi);
    auto& v = u8.emplace_back(n);
    for (auto& x : v) x = uint8_t(ud(rng));
    return v.data();
  }
  explicit MiniModel(const mx::ModelConfig& c) : cfg(c) {
    bf.reserve(64);
    u8.reserve(64);
    const size_t H = c.hidden_size, I = c.intermediate_size, E = c.num_experts, V = c.vocab_size;
    w.embed = bf16(V * H, 1.0f);
    w.final_norm = bf16(H, 0.1f, 1.0f);
    w.lm_head = bf16(V * H, 0.1f);
    for (int l = 0; l < c.num_layers; ++l) {
      mx::LayerWeights L{};
      L.attn_norm = bf16(H, 0.1f, 1.0f);
      L.q_w = bf16(c.q_dim() * H, 0.15f);
      L.q_b = bf16(c.q_dim(), 0.1f);
      L.k_w = bf16(c.kv_dim() * H, 0.15f);
      L.k_b = bf16(c.kv_dim(), 0.1f);
      L.v_w = bf16(c.kv_dim() * H, 0.15f);
      L.v_b = bf16(c.kv_dim(), 0.1f);
      L.o_w = bf16(H * c.q_dim(), 0.1f);
      L.o_b = bf16(H, 0.1f);
      L.sinks = bf16(c.num_heads, 1.0f);
      L.mlp_norm = bf16(H, 0.1f, 1.0f);
      L.router_w = bf16(E * H, 0.2f);
      L.router_b = bf16(E, 0.1f);
      L.gate_up_blocks = bytes(E * 2 * I * H / 2, 0, 255);
      L.gate_up_scales = bytes(E * 2 * I * H / 32, 122, 124);
      L.gate_up_bias = bf16(E * 2 * I, 0.5f);
      L.down_blocks = bytes(E * H * I / 2, 0, 255);
      L.down_scales = bytes(E * H * I / 32, 122, 124);
      L.down_bias = bf16(E * H, 0.1f);
      w.layers.push_back(L);
    }
  }
};

mx::ModelConfig small_config() {
  mx::ModelConfig c = mx::preset_config("tiny");
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_heads = 4;
  c.num_kv_heads = 2;  // GQA 2:1
  c.head_dim = 16;
  c.intermediate_size = 32;
  c.num_experts = 5;
  c.experts_per_token = 2;
  c.vocab_size = 97;
  c.sliding_window = 3;
  c.layer_is_sliding = {1, 0};
  c.rope_theta = 10000.0f;
  c.rope_scaling.factor = 4.0f;
  c.rope_scaling.original_max_position_embeddings = 64;
  return c;
}

// Naive double-precision forward of a whole sequence, recomputing every position from scratch
// (no cache, no paging): written from the spec, independent of CpuReference's code paths.
std::vector<std::vector<double>> naive_forward(const MiniModel& m, const std::vector<int>& ids) {
  const mx::ModelConfig& c = m.cfg;
  const int H = c.hidden_size, D = c.head_dim, I = c.intermediate_size, T = int(ids.size());
  auto f = [](const uint16_t* p, size_t i) { return double(bf16_to_f32(p[i])); };
  auto fp4 = [](const uint8_t* blocks, const uint8_t* scales, size_t row, int K, int k) {
    uint8_t b = blocks[row * K / 2 + k / 2];
    int code = (k % 2) ? (b >> 4) : (b & 15);
    static const double v[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (code & 8 ? -v[code & 7] : v[code & 7]) * std::ldexp(1.0, int(scales[row * K / 32 + k / 32]) - 127);
  };
  auto rms = [&](const std::vector<double>& x, const uint16_t* g) {
    double ss = 0;
    for (double e : x) ss += e * e;
    double r = 1.0 / std::sqrt(ss / H + c.rms_norm_eps);
    std::vector<double> y(H);
    for (int i = 0; i < H; ++i) y[i] = f(g, i) * x[i] * r;
    return y;
  };
  auto lin = [&](const uint16_t* w, const uint16_t* b, const std::vector<double>& x, int rows) {
    std::vector<double> y(rows);
    for (int r = 0; r < rows; ++r) {
      double a = b ? f(b, r) : 0.0;
      for (size_t k = 0; k < x.size(); ++k) a += f(w, size_t(r) * x.size() + k) * x[k];
      y[r] = a;
    }
    return y;
  };
  // YaRN from the spec, in double.
  const double s = c.rope_scaling.factor, L0 = c.rope_scaling.original_max_position_embeddings;
  auto cdim = [&](double beta) { return (D / 2) * std::log(L0 / (beta * 2 * std::numbers::pi)) / std::log(double(c.rope_theta)); };
  double low = std::max(cdim(c.rope_scaling.beta_fast), 0.0), high = std::min(cdim(c.rope_scaling.beta_slow), D - 1.0);
  const double conc = 0.1 * std::log(s) + 1.0;
  auto rope = [&](double* x, int pos) {
    for (int i = 0; i < D / 2; ++i) {
      double freq = std::pow(double(c.rope_theta), 2.0 * i / D);
      double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      double inv = ramp / (s * freq) + (1 - ramp) / freq, a = pos * inv;
      double x1 = x[i], x2 = x[i + D / 2];
      x[i] = (x1 * std::cos(a) - x2 * std::sin(a)) * conc;
      x[i + D / 2] = (x2 * std::cos(a) + x1 * std::sin(a)) * conc;
    }
  };
  std::vector<std::vector<double>> xs(T, std::vector<double>(H));
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) xs[t][i] = f(m.w.embed, size_t(ids[t]) * H + i);
  for (int l = 0; l < c.num_layers; ++l) {
    const mx::LayerWeights& L = m.w.layers[l];
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int t = 0; t < T; ++t) {
      auto n = rms(xs[t], L.attn_norm);
      q[t] = lin(L.q_w, L.q_b, n, c.q_dim());
      k[t] = lin(L.k_w, L.k_b, n, c.kv_dim());
      v[t] = lin(L.v_w, L.v_b, n, c.kv_dim());
      for (int h = 0; h < c.num_heads; ++h) rope(&q[t][h * D], t);
      for (int h = 0; h < c.num_kv_heads; ++h) rope(&k[t][h * D], t);
    }
    for (int t = 0; t < T; ++t) {
      std::vector<double> att(c.q_dim(), 0.0);
      for (int h = 0; h < c.num_heads; ++h) {
        const int g = h / (c.num_heads / c.num_kv_heads);
        std::vector<double> sc;
        std::vector<int> js;
        for (int j = 0; j <= t; ++j) {
          if (c.layer_is_sliding[l] && t - j >= c.sliding_window) continue;
          double d = 0;
          for (int e = 0; e < D; ++e) d += q[t][h * D + e] * k[j][g * D + e];
          sc.push_back(d / std::sqrt(double(D)));
          js.push_back(j);
        }
        double z = std::exp(f(L.sinks, h));
        for (double e : sc) z += std::exp(e);
        for (size_t i = 0; i < js.size(); ++i)
          for (int e = 0; e < D; ++e) att[h * D + e] += std::exp(sc[i]) / z * v[js[i]][g * D + e];
      }
      auto o = lin(L.o_w, L.o_b, att, H);
      for (int i = 0; i < H; ++i) xs[t][i] += o[i];
      auto n = rms(xs[t], L.mlp_norm);
      auto r = lin(L.router_w, L.router_b, n, c.num_experts);
      std::vector<int> order(c.num_experts);
      for (int e = 0; e < c.num_experts; ++e) order[e] = e;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return r[a] > r[b]; });
      double z = 0;
      for (int j = 0; j < c.experts_per_token; ++j) z += std::exp(r[order[j]]);
      for (int j = 0; j < c.experts_per_token; ++j) {
        const int ex = order[j];
        std::vector<double> act(I);
        for (int i = 0; i < I; ++i) {
          double hv[2];
          for (int u = 0; u < 2; ++u) {
            size_t row = size_t(ex) * 2 * I + 2 * i + u;
            double a = f(L.gate_up_bias, row);
            for (int kk = 0; kk < H; ++kk) a += fp4(L.gate_up_blocks, L.gate_up_scales, row, H, kk) * n[kk];
            hv[u] = a;
          }
          double gt = std::min(hv[0], double(c.swiglu_limit));
          double up = std::clamp(hv[1], -double(c.swiglu_limit), double(c.swiglu_limit));
          act[i] = gt / (1 + std::exp(-double(c.swiglu_alpha) * gt)) * (up + 1);
        }
        const double wgt = std::exp(r[ex]) / z;
        for (int hh = 0; hh < H; ++hh) {
          size_t row = size_t(ex) * H + hh;
          double a = f(L.down_bias, row);
          for (int i = 0; i < I; ++i) a += fp4(L.down_blocks, L.down_scales, row, I, i) * act[i];
          xs[t][hh] += wgt * a;
        }
      }
    }
  }
  std::vector<std::vector<double>> logits(T);
  for (int t = 0; t < T; ++t) logits[t] = lin(m.w.lm_head, nullptr, rms(xs[t], m.w.final_norm), c.vocab_size);
  return logits;
}

TEST(CpuReference, MatchesNaiveDoubleForward) {
  MiniModel m(small_config());
  const mx::ModelConfig& c = m.cfg;
  std::vector<int> ids = {5, 17, 3, 96, 42, 42, 0, 11, 64, 7, 29};  // crosses window 3 and 2 KV blocks
  auto want = naive_forward(m, ids);
  mx::ThreadPool pool(2);
  mx::CpuReference ref(c, m.w, &pool);
  mx::CpuKvCache kv;
  kv.allocate(c, 4, 6);
  const int32_t table[3] = {4, 1, 2};  // non-identity, skips blocks on purpose
  const int32_t sliding[3] = {0, 3, 5};  // the sliding layers' blocks share the arrays, not the blocks
  std::vector<float> logits(c.vocab_size);
  double num = 0, den = 0, max_abs = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    ref.forward_token(ids[t], int(t), table, sliding, kv, logits.data());
    for (int i = 0; i < c.vocab_size; ++i) {
      double d = logits[i] - want[t][i];
      num += d * d;
      den += want[t][i] * want[t][i];
      max_abs = std::max(max_abs, std::abs(d));
    }
  }
  const double rel = std::sqrt(num / den);
  std::printf("[cpu ref vs double] rel L2 %.3g, max abs %.3g\n", rel, max_abs);
  // fp32 accumulation over <= 64-term dot products of O(1) values: ~1e-6 relative.
  EXPECT_LE(rel, 2e-5);
}

// Build a 1-layer model whose attention contributes nothing and whose experts are constant
// (zero MXFP4 weights), so the residual after the MoE is known in closed form; an identity
// lm_head with unit norm gains then makes logits = rmsnorm(residual).
struct ProbeModel : MiniModel {
  explicit ProbeModel(mx::ModelConfig c) : MiniModel(c) {
    mx::LayerWeights& L = w.layers[0];
    const size_t H = c.hidden_size, V = c.vocab_size;
    auto set = [&](const uint16_t* p, size_t n, float val) {
      for (auto& v : bf)
        if (v.data() == p) std::fill(v.begin(), v.begin() + n, f32_to_bf16(val));
    };
    set(L.o_w, H * c.q_dim(), 0.0f);
    set(L.o_b, H, 0.0f);
    set(L.router_w, c.num_experts * H, 0.0f);
    set(L.router_b, c.num_experts, 0.0f);
    set(w.final_norm, H, 1.0f);
    for (auto& v : u8)
      if (v.data() == L.gate_up_blocks || v.data() == L.down_blocks) std::fill(v.begin(), v.end(), 0);
    for (auto& v : bf)
      if (v.data() == w.lm_head)
        for (size_t r = 0; r < V; ++r)
          for (size_t i = 0; i < H; ++i) v[r * H + i] = f32_to_bf16(r == i ? 1.0f : 0.0f);
  }
  uint16_t* mut(const uint16_t* p) { return const_cast<uint16_t*>(p); }
  std::vector<float> run(int token, float* route_margin = nullptr) {
    mx::ThreadPool pool(1);
    mx::CpuReference ref(cfg, w, &pool);
    mx::CpuKvCache kv;
    kv.allocate(cfg, 16, 1);
    const int32_t table[1] = {0};
    std::vector<float> logits(cfg.vocab_size);
    ref.forward_token(token, 0, table, table, kv, logits.data());  // one layer: no sharing
    if (route_margin) *route_margin = ref.route_margin();
    return logits;
  }
  std::vector<double> rmsnorm(std::vector<double> x) const {
    double ss = 0;
    for (double e : x) ss += e * e;
    const double r = 1.0 / std::sqrt(ss / x.size() + cfg.rms_norm_eps);
    for (double& e : x) e *= r;
    return x;
  }
};

mx::ModelConfig probe_config() {
  mx::ModelConfig c = small_config();
  c.num_layers = 1;
  c.layer_is_sliding = {0};
  c.num_experts = 6;
  c.experts_per_token = 3;
  c.vocab_size = 64;  // == hidden: identity lm_head
  return c;
}

TEST(CpuReference, RouterTiesGoToLowestIndex) {
  ProbeModel m(probe_config());
  const mx::ModelConfig& c = m.cfg;
  const int H = c.hidden_size, I = c.intermediate_size;
  mx::LayerWeights& L = m.w.layers[0];
  // Zero weights: h = bias. gate = up = 0 gives act = 0, so y_e = down_bias[e].
  std::fill(m.mut(L.gate_up_bias), m.mut(L.gate_up_bias) + c.num_experts * 2 * I, 0);
  // Expert e adds e+1 on hidden unit e: which experts ran is visible in the logits.
  std::fill(m.mut(L.down_bias), m.mut(L.down_bias) + c.num_experts * H, 0);
  for (int e = 0; e < c.num_experts; ++e) m.mut(L.down_bias)[e * H + e] = f32_to_bf16(float(e + 1));
  // Router: experts 4 and 1 tie at the top, then 2, 3, 5 tie: top-3 = {1, 4, 2}, weights softmax(1, 1, 0).
  uint16_t* rb = m.mut(L.router_b);
  const float rl[6] = {-1, 1, 0, 0, 1, 0};
  for (int e = 0; e < 6; ++e) rb[e] = f32_to_bf16(rl[e]);
  const int token = 9;
  std::vector<double> x(H);
  for (int i = 0; i < H; ++i) x[i] = bf16_to_f32(m.w.embed[size_t(token) * H + i]);
  const double z = 2 * std::exp(1.0) + 1.0;
  x[1] += 2 * std::exp(1.0) / z;
  x[4] += 5 * std::exp(1.0) / z;
  x[2] += 3 * 1.0 / z;
  auto want = m.rmsnorm(x);
  auto got = m.run(token);
  for (int i = 0; i < H; ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << i;
}

// route_margin: the gap between the last expert taken and the first left out (the tests' near-tie check).
TEST(CpuReference, RouteMarginIsTheGapBelowTheTopK) {
  ProbeModel m(probe_config());
  uint16_t* rb = m.mut(m.w.layers[0].router_b);
  const float rl[6] = {-1, 1, 0.5f, 0.25f, 1, 0};  // top-3 {1, 4, 2}; the first left out: 3, 0.25 below
  for (int e = 0; e < 6; ++e) rb[e] = f32_to_bf16(rl[e]);
  float margin = -1;
  m.run(9, &margin);
  EXPECT_FLOAT_EQ(margin, 0.25f);
  rb[3] = f32_to_bf16(0.5f);  // a tie with the third: no margin
  m.run(9, &margin);
  EXPECT_FLOAT_EQ(margin, 0.f);
}

TEST(CpuReference, SwigluClampsGateAndUp) {
  ProbeModel m(probe_config());
  const mx::ModelConfig& c = m.cfg;
  const int H = c.hidden_size, I = c.intermediate_size;
  mx::LayerWeights& L = m.w.layers[0];
  std::fill(m.mut(L.router_b), m.mut(L.router_b) + c.num_experts, 0);
  std::fill(m.mut(L.down_bias), m.mut(L.down_bias) + c.num_experts * H, 0);
  // Down weights: output unit i reads act[i] with weight 1 (fp4 code 2 = 1.0, scale 2^0).
  for (auto& v : m.u8)
    if (v.data() == L.down_scales) std::fill(v.begin(), v.end(), 127);
  uint8_t* db = const_cast<uint8_t*>(L.down_blocks);
  for (int e = 0; e < c.num_experts; ++e)
    for (int i = 0; i < I; ++i) db[(size_t(e) * H + i) * (I / 2) + i / 2] |= uint8_t(2 << (4 * (i % 2)));
  // (gate, up) pairs probing the clamp: gate only from above, up both ways.
  const float cases[5][2] = {{10, -9}, {-10, 9}, {0.5f, 2}, {7, 7}, {-3, -20}};
  uint16_t* gb = m.mut(L.gate_up_bias);
  std::fill(gb, gb + c.num_experts * 2 * I, 0);
  for (int e = 0; e < c.num_experts; ++e)
    for (int k = 0; k < 5; ++k) {
      gb[size_t(e) * 2 * I + 2 * k] = f32_to_bf16(cases[k][0]);      // even row: gate
      gb[size_t(e) * 2 * I + 2 * k + 1] = f32_to_bf16(cases[k][1]);  // odd row: up
    }
  const int token = 3;
  std::vector<double> x(H);
  for (int i = 0; i < H; ++i) x[i] = bf16_to_f32(m.w.embed[size_t(token) * H + i]);
  // All experts identical and ties everywhere: the top-k mix of equal outputs is that output.
  for (int k = 0; k < 5; ++k) {
    double g = std::min<double>(cases[k][0], 7.0), u = std::clamp<double>(cases[k][1], -7.0, 7.0);
    x[k] += g / (1 + std::exp(-1.702 * g)) * (u + 1);
  }
  // Unused rows i >= 5: gate = up = 0 gives 0.
  auto want = m.rmsnorm(x);
  auto got = m.run(token);
  for (int i = 0; i < H; ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << i;
}

}  // namespace
