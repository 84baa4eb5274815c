// CPU reference for the prefill MoE block (double accumulation, bf16 rounding where the GPU rounds).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/bf16.h"
#include "core/mxfp4.h"
#include "kernels/moe_prefill/moe_prefill.h"

namespace mx::cuda {

void moe_prefill_ref(const uint8_t* b1, const uint8_t* s1, const uint16_t* bias1, const uint8_t* b2,
                     const uint8_t* s2, const uint16_t* bias2, const uint16_t* x, const int32_t* idx,
                     const float* w, float* resid, int T, int k, int H, int I, float alpha, float limit) {
  std::vector<float> wrow(H > I ? H : I), act(I);
  std::vector<double> acc(H);
  for (int t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int j = 0; j < k; ++j) {
      const int e = idx[t * k + j];
      for (int i = 0; i < I; ++i) {
        double hv[2];
        for (int u = 0; u < 2; ++u) {
          const size_t n = size_t(e) * 2 * I + 2 * i + u;
          mxfp4_decode_row(b1 + n * (H / 2), s1 + n * (H / 32), H, wrow.data());
          double a = 0;
          for (int c = 0; c < H; ++c) a += double(wrow[c]) * bf16_to_f32(x[size_t(t) * H + c]);
          hv[u] = a + bf16_to_f32(bias1[n]);
        }
        double g = std::min(hv[0], double(limit)), up = std::clamp(hv[1], -double(limit), double(limit));
        act[i] = round_bf16(float(g / (1.0 + std::exp(-alpha * g)) * (up + 1.0)));
      }
      for (int h = 0; h < H; ++h) {
        const size_t n = size_t(e) * H + h;
        mxfp4_decode_row(b2 + n * (I / 2), s2 + n * (I / 32), I, wrow.data());
        double a = 0;
        for (int c = 0; c < I; ++c) a += double(wrow[c]) * act[c];
        acc[h] += w[t * k + j] * (a + bf16_to_f32(bias2[n]));
      }
    }
    for (int h = 0; h < H; ++h) resid[size_t(t) * H + h] += float(acc[h]);
  }
}

}  // namespace mx::cuda
