#include "model/cpu_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/bf16.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/mxfp4.h"
#include "model/rope.h"

namespace mx {
namespace {
// dot(decoded MXFP4 row of K elements, x) without materialising the row (exact decode: the
// E2M1 value times a power of two is exact in fp32; only the fp32 accumulation rounds).
float f32_dot_mxfp4_row(const uint8_t* blocks, const uint8_t* scales, const float* x, int K) {
  float acc = 0;
  for (int g = 0; g < K / 32; ++g) {
    const float m = e8m0_to_f32(scales[g]);
    float part = 0;
    for (int j = 0; j < 16; ++j) {
      const uint8_t b = blocks[g * 16 + j];
      part += kFp4Values[b & 0x0f] * x[g * 32 + 2 * j] + kFp4Values[b >> 4] * x[g * 32 + 2 * j + 1];
    }
    acc += part * m;
  }
  return acc;
}
}  // namespace

void CpuKvCache::allocate(const ModelConfig& cfg, int bs, int nb) {
  block_size = bs;
  num_blocks = nb;
  size_t n = size_t(bs) * nb * cfg.kv_dim();
  array_of = cfg.kv_array_of_layers();
  const int arrays = array_of.empty() ? 0 : *std::max_element(array_of.begin(), array_of.end()) + 1;
  k.assign(size_t(arrays), std::vector<float>(n));
  v.assign(k.size(), std::vector<float>(n));
}

CpuReference::CpuReference(const ModelConfig& cfg, const ModelWeights& w, ThreadPool* pool)
    : cfg_(cfg), w_(w), pool_(pool) {
  inv_freq_.resize(cfg.head_dim / 2);
  concentration_ = yarn_inv_freq(cfg, inv_freq_.data()).concentration;
  const int H = cfg.hidden_size;
  x_.resize(H);
  t_.resize(H);
  q_.resize(cfg.q_dim());
  k_.resize(cfg.kv_dim());
  v_.resize(cfg.kv_dim());
  attn_.resize(cfg.q_dim());
  proj_.resize(H);
  router_.resize(cfg.num_experts);
  h_.resize(size_t(2) * cfg.intermediate_size * cfg.experts_per_token);
  act_.resize(size_t(cfg.intermediate_size) * cfg.experts_per_token);
  y_.resize(size_t(H) * cfg.experts_per_token);
  moe_out_.resize(H);
  expert_idx_.resize(cfg.num_experts);
  expert_w_.resize(cfg.experts_per_token);
  scores_.resize(size_t(std::clamp(cfg.max_position_embeddings, 1, 1 << 16)));
}

void CpuReference::matvec_bf16(const uint16_t* w, const uint16_t* bias, const float* x, float* y, int rows, int cols) {
  auto body = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint16_t* wr = w + size_t(r) * cols;
      float acc[4] = {0, 0, 0, 0};
      int c = 0;
      for (; c + 4 <= cols; c += 4)
        for (int u = 0; u < 4; ++u) acc[u] += bf16_to_f32(wr[c + u]) * x[c + u];
      for (; c < cols; ++c) acc[0] += bf16_to_f32(wr[c]) * x[c];
      y[r] = (acc[0] + acc[1]) + (acc[2] + acc[3]) + (bias ? bf16_to_f32(bias[r]) : 0.0f);
    }
  };
  if (int64_t(rows) * cols >= (1 << 16) && pool_) pool_->parallel_for(rows, body);
  else body(0, rows);
}

void CpuReference::rmsnorm(const float* x, const uint16_t* gamma, float* y) const {
  const int H = cfg_.hidden_size;
  double ss = 0;
  for (int i = 0; i < H; ++i) ss += double(x[i]) * x[i];
  float r = 1.0f / std::sqrt(float(ss / H) + cfg_.rms_norm_eps);
  for (int i = 0; i < H; ++i) y[i] = bf16_to_f32(gamma[i]) * (x[i] * r);
}

