// Flash prefill attention vs the double CPU reference, over a paged cache with shuffled blocks.
// Tolerance: P and the output are bf16 (rel 2^-8 each) with fp32 accumulation:
// per element |d| <= 2e-2 * (|ref| + rms(ref)) and rel L2 < 1e-2. The FP8 cache: the reference reads
// the same E4M3 bytes (widened exactly), so the same tolerance holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "core/bf16.h"
#include "core/fp8.h"
#include "kernels/attention_prefill/attention_prefill.h"
#include "tests/kernels/gpu_test_util.h"

namespace mx::cuda {
namespace {

std::vector<uint16_t> rand_bf16(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& x : v) { float f = d(g); x = f32_to_bf16(f == 0.f ? 0.01f : f); }
  return v;
}

using mx::test::to_dev;

// poison: the rows no query may see (before the first query's window, past the last key) hold NaN,
// as blocks the sliding layers gave back may: the output must not change.
struct Case { int T, start, window, block_size; float sink_lo, sink_hi; bool poison = false; bool fp8 = false; };

std::vector<float> run_case(const Case& c, std::vector<float>* ref_out) {
  const int Hq = 64, Hkv = 8, D = 64, qs = (Hq + 2 * Hkv) * D;
  const int L = c.start + c.T, nblk = (L + c.block_size - 1) / c.block_size + 3;
  auto q = rand_bf16(size_t(c.T) * qs, -2.f, 2.f, 11);
  auto k = rand_bf16(size_t(nblk) * c.block_size * Hkv * D, -2.f, 2.f, 12);
  auto v = rand_bf16(size_t(nblk) * c.block_size * Hkv * D, -1.f, 1.f, 13);
  auto sinks = rand_bf16(Hq, c.sink_lo, c.sink_hi, 14);
  std::vector<int32_t> bt(nblk);
  std::iota(bt.begin(), bt.end(), 0);
  std::shuffle(bt.begin(), bt.end(), std::mt19937(15));
  if (c.poison)
    for (int j = 0; j < nblk * c.block_size; ++j)
      if (j >= L || (c.window > 0 && j <= c.start - c.window)) {
        const size_t row = size_t(bt[size_t(j / c.block_size)]) * c.block_size + j % c.block_size;
        std::fill_n(k.begin() + long(row * Hkv * D), Hkv * D, uint16_t(0x7fc0));
        std::fill_n(v.begin() + long(row * Hkv * D), Hkv * D, uint16_t(0x7fc0));
      }
  std::vector<uint8_t> k8(k.size()), v8(v.size());  // E4M3 roundings (NaN stays NaN)
  for (size_t i = 0; i < k.size(); ++i) k8[i] = f32_to_e4m3(bf16_to_f32(k[i])), v8[i] = f32_to_e4m3(bf16_to_f32(v[i]));
  AttnPrefillParams p;
  p.q = q.data(); p.q_stride = qs; p.kv.k = k.data(); p.kv.v = v.data(); p.block_table = bt.data();
  if (c.fp8) p.kv.k = k8.data(), p.kv.v = v8.data(), p.kv.dtype = KvDtype::kFp8E4m3;
  p.sinks = sinks.data(); p.T = c.T; p.start = c.start; p.Hq = Hq; p.Hkv = Hkv; p.kv.block_size = c.block_size;
  p.window = c.window;
  if (ref_out) { ref_out->assign(size_t(c.T) * Hq * D, 0.f); attention_prefill_ref(p, ref_out->data()); }
  uint16_t* dout = nullptr;
  cudaMalloc(&dout, size_t(c.T) * Hq * D * 2);
  cudaMemset(dout, 0xff, size_t(c.T) * Hq * D * 2);
  AttnPrefillParams d = p;
  d.q = to_dev(q); d.block_table = to_dev(bt); d.sinks = to_dev(sinks);
  if (c.fp8) d.kv.k = to_dev(k8), d.kv.v = to_dev(v8);
  else d.kv.k = to_dev(k), d.kv.v = to_dev(v);
  d.out = dout;
  attention_prefill_bf16(d, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> h(size_t(c.T) * Hq * D);
  cudaMemcpy(h.data(), dout, h.size() * 2, cudaMemcpyDeviceToHost);
  cudaFree((void*)d.q); cudaFree(d.kv.k); cudaFree(d.kv.v); cudaFree((void*)d.block_table);
  cudaFree((void*)d.sinks); cudaFree(dout);
  std::vector<float> got(h.size());
  for (size_t i = 0; i < h.size(); ++i) got[i] = bf16_to_f32(h[i]);
  return got;
}

class AttnPrefill : public ::testing::TestWithParam<Case> {};

TEST_P(AttnPrefill, MatchesReference) {
  std::vector<float> ref;
  auto got = run_case(GetParam(), &ref);
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) { num += double(got[i] - ref[i]) * (got[i] - ref[i]); den += double(ref[i]) * ref[i]; }
  const double rms = std::sqrt(den / ref.size());
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (!(std::fabs(got[i] - ref[i]) <= 2e-2 * (std::fabs(ref[i]) + rms))) ++bad;
  EXPECT_EQ(bad, 0u);
  EXPECT_LT(std::sqrt(num / den), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttnPrefill,
                         ::testing::Values(Case{1, 0, 0, 16, -1, 1}, Case{7, 0, 128, 16, -1, 1},
                                           Case{65, 0, 0, 16, -1, 1}, Case{333, 0, 128, 32, -1, 1},
                                           Case{333, 0, 0, 32, -1, 1}, Case{100, 250, 128, 16, -1, 1},
                                           Case{100, 250, 0, 16, 0, 3}, Case{200, 0, 0, 16, 4, 6},
                                           Case{100, 250, 128, 16, -1, 1, true}, Case{333, 517, 128, 32, -1, 1, true},
                                           Case{45, 90, 0, 16, -1, 1, true}));
INSTANTIATE_TEST_SUITE_P(Fp8Cache, AttnPrefill,
                         ::testing::Values(Case{1, 0, 0, 16, -1, 1, false, true}, Case{65, 0, 0, 16, -1, 1, false, true},
                                           Case{333, 0, 128, 32, -1, 1, false, true},
                                           Case{100, 250, 0, 16, 0, 3, false, true},
                                           Case{333, 517, 128, 32, -1, 1, true, true},
                                           Case{45, 90, 0, 16, -1, 1, true, true},
                                           Case{64, 4000, 0, 16, -1, 1, false, true}));

// A large sink absorbs almost all the weight: outputs shrink vs a very negative sink.
TEST(AttnPrefillSink, LargeSinkShrinksOutput) {
  auto lo = run_case(Case{65, 0, 0, 16, -30, -29}, nullptr);
  auto hi = run_case(Case{65, 0, 0, 16, 20, 21}, nullptr);
  double a = 0, b = 0;
  for (size_t i = 0; i < lo.size(); ++i) { a += std::fabs(lo[i]); b += std::fabs(hi[i]); }
  EXPECT_LT(b, 1e-3 * a);
}

}  // namespace
}  // namespace mx::cuda
