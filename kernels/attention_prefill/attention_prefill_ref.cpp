// CPU reference for attention_prefill (host pointers, bf16 or fp8 cache), double-precision softmax with the sink.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/bf16.h"
#include "core/fp8.h"
#include "kernels/attention_prefill/attention_prefill.h"

namespace mx::cuda {

void attention_prefill_ref(const AttnPrefillParams& p, float* out) {
  const int D = 64, qm = p.Hq / p.Hkv, L = p.start + p.T, bs = p.kv.block_size;
  const size_t row_len = size_t(p.Hkv) * D;
  auto kv_at = [&](const void* a, size_t i) {  // the cache's value, widened exactly
    return p.kv.fp8() ? e4m3_to_f32(static_cast<const uint8_t*>(a)[i]) : bf16_to_f32(static_cast<const uint16_t*>(a)[i]);
  };
  // The cache widened once in position order: every query head re-reads each key (long prompts took ~50 s).
  const int first = p.window > 0 ? std::max(0, p.start - p.window + 1) : 0;  // no query looks before it
  std::vector<float> k(size_t(L) * row_len), v(k.size());
  for (int j = first; j < L; ++j) {
    const size_t src = (size_t(p.block_table[j / bs]) * bs + j % bs) * row_len, dst = size_t(j) * row_len;
    for (size_t i = 0; i < row_len; ++i) k[dst + i] = kv_at(p.kv.k, src + i), v[dst + i] = kv_at(p.kv.v, src + i);
  }
  std::vector<double> l(static_cast<size_t>(L)), q(D), o(D);
  for (int t = 0; t < p.T; ++t) {
    const int pos = p.start + t;
    const int j0 = p.window > 0 ? std::max(0, pos - p.window + 1) : 0;
    for (int h = 0; h < p.Hq; ++h) {
      const int kvh = h / qm;
      for (int d = 0; d < D; ++d) q[d] = bf16_to_f32(p.q[size_t(t) * p.q_stride + h * D + d]);
      double m = bf16_to_f32(p.sinks[h]);
      for (int j = j0; j <= pos; ++j) {
        const float* kr = &k[size_t(j) * row_len + size_t(kvh) * D];
        double acc = 0;
        for (int d = 0; d < D; ++d) acc += q[d] * kr[d];
        l[j] = acc * p.scale;
        m = std::max(m, l[j]);
      }
      double den = std::exp(double(bf16_to_f32(p.sinks[h])) - m);
      for (int j = j0; j <= pos; ++j) { l[j] = std::exp(l[j] - m); den += l[j]; }
      std::fill(o.begin(), o.end(), 0.0);
      for (int j = j0; j <= pos; ++j) {
        const float* vr = &v[size_t(j) * row_len + size_t(kvh) * D];
        for (int d = 0; d < D; ++d) o[d] += l[j] * vr[d];
      }
      for (int d = 0; d < D; ++d) out[size_t(t) * p.Hq * D + h * D + d] = float(o[d] / den);
    }
  }
}

}  // namespace mx::cuda
