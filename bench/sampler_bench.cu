// Filtered-sampling kernel (kernels/sampling/sample_filtered.h) at the gpt-oss vocabulary: time per
// call for S rows of 201,088 logits, each filter alone and combined. Random logits N(0, 3): a spread
// distribution, so top_p keeps thousands of tokens and the radix passes run to the end.
#include <cstdio>
#include <cstdint>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/sampling/sample_filtered.h"

using namespace mx::cuda;

int main() {
  const int V = 201088, kMaxS = 64;
  std::vector<float> h(size_t(kMaxS) * V);
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (float& x : h) x = nd(g);
  float *lg, *it, *tp, *mp, *lp;
  int32_t *tk, *tok;
  uint64_t* keys;
  cudaMalloc(&lg, h.size() * 4);
  cudaMemcpy(lg, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  cudaMalloc(&it, kMaxS * 4); cudaMalloc(&tp, kMaxS * 4); cudaMalloc(&mp, kMaxS * 4); cudaMalloc(&lp, kMaxS * 4);
  cudaMalloc(&tk, kMaxS * 4); cudaMalloc(&tok, kMaxS * 4); cudaMalloc(&keys, kMaxS * 8);
  std::vector<uint64_t> hk(kMaxS);
  for (int s = 0; s < kMaxS; ++s) hk[s] = 0x9e3779b97f4a7c15ull * (s + 1);
  cudaMemcpy(keys, hk.data(), kMaxS * 8, cudaMemcpyHostToDevice);
  struct Case { const char* name; int top_k; float top_p, min_p; };
  const Case cases[] = {{"top_k 50", 50, 1.f, 0.f}, {"top_p 0.9", 0, 0.9f, 0.f}, {"min_p 0.05", 0, 1.f, 0.05f},
                        {"top_k 50 + top_p 0.9", 50, 0.9f, 0.f}, {"top_k 1000 + top_p 0.95 + min_p 0.01", 1000, 0.95f, 0.01f}};
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  std::printf("| filter | rows | us per call |\n|---|---|---|\n");
  for (const Case& c : cases)
    for (int S : {1, 8, 64}) {
      std::vector<float> vi(S, 1.f / 0.8f), vp(S, c.top_p), vm(S, c.min_p);
      std::vector<int32_t> vk(S, c.top_k);
      cudaMemcpy(it, vi.data(), S * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(tp, vp.data(), S * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(mp, vm.data(), S * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(tk, vk.data(), S * 4, cudaMemcpyHostToDevice);
      SampleFilterParams p;
      p.logits = lg; p.stride = V; p.V = V; p.S = S; p.inv_temp = it; p.keys = keys; p.top_k = tk; p.top_p = tp;
      p.min_p = mp; p.tok = tok; p.logprob = lp;
      sample_filtered(p, nullptr);
      const int iters = 20;
      cudaEventRecord(a);
      for (int i = 0; i < iters; ++i) sample_filtered(p, nullptr);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      std::printf("| %s | %d | %.1f |\n", c.name, S, 1000.0 * ms / iters);
    }
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
