#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mx {

YarnParams yarn_inv_freq(const ModelConfig& c, float* inv_freq) {
  const int d = c.head_dim, d_half = d / 2;
  const double base = c.rope_theta, s = c.rope_scaling.factor;
  const double L0 = c.rope_scaling.original_max_position_embeddings;
  auto correction_dim = [&](double beta) { return d_half * std::log(L0 / (beta * 2.0 * std::numbers::pi)) / std::log(base); };
  double low = correction_dim(c.rope_scaling.beta_fast), high = correction_dim(c.rope_scaling.beta_slow);
  if (c.rope_scaling.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(d - 1));
  if (low == high) high += 0.001;  // as HF: avoid a zero-width ramp
  YarnParams p;
  p.low = float(low);
  p.high = float(high);
  p.concentration = s > 1.0 ? float(0.1 * std::log(s) + 1.0) : 1.0f;
  for (int i = 0; i < d_half; ++i) {
    // fp32 like the references: base ** (arange(0, d, 2) / d)
    float freq = std::pow(float(base), float(2 * i) / float(d));
    float extrap = 1.0f / freq, interp = 1.0f / (float(s) * freq);
    float ramp = std::clamp(float((i - low) / (high - low)), 0.0f, 1.0f);
    inv_freq[i] = interp * ramp + extrap * (1.0f - ramp);
  }
  return p;
}

void rope_rotate_f32(float* x, int head_dim, int pos, const float* inv_freq, float concentration) {
  const int h = head_dim / 2;
  for (int i = 0; i < h; ++i) {
    float angle = float(pos) * inv_freq[i];
    float c = std::cos(angle) * concentration, s = std::sin(angle) * concentration;
    float x1 = x[i], x2 = x[i + h];
    x[i] = x1 * c - x2 * s;
    x[i + h] = x2 * c + x1 * s;
  }
}

}  // namespace mx
