// CPU reference for attention_prefill (host pointers, bf16 or fp8 cache), double-precision softmax with the sink.
#include <cmath>
#include <vector>

#include "core/bf16.h"
#include "core/fp8.h"
#include "kernels/attention_prefill/attention_prefill.h"

namespace mx::cuda {

void attention_prefill_ref(const AttnPrefillParams& p, float* out) {
  const int D = 64, qm = p.Hq / p.Hkv;
  std::vector<double> l;
  for (int t = 0; t < p.T; ++t) {
    const int pos = p.start + t;
    for (int h = 0; h < p.Hq; ++h) {
      const int kvh = h / qm;
      const int j0 = p.window > 0 ? std::max(0, pos - p.window + 1) : 0;
      l.assign(size_t(pos + 1), 0.0);
      double m = bf16_to_f32(p.sinks[h]);
      auto kv_at = [&](const void* a, size_t i) {  // the cache's value, widened exactly
        return p.kv.fp8() ? e4m3_to_f32(static_cast<const uint8_t*>(a)[i]) : bf16_to_f32(static_cast<const uint16_t*>(a)[i]);
      };
      auto row = [&](int j) {
        return (size_t(p.block_table[j / p.kv.block_size]) * p.kv.block_size + j % p.kv.block_size) * p.Hkv + kvh;
      };
      for (int j = j0; j <= pos; ++j) {
        double acc = 0;
        for (int d = 0; d < D; ++d)
          acc += double(bf16_to_f32(p.q[size_t(t) * p.q_stride + h * D + d])) * kv_at(p.kv.k, row(j) * D + d);
        l[j] = acc * p.scale;
        m = std::max(m, l[j]);
      }
      double den = std::exp(double(bf16_to_f32(p.sinks[h])) - m);
      for (int j = j0; j <= pos; ++j) { l[j] = std::exp(l[j] - m); den += l[j]; }
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int j = j0; j <= pos; ++j) o += l[j] * kv_at(p.kv.v, row(j) * D + d);
        out[size_t(t) * p.Hq * D + h * D + d] = float(o / den);
      }
    }
  }
}

}  // namespace mx::cuda