void CpuReference::attention(int l, int pos, const int32_t* table, CpuKvCache& kv) {
  const int D = cfg_.head_dim, Hq = cfg_.num_heads, group = cfg_.num_heads / cfg_.num_kv_heads, kvd = cfg_.kv_dim();
  const int bs = kv.block_size;
  auto slot = [&](int p) { return (size_t(table[p / bs]) * bs + p % bs) * kvd; };
  std::vector<float>& kc = kv.k[size_t(kv.array_of[size_t(l)])];
  std::vector<float>& vc = kv.v[size_t(kv.array_of[size_t(l)])];
  std::copy(k_.begin(), k_.end(), kc.begin() + slot(pos));
  std::copy(v_.begin(), v_.end(), vc.begin() + slot(pos));
  if (kv.fp8)
    for (int i = 0; i < kvd; ++i) {
      kc[slot(pos) + size_t(i)] = e4m3_round(kc[slot(pos) + size_t(i)]);
      vc[slot(pos) + size_t(i)] = e4m3_round(vc[slot(pos) + size_t(i)]);
    }
  // Sliding layers see the last `sliding_window` positions including this one.
  const int lo = cfg_.layer_is_sliding[l] ? std::max(0, pos - cfg_.sliding_window + 1) : 0;
  const float scale = 1.0f / std::sqrt(float(D));
  if (scores_.size() < size_t(pos - lo + 1)) scores_.resize(size_t(pos - lo + 1));  // grows rarely
  float* s = scores_.data();
  const int n = pos - lo + 1;
  for (int h = 0; h < Hq; ++h) {
    const int kvh = h / group;
    const float* q = &q_[size_t(h) * D];
    const float sink = bf16_to_f32(w_.layers[l].sinks[h]);
    float m = sink;  // the sink is one more logit in the softmax, with no value vector
    for (int j = lo; j <= pos; ++j) {
      const float* kj = &kc[slot(j) + size_t(kvh) * D];
      float dot = 0;
      for (int d = 0; d < D; ++d) dot += q[d] * kj[d];
      s[j - lo] = dot * scale;
      m = std::max(m, s[j - lo]);
    }
    double denom = std::exp(double(sink) - m);
    for (int j = 0; j < n; ++j) {
      s[j] = float(std::exp(double(s[j]) - m));
      denom += s[j];
    }
    float* o = &attn_[size_t(h) * D];
    std::fill(o, o + D, 0.0f);
    for (int j = lo; j <= pos; ++j) {
      const float* vj = &vc[slot(j) + size_t(kvh) * D];
      const float wgt = float(s[j - lo] / denom);
      for (int d = 0; d < D; ++d) o[d] += wgt * vj[d];
    }
  }
}

