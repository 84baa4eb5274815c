// The FP8 MoE's two GEMMs alone (moe_fc1_fp8, moe_fc2_fp8) on uniform random routing: a step of T tokens,
// top-4 of E distinct experts a token, random weights. Unlike `mxserve bench`, the routing does not depend on
// what the kernels compute, so a diagnostic build with wrong outputs (docs/perf.md, session 56) still routes
// as the real one, and a kernel is timed without loading a model.
// Usage (GPU machine): moe_fp8_bench [T=256] [E=32] [H=2880] [I=2880] [tile_rows=0: the engine's choice]
// (20b: E 32; 120b: E 128.) Prints each GEMM's time, the routed experts' weight bytes a second and their % of
// the D2D copy bandwidth measured in the same run.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "bench/cuda_bench_util.cuh"
#include "core/bf16.h"
#include "kernels/moe_prefill/moe_prefill.h"

using namespace mx::cuda;

namespace {

// Random bytes on the device (weights are GBs at 120b: a host generator would take seconds); span > 0: lo +
// [0, span) (the E8M0 scales, near 2^-7).
__global__ void fill_k(uint8_t* p, size_t n, uint32_t seed, int lo, int span) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ uint32_t(i >> 32) ^ seed;
    h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12; h *= 0x297A2D39u; h ^= h >> 15;
    p[i] = span > 0 ? uint8_t(lo + int(h % uint32_t(span))) : uint8_t(h);
  }
}
template <class T>
T* dev(size_t n) {
  T* p = nullptr;
  CK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}
