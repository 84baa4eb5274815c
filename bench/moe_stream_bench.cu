// The sparse FP8 MoE's weight stream without its math (issue 27): how fast 256-row CTAs of 16 warps read a
// wide decode step's experts in moe_fp8_k's order, against other layouts of the same bytes. Each lane holds
// kU segments in flight (a segment: 16 bytes of each of its two rows and their scale bytes), as the kernel.
// Patterns:
//   rows          the checkpoint layout (a row's G groups of 16 bytes, then the next row): a warp reads
//                 64 bytes of each of 16 rows 1,440 bytes apart a segment, and a scale byte a row (moe_fp8_k)
//   rows-noscale  the same without the scale bytes (the scales' cost)
//   packed        a 16-row slab's segment is 1 KB contiguous (64 bytes a row), its scales 64 contiguous bytes:
//                 what a load-time repack would give each warp
//   packed-noscale
//   rows-l2-128 / rows-l2-256   rows with `.L2::128B` / `.L2::256B` on the weight loads: a miss fetches the
//                 row's next segments too (wip/moe-sparse-l2-*)
//   chunk         each CTA reads its rows' bytes (one contiguous 368 KB at 120b FC1) 16 bytes a lane, 512
//                 bytes a warp instruction: the same bytes and CTAs in the order DRAM likes best
// GB/s count the checkpoint's bytes (weights and scales; none for *-noscale, chunk) whatever the pattern.
// Usage (GPU machine): moe_stream_bench [routed=109] [N=5760] [K=2880] [E=128]; 120b FC1 at b64 by default
// (109 of 128 experts routed a layer); 120b b128 routes ~125, 20b: E=32.
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "bench/cuda_bench_util.cuh"
#include "kernels/decode/mma_tile.cuh"

