// cuBLASLt bf16 GEMM vs the double CPU reference. Tolerance: output rounded to bf16 (rel 2^-8) plus
// fp32-accumulation-order noise; per element |d| <= 1e-2 * (|ref| + rms(ref)), and rel L2 < 1e-2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "core/bf16.h"
#include "kernels/gemm/gemm_bf16.h"
#include "tests/kernels/gpu_test_util.h"

namespace mx::cuda {
namespace {

std::vector<uint16_t> rand_bf16(size_t n, float scale, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    float f = d(g);
    if (f == 0.f) f = scale * 0.5f;
    x = f32_to_bf16(f);
  }
  return v;
}

using mx::test::to_dev;

void check(const std::vector<float>& got, const std::vector<float>& ref, const char* what) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) { num += (got[i] - ref[i]) * double(got[i] - ref[i]); den += double(ref[i]) * ref[i]; }
  const double rms = std::sqrt(den / ref.size());
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (!(std::fabs(got[i] - ref[i]) <= 1e-2 * (std::fabs(ref[i]) + rms))) ++bad;
  EXPECT_EQ(bad, 0u) << what;
  EXPECT_LT(std::sqrt(num / den), 1e-2) << what;
}

struct Case { int M, N, K; bool bias, f32, acc; };

class GemmBf16 : public ::testing::TestWithParam<Case> {};

TEST_P(GemmBf16, MatchesReference) {
  const Case c = GetParam();
  auto x = rand_bf16(size_t(c.M) * c.K, 1.0f, 1);
  auto w = rand_bf16(size_t(c.N) * c.K, 0.05f, 2);
  auto b = rand_bf16(c.N, 0.5f, 3);
  std::vector<float> y0(size_t(c.M) * c.N);
  std::mt19937 g(4);
  std::uniform_real_distribution<float> d(-1, 1);
  for (auto& v : y0) v = c.f32 ? d(g) : round_bf16(d(g));
  std::vector<float> ref = y0;
  gemm_bf16_ref(x.data(), w.data(), c.bias ? b.data() : nullptr, ref.data(), c.M, c.N, c.K, !c.f32, c.acc);

  GemmContext* ctx = gemm_context_create();
  uint16_t *dx = to_dev(x), *dw = to_dev(w), *db = to_dev(b);
  void* dy = nullptr;
  const size_t esz = c.f32 ? 4 : 2;
  ASSERT_EQ(cudaMalloc(&dy, y0.size() * esz), cudaSuccess);
  if (c.acc) {
    if (c.f32) cudaMemcpy(dy, y0.data(), y0.size() * 4, cudaMemcpyHostToDevice);
    else {
      std::vector<uint16_t> h(y0.size());
      for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(y0[i]);
      cudaMemcpy(dy, h.data(), h.size() * 2, cudaMemcpyHostToDevice);
    }
  } else {
    cudaMemset(dy, 0xff, y0.size() * esz);  // NaN poison
  }
  GemmBf16Params p;
  p.x = dx; p.w = dw; p.bias = c.bias ? db : nullptr; p.y = dy;
  p.M = c.M; p.N = c.N; p.K = c.K; p.y_f32 = c.f32; p.accumulate = c.acc;
  gemm_bf16(ctx, p, nullptr);
  gemm_bf16(ctx, p.accumulate ? GemmBf16Params{} : p, nullptr);  // second call hits the plan cache
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got(y0.size());
  if (c.f32) cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost);
  else {
    std::vector<uint16_t> h(got.size());
    cudaMemcpy(h.data(), dy, h.size() * 2, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < h.size(); ++i) got[i] = bf16_to_f32(h[i]);
  }
  check(got, ref, "gemm");
  cudaFree(dx); cudaFree(dw); cudaFree(db); cudaFree(dy);
  gemm_context_destroy(ctx);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmBf16,
                         ::testing::Values(Case{1, 512, 2880, true, false, false}, Case{7, 5120, 2880, true, false, false},
                                           Case{65, 2880, 4096, true, true, true}, Case{333, 2880, 4096, true, false, true},
                                           Case{333, 128, 2880, true, true, false}, Case{65, 32, 2880, true, true, false},
                                           Case{2051, 256, 2880, false, true, false}));

}  // namespace
}  // namespace mx::cuda
