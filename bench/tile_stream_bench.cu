// How fast can the one-token MoE kernels' warps stream their weight tiles? (docs/perf.md, session 12)
// FC1 of 120b reads 4 experts x 2 x 2880 rows x 1440 bytes of MXFP4 blocks (+ 1/16 scales) with 360
// CTAs of 4 warps; each warp owns a 16-row tile (23 KB). This bench reads the same bytes with the same
// grid and no math, to see what the access pattern alone costs:
//   rows   : the checkpoint layout; lane (g, t) reads 16 bytes at 64 s + 16 t of rows g and g + 8 per
//            128-value segment s (the mma fragment mapping), and a scale byte of each
//   packed : the tile repacked so that segment s of its 16 rows is one contiguous 1 KB (rows 0-7 then
//            8-15, 64 bytes each) and its 32 scale bytes follow: one warp load covers 512 bytes
// with U segments in flight per warp (registers). Every launch reads a different copy of the bytes so
// the 50 MB L2 does not hold them. Prints GB/s, mean of the reps.
#include <cstdint>
#include <cstdio>

#include <cuda_runtime.h>

#include "kernels/decode/mma_tile.cuh"

#define CK(x)                                                                    \
  do {                                                                           \
    cudaError_t e = (x);                                                         \
    if (e != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

namespace {

constexpr int kRowBytes = 1440, kGroups = 90, kSegs = 23, kTiles = 1440;
constexpr size_t kBlockBytes = size_t(kTiles) * 16 * kRowBytes;
constexpr size_t kScaleBytes = size_t(kTiles) * 16 * kGroups;
constexpr size_t kPackedScaleBytes = size_t(kTiles) * kSegs * 64;

using mx::cuda::mma::ldg_stream;

template <int U, bool kPacked, bool kScales>
__global__ void __launch_bounds__(128, 3) tile_k(const uint8_t* blocks, const uint8_t* scales, uint32_t* out) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = (blockIdx.y * gridDim.x + blockIdx.x) * 4 + warp;
  const uint8_t *a, *b, *sa, *sb;
  int seg_stride, sc_stride;
  if (kPacked) {
    a = blocks + size_t(tile) * kSegs * 1024 + g * 64 + t * 16;
    b = a + 512;
    sa = scales + size_t(tile) * kSegs * 64 + g * 4 + t;
    sb = sa + 32;
    seg_stride = 1024;
    sc_stride = 64;
  } else {
    a = blocks + (size_t(tile) * 16 + g) * kRowBytes + t * 16;
    b = a + 8 * kRowBytes;
    sa = scales + (size_t(tile) * 16 + g) * kGroups + t;
    sb = sa + 8 * kGroups;
    seg_stride = 64;
    sc_stride = 4;
  }
  uint32_t acc = 0;
  uint4 wa[U], wb[U];
  uint32_t ma[U], mb[U];
  auto load = [&](int s) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool v = s + u < kSegs && (kPacked || 4 * (s + u) + t < kGroups);
      wa[u] = v ? ldg_stream(a + (s + u) * seg_stride) : make_uint4(0, 0, 0, 0);
      wb[u] = v ? ldg_stream(b + (s + u) * seg_stride) : make_uint4(0, 0, 0, 0);
      ma[u] = v && kScales ? sa[(s + u) * sc_stride] : 0;
      mb[u] = v && kScales ? sb[(s + u) * sc_stride] : 0;
    }
  };
  load(0);
  for (int s = 0; s < kSegs; s += U) {
    uint4 ca[U], cb[U];
    uint32_t xa[U], xb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) { ca[u] = wa[u]; cb[u] = wb[u]; xa[u] = ma[u]; xb[u] = mb[u]; }
    if (s + U < kSegs) load(s + U);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= ca[u].x ^ ca[u].y ^ ca[u].z ^ ca[u].w ^ cb[u].x ^ cb[u].y ^ cb[u].z ^ cb[u].w ^ xa[u] ^ (xb[u] << 8);
  }
  if (acc == 0x12345678u) out[tile * 32 + lane] = acc;  // keeps the loads
}

__global__ void empty_k(uint32_t* out) {
  if (threadIdx.x == 1000) out[0] = 0;
}

template <int U, bool kPacked, bool kScales>
int run(const char* name, uint8_t* blocks, uint8_t* scales, int copies, uint32_t* out) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const size_t sc_bytes = kPacked ? kPackedScaleBytes : kScaleBytes;
  const int reps = 200;
  for (int w = 0; w < 2; ++w) {
    CK(cudaEventRecord(e0));
    for (int r = 0; r < reps; ++r) {
      const int c = r % copies;
      tile_k<U, kPacked, kScales><<<dim3(90, 4), 128>>>(blocks + c * kBlockBytes, scales + c * sc_bytes, out);
    }
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
  }
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  const double us = ms * 1e3 / reps, bytes = double(kBlockBytes) + (kScales ? double(sc_bytes) : 0.0);
  std::printf("%-34s U=%d  %7.2f us per launch  %7.1f GB/s\n", name, U, us, bytes / us / 1e3);
  return 0;
}

}  // namespace

int main() {
  const int copies = 10;  // 10 x 35 MB: each launch misses L2
  uint8_t *blocks, *scales;
  uint32_t* out;
  CK(cudaMalloc(&blocks, copies * kBlockBytes));
  CK(cudaMalloc(&scales, copies * kPackedScaleBytes));
  CK(cudaMalloc(&out, kTiles * 32 * 4));
  CK(cudaMemset(blocks, 0x5a, copies * kBlockBytes));
  CK(cudaMemset(scales, 0x7f, copies * kPackedScaleBytes));
  int rc = 0;
  {  // the launch gaps alone: the same grid reading nothing
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0));
    for (int r = 0; r < 200; ++r) empty_k<<<dim3(90, 4), 128>>>(out);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    std::printf("empty launches: %.2f us each\n", ms * 1e3 / 200);
  }
  rc |= run<4, false, true>("rows + scale bytes (as today)", blocks, scales, copies, out);
  rc |= run<4, false, false>("rows, no scales", blocks, scales, copies, out);
  rc |= run<4, true, true>("packed + packed scales", blocks, scales, copies, out);
  rc |= run<4, true, false>("packed, no scales", blocks, scales, copies, out);
  rc |= run<8, false, true>("rows + scale bytes", blocks, scales, copies, out);
  rc |= run<8, true, true>("packed + packed scales", blocks, scales, copies, out);
  rc |= run<2, true, true>("packed + packed scales", blocks, scales, copies, out);
  return rc;
}