namespace {

enum Pattern { kRowsScaled, kRowsNoScale, kPackedScaled, kPackedNoScale, kChunk, kRowsL2_128, kRowsL2_256 };
const char* const kNames[] = {"rows", "rows-noscale", "packed", "packed-noscale", "chunk", "rows-l2-128", "rows-l2-256"};

using mx::cuda::mma::ldg_stream;  // <kL2>: the bytes an L2 miss fetches (0: the default sector)

struct Shape {
  int E, N, G, S;  // experts, rows, groups of 32 a row, segments (4 groups) a row
  __host__ __device__ size_t row_bytes() const { return size_t(G) * 16; }
  __host__ __device__ size_t slab_bytes() const { return size_t(S) * 1024; }  // packed: 16 rows x S segments x 64 bytes
};

// One CTA: kWarps x 16 rows of expert experts[blockIdx.x], rows from blockIdx.y x kWarps x 16.
template <int kPat, int kU, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, 16 / kWarps)
    stream_k(const uint8_t* blocks, const uint8_t* scales, const int* experts, Shape sh, uint32_t* sink) {
  const int e = experts[blockIdx.x];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  uint32_t acc = 0;
  if constexpr (kPat == kChunk) {
    const int r0 = blockIdx.y * kWarps * 16, rows = min(kWarps * 16, sh.N - r0);
    const uint8_t* base = blocks + (size_t(e) * sh.N + r0) * sh.row_bytes();
    const int n16 = int(size_t(rows) * sh.row_bytes() / 16);
    uint4 w[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) w[u] = u * kWarps * 32 + tid < n16 ? ldg_stream(base + size_t(u * kWarps * 32 + tid) * 16) : uint4{};
    for (int i0 = 0; i0 * kWarps * 32 < n16; i0 += kU) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        acc ^= w[u].x ^ w[u].y ^ w[u].z ^ w[u].w;
        const int i = (i0 + u + kU) * kWarps * 32 + tid;
        w[u] = i < n16 ? ldg_stream(base + size_t(i) * 16) : uint4{};
      }
    }
  } else {
    const int rA = min(int(blockIdx.y) * kWarps * 16 + 16 * warp + 2 * g, sh.N - 2);
    constexpr bool kPacked = kPat == kPackedScaled || kPat == kPackedNoScale;
    constexpr bool kScaled = kPat != kRowsNoScale && kPat != kPackedNoScale;
    constexpr int kL2 = kPat == kRowsL2_128 ? 128 : kPat == kRowsL2_256 ? 256 : 0;
    const uint8_t *wA, *sA;
    if constexpr (kPacked) {  // slab rA / 16, its rows 2g and 2g + 1
      const size_t slab = (size_t(e) * sh.N + rA) / 16;
      wA = blocks + slab * sh.slab_bytes() + (rA % 16) * 64 + t * 16;
      sA = scales + slab * size_t(sh.S) * 64 + (rA % 16) * 4 + t;
    } else {
      wA = blocks + (size_t(e) * sh.N + rA) * sh.row_bytes() + t * 16;
      sA = scales + (size_t(e) * sh.N + rA) * sh.G + t;
    }
    // Segment s: the weights' and scales' offsets from wA / sA for row A; row B is dB / dS further.
    const size_t wstep = kPacked ? 1024 : 64, sstep = kPacked ? 64 : 4;
    const size_t dB = kPacked ? 64 : sh.row_bytes(), dS = kPacked ? 4 : size_t(sh.G);
    uint4 wa[kU], wb[kU];
    uint32_t sa[kU], sb[kU];
    auto load = [&](int s, int u) {
      const bool in = s < sh.S && 4 * s + t < sh.G;
      wa[u] = in ? ldg_stream<kL2>(wA + s * wstep) : uint4{};
      wb[u] = in ? ldg_stream<kL2>(wA + dB + s * wstep) : uint4{};
      sa[u] = kScaled && in ? sA[s * sstep] : 0u;
      sb[u] = kScaled && in ? sA[dS + s * sstep] : 0u;
    };
#pragma unroll
    for (int u = 0; u < kU; ++u) load(u, u);
    for (int s0 = 0; s0 < sh.S; s0 += kU) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        acc ^= wa[u].x ^ wa[u].y ^ wa[u].z ^ wa[u].w ^ wb[u].x ^ wb[u].y ^ wb[u].z ^ wb[u].w ^ (sa[u] << 8) ^ sb[u];
        load(s0 + u + kU, u);
      }
    }
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;  // keeps the loads; (almost) never taken
}

template <int kPat, int kU, int kWarps>
double run_ms(const uint8_t* blocks, const uint8_t* scales, const int* experts, int routed, Shape sh, uint32_t* sink) {
  constexpr int rows = kWarps * 16;
  const dim3 grid(unsigned(routed), unsigned((sh.N + rows - 1) / rows));
  return time_ms([&] { stream_k<kPat, kU, kWarps><<<grid, kWarps * 32>>>(blocks, scales, experts, sh, sink); }, 20);
}