uint8_t* dev_random(size_t n, uint32_t seed, int lo = 0, int span = 0) {
  uint8_t* p = dev<uint8_t>(n);
  fill_k<<<1024, 256>>>(p, n, seed, lo, span);
  CK(cudaGetLastError());
  return p;
}
template <class T>
T* to_dev(const std::vector<T>& v) {
  T* p = dev<T>(v.size());
  CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const int T = argc > 1 ? std::atoi(argv[1]) : 256, E = argc > 2 ? std::atoi(argv[2]) : 32;
  const int H = argc > 3 ? std::atoi(argv[3]) : 2880, I = argc > 4 ? std::atoi(argv[4]) : 2880;
  const int forced = argc > 5 ? std::atoi(argv[5]) : 0, k = 4;
  if (T <= 0 || E < k || H % 32 || I % 32 || H <= 0 || I <= 0) {
    std::fprintf(stderr, "usage: moe_fp8_bench [T>0] [E>=4] [H%%32==0] [I%%32==0] [tile_rows]\n");
    return 2;
  }
  if (!moe_fp8_available()) {
    std::fprintf(stderr, "moe_fp8_bench: the FP8 MoE needs an sm_90 GPU\n");
    return 1;
  }
  const int tile_rows = forced ? forced : moe_prefill_tile_rows(T, k, E, true);
  const int max_tiles = (T * k + tile_rows - 1) / tile_rows + E;

  // Uniform routing, distinct experts a token (as prefill_kernels_bench); gate weights 1/k.
  std::mt19937 g(9);
  std::vector<int32_t> idx(size_t(T) * k);
  std::vector<float> w(size_t(T) * k, 1.f / k);
  std::vector<int> pool(E);
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) pool[e] = e;
    std::shuffle(pool.begin(), pool.end(), g);
    for (int j = 0; j < k; ++j) idx[size_t(t) * k + j] = pool[j];
  }
  std::vector<char> used(E, 0);
  for (int e : idx) used[e] = 1;
  const int routed = int(std::count(used.begin(), used.end(), 1));
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<uint16_t> x(size_t(T) * H);
  for (auto& v : x) v = mx::f32_to_bf16(u(g));

  MoeRouteParams r;
  r.topk_idx = to_dev(idx); r.topk_w = to_dev(w); r.T = T; r.k = k; r.E = E;
  r.counts = dev<int32_t>(E); r.offsets = dev<int32_t>(E + 1); r.sorted_tok = dev<int32_t>(size_t(T) * k);
  r.sorted_slot = dev<int32_t>(size_t(T) * k); r.sorted_w = dev<float>(size_t(T) * k);
  r.tile_expert = dev<int32_t>(max_tiles); r.tile_row0 = dev<int32_t>(max_tiles); r.num_tiles = dev<int32_t>(1);
  r.max_tiles = max_tiles; r.tile_rows = tile_rows;
  moe_route_prefill(r, nullptr);

  MoeGemmPrefillParams f1;
  f1.sorted_tok = r.sorted_tok; f1.sorted_slot = r.sorted_slot; f1.sorted_w = r.sorted_w; f1.offsets = r.offsets;
  f1.tile_expert = r.tile_expert; f1.tile_row0 = r.tile_row0; f1.num_tiles = r.num_tiles; f1.max_tiles = max_tiles;
  f1.tile_rows = tile_rows;
  f1.blocks = dev_random(size_t(E) * 2 * I * H / 2, 1);
  f1.scales = dev_random(size_t(E) * 2 * I * H / 32, 2, 118, 5);
  f1.bias = reinterpret_cast<uint16_t*>(dev_random(size_t(E) * 2 * I * 2, 3, 0x3c, 2));  // bf16 bytes: small, finite
  f1.x = to_dev(x); f1.N = 2 * I; f1.K = H;
  uint8_t* xq = dev<uint8_t>(size_t(T) * moe_fp8_row_bytes(H));
  float* xinv = dev<float>(T);
  moe_quant_fp8(f1.x, T, H, xq, xinv, nullptr);
  f1.xq = xq; f1.xinv = xinv;
  f1.act_q = dev<uint8_t>(size_t(T) * k * moe_fp8_row_bytes(I));
  uint8_t* smax1 = dev<uint8_t>(size_t(E) * 2 * I);
  moe_row_max_scale(f1.scales, size_t(E) * 2 * I, H / 32, smax1, nullptr);
  f1.row_smax = smax1;

  MoeGemmPrefillParams f2 = f1;
  f2.blocks = dev_random(size_t(E) * H * I / 2, 4);
  f2.scales = dev_random(size_t(E) * H * I / 32, 5, 118, 5);
  f2.bias = reinterpret_cast<uint16_t*>(dev_random(size_t(E) * H * 2, 6, 0x3c, 2));
  f2.xq = f1.act_q; f2.N = H; f2.K = I;
  f2.y_slot = dev<float>(size_t(T) * k * H);
  uint8_t* smax2 = dev<uint8_t>(size_t(E) * H);
  moe_row_max_scale(f2.scales, size_t(E) * H, I / 32, smax2, nullptr);
  f2.row_smax = smax2;
  CK(cudaDeviceSynchronize());
  int tiles = 0;
  CK(cudaMemcpy(&tiles, r.num_tiles, sizeof(int), cudaMemcpyDeviceToHost));

  // The copy bandwidth this run measures (1 GiB device to device, read + written).
  const size_t cb = size_t(1) << 30;
  uint8_t* ca = dev_random(cb, 7);
  uint8_t* cbuf = dev<uint8_t>(cb);
  const double copy_ms = time_ms([&] { CK(cudaMemcpyAsync(cbuf, ca, cb, cudaMemcpyDeviceToDevice)); }, 10);
  const double copy_gbs = 2.0 * cb / copy_ms / 1e6;

  const int iters = 20;
  const double fc1_ms = time_ms([&] { moe_fc1_fp8(f1, nullptr); }, iters);
  const double fc2_ms = time_ms([&] { moe_fc2_fp8(f2, nullptr); }, iters);
  CK(cudaDeviceSynchronize());
  // The routed experts' MXFP4 weights and scales, each read once.
  const double fc1_mb = routed * (2.0 * I * H / 2 + 2.0 * I * H / 32) / 1e6;
  const double fc2_mb = routed * (double(H) * I / 2 + double(H) * I / 32) / 1e6;
  std::printf("T %d, E %d, H %d, I %d: %d experts routed, tiles of %d rows: %d; copy %.1f GB/s\n", T, E, H, I, routed,
              tile_rows, tiles, copy_gbs);
  std::printf("| GEMM | us | MB | GB/s | %% copy |\n|---|---|---|---|---|\n");
  std::printf("| FC1 | %.1f | %.1f | %.0f | %.1f |\n", fc1_ms * 1e3, fc1_mb, fc1_mb / fc1_ms, 100 * fc1_mb / fc1_ms / copy_gbs);
  std::printf("| FC2 | %.1f | %.1f | %.0f | %.1f |\n", fc2_ms * 1e3, fc2_mb, fc2_mb / fc2_ms, 100 * fc2_mb / fc2_ms / copy_gbs);
  return 0;
}