void CpuReference::moe(int l) {
  const LayerWeights& L = w_.layers[l];
  const int H = cfg_.hidden_size, I = cfg_.intermediate_size, E = cfg_.num_experts, K = cfg_.experts_per_token;
  matvec_bf16(L.router_w, L.router_b, t_.data(), router_.data(), E, H);
  // Top-k on raw logits (lowest index wins ties), then softmax over the k.
  std::vector<int>& idx = expert_idx_;
  std::iota(idx.begin(), idx.end(), 0);
  const int ranked = std::min(E, K + 1);  // the first expert left out too, for route_margin
  std::partial_sort(idx.begin(), idx.begin() + ranked, idx.end(), [&](int a, int b) {
    return router_[a] > router_[b] || (router_[a] == router_[b] && a < b);
  });
  if (E > K) route_margin_ = std::min(route_margin_, router_[idx[K - 1]] - router_[idx[K]]);
  std::vector<float>& g = expert_w_;
  float m = router_[idx[0]];
  double z = 0;
  for (int j = 0; j < K; ++j) z += (g[j] = std::exp(router_[idx[j]] - m));
  for (auto& x : g) x = float(x / z);

  const float limit = cfg_.swiglu_limit, alpha = cfg_.swiglu_alpha;
  const size_t up_row = H / 2, up_scale_row = H / 32, down_row = I / 2, down_scale_row = I / 32;
  // FC1 + SwiGLU: rows of the K experts in parallel.
  pool_->parallel_for(int64_t(K) * 2 * I, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int j = int(r / (2 * I)), row = int(r % (2 * I)), ex = idx[j];
      size_t R = size_t(ex) * 2 * I + row;
      float acc = f32_dot_mxfp4_row(L.gate_up_blocks + R * up_row, L.gate_up_scales + R * up_scale_row, t_.data(), H);
      h_[r] = acc + bf16_to_f32(L.gate_up_bias[R]);
    }
  });
  for (int j = 0; j < K; ++j)
    for (int i = 0; i < I; ++i) {
      // Interleaved rows: even = gate, odd = linear ("up").
      float gate = std::min(h_[size_t(j) * 2 * I + 2 * i], limit);
      float up = std::clamp(h_[size_t(j) * 2 * I + 2 * i + 1], -limit, limit);
      float glu = gate / (1.0f + std::exp(-alpha * gate));
      act_[size_t(j) * I + i] = glu * (up + 1.0f);
    }
  pool_->parallel_for(int64_t(K) * H, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int j = int(r / H), row = int(r % H), ex = idx[j];
      size_t R = size_t(ex) * H + row;
      float acc = f32_dot_mxfp4_row(L.down_blocks + R * down_row, L.down_scales + R * down_scale_row, &act_[size_t(j) * I], I);
      y_[r] = acc + bf16_to_f32(L.down_bias[R]);
    }
  });
  for (int h = 0; h < H; ++h) {
    float acc = 0;
    for (int j = 0; j < K; ++j) acc += g[j] * y_[size_t(j) * H + h];
    moe_out_[h] = acc;
  }
}

void CpuReference::forward_token(int32_t token, int pos, const int32_t* block_table, const int32_t* sliding_table,
                                 CpuKvCache& kv, float* logits) {
  const int H = cfg_.hidden_size, D = cfg_.head_dim;
  route_margin_ = std::numeric_limits<float>::infinity();
  for (int i = 0; i < H; ++i) x_[i] = bf16_to_f32(w_.embed[size_t(token) * H + i]);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    rmsnorm(x_.data(), L.attn_norm, t_.data());
    matvec_bf16(L.q_w, L.q_b, t_.data(), q_.data(), cfg_.q_dim(), H);
    matvec_bf16(L.k_w, L.k_b, t_.data(), k_.data(), cfg_.kv_dim(), H);
    matvec_bf16(L.v_w, L.v_b, t_.data(), v_.data(), cfg_.kv_dim(), H);
    for (int h = 0; h < cfg_.num_heads; ++h) rope_rotate_f32(&q_[size_t(h) * D], D, pos, inv_freq_.data(), concentration_);
    for (int h = 0; h < cfg_.num_kv_heads; ++h) rope_rotate_f32(&k_[size_t(h) * D], D, pos, inv_freq_.data(), concentration_);
    const bool sliding = cfg_.layer_is_sliding[size_t(l)];
    MX_CHECK(!sliding || sliding_table, "layer {} is a sliding-window layer and no sliding block table was given", l);
    attention(l, pos, sliding ? sliding_table : block_table, kv);
    matvec_bf16(L.o_w, L.o_b, attn_.data(), proj_.data(), H, cfg_.q_dim());
    for (int i = 0; i < H; ++i) x_[i] += proj_[i];
    rmsnorm(x_.data(), L.mlp_norm, t_.data());
    moe(l);
    for (int i = 0; i < H; ++i) x_[i] += moe_out_[i];
  }
  if (!logits) return;
  rmsnorm(x_.data(), w_.final_norm, t_.data());
  matvec_bf16(w_.lm_head, nullptr, t_.data(), logits, cfg_.vocab_size, H);
}

}  // namespace mx