// As the engine's measure_d2d_bandwidth_gbps (which this C++17 file cannot include): bytes read and written.
double copy_gbps(size_t bytes) {
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  const double ms = time_ms([&] { CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 10);
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int routed = argc > 1 ? std::atoi(argv[1]) : 109;
  Shape sh{};
  sh.N = argc > 2 ? std::atoi(argv[2]) : 5760;
  const int K = argc > 3 ? std::atoi(argv[3]) : 2880;
  sh.E = argc > 4 ? std::atoi(argv[4]) : 128;
  if (routed < 1 || routed > sh.E || sh.N < 16 || sh.N % 16 || K < 32 || K % 32) {
    std::fprintf(stderr, "usage: moe_stream_bench [routed <= E] [N: a multiple of 16] [K: a multiple of 32] [E]\n");
    return 2;
  }
  sh.G = K / 32;
  sh.S = (sh.G + 3) / 4;
  // One buffer holds either layout (packed pads each row to S x 4 groups); random bytes: the loads do not care.
  const size_t wbytes = size_t(sh.E) * sh.N / 16 * sh.slab_bytes(), sbytes = size_t(sh.E) * sh.N / 16 * sh.S * 64;
  uint8_t *blocks, *scales;
  int* experts;
  uint32_t* sink;
  CK(cudaMalloc(&blocks, wbytes));
  CK(cudaMalloc(&scales, sbytes));
  CK(cudaMemset(blocks, 0x5A, wbytes));
  CK(cudaMemset(scales, 0x7F, sbytes));
  std::vector<int> ex(static_cast<size_t>(routed));
  for (int i = 0; i < routed; ++i) ex[size_t(i)] = int((size_t(i) * sh.E) / routed);  // spread over the experts
  CK(cudaMalloc(&experts, ex.size() * sizeof(int)));
  CK(cudaMemcpy(experts, ex.data(), ex.size() * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&sink, sizeof(uint32_t)));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const double copy = copy_gbps(size_t(1) << 30);
  const double weight_bytes = double(routed) * sh.N * sh.row_bytes(), scale_bytes = double(routed) * sh.N * sh.G;
  std::printf("%s, D2D copy %.0f GB/s; %d of %d experts x %d rows x K %d: %.1f MB of weights + %.1f MB of scales\n",
              prop.name, copy, routed, sh.E, sh.N, K, weight_bytes / 1e6, scale_bytes / 1e6);
  std::printf("| pattern | kU | CTA rows | us | GB/s | %% of copy |\n|---|---|---|---|---|---|\n");
  auto row = [&](int pat, int u, int warps, double ms) {
    const bool scaled = pat != kRowsNoScale && pat != kPackedNoScale && pat != kChunk;
    const double gbps = (weight_bytes + (scaled ? scale_bytes : 0)) / (ms * 1e-3) / 1e9;
    std::printf("| %s | %d | %d | %.1f | %.0f | %.1f |\n", kNames[pat], u, warps * 16, ms * 1e3, gbps, 100 * gbps / copy);
  };
  const auto* b = blocks;
  const auto* s = scales;
  row(kRowsScaled, 5, 16, run_ms<kRowsScaled, 5, 16>(b, s, experts, routed, sh, sink));
  row(kRowsNoScale, 5, 16, run_ms<kRowsNoScale, 5, 16>(b, s, experts, routed, sh, sink));
  row(kPackedScaled, 5, 16, run_ms<kPackedScaled, 5, 16>(b, s, experts, routed, sh, sink));
  row(kPackedNoScale, 5, 16, run_ms<kPackedNoScale, 5, 16>(b, s, experts, routed, sh, sink));
  row(kChunk, 5, 16, run_ms<kChunk, 5, 16>(b, s, experts, routed, sh, sink));
  row(kRowsL2_128, 5, 16, run_ms<kRowsL2_128, 5, 16>(b, s, experts, routed, sh, sink));
  row(kRowsL2_256, 5, 16, run_ms<kRowsL2_256, 5, 16>(b, s, experts, routed, sh, sink));
  row(kRowsScaled, 3, 16, run_ms<kRowsScaled, 3, 16>(b, s, experts, routed, sh, sink));
  row(kRowsScaled, 8, 16, run_ms<kRowsScaled, 8, 16>(b, s, experts, routed, sh, sink));
  row(kPackedScaled, 3, 16, run_ms<kPackedScaled, 3, 16>(b, s, experts, routed, sh, sink));
  row(kPackedScaled, 8, 16, run_ms<kPackedScaled, 8, 16>(b, s, experts, routed, sh, sink));
  row(kRowsScaled, 5, 8, run_ms<kRowsScaled, 5, 8>(b, s, experts, routed, sh, sink));
  row(kPackedScaled, 5, 8, run_ms<kPackedScaled, 5, 8>(b, s, experts, routed, sh, sink));
  row(kChunk, 8, 16, run_ms<kChunk, 8, 16>(b, s, experts, routed, sh, sink));
  CK(cudaFree(blocks));
  CK(cudaFree(scales));
  CK(cudaFree(experts));
  CK(cudaFree(sink));
  return 0;
}
