// Host-side pieces of the GEMM family: error bridge and the CPU reference.
#include <string>

#include "core/bf16.h"
#include "core/error.h"
#include "kernels/gemm/gemm_bf16.h"

namespace mx::cuda {

void gemm_throw(const std::string& what) { mx::fail("{}", what); }

void gemm_bf16_ref(const uint16_t* x, const uint16_t* w, const uint16_t* bias, float* y, int M, int N, int K,
                   bool round_bf16, bool accumulate) {
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double acc = 0;
      for (int k = 0; k < K; ++k) acc += double(bf16_to_f32(x[size_t(m) * K + k])) * bf16_to_f32(w[size_t(n) * K + k]);
      if (bias) acc += bf16_to_f32(bias[n]);
      float& out = y[size_t(m) * N + n];
      float v = float(acc) + (accumulate ? out : 0.0f);
      out = round_bf16 ? bf16_to_f32(f32_to_bf16(v)) : v;
    }
}

}  // namespace mx::cuda
