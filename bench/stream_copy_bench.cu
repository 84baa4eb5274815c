// How fast can one CTA per SM stream weights from HBM into shared memory? The one-token stream
// kernel (kernels/decode/decode_stream.h) needs ~23 GB/s per SM on an H100. Each SM streams its own
// contiguous share of a 2 GiB buffer through a ring of `slots` slots of `bytes` each; consumer warps
// only wait for each slot and free it. Loaders:
//   bulk   one lane issues one cp.async.bulk per slot (completes on the slot's mbarrier)
//   bulkN  one lane issues the slot as N bulk copies
//   lanes  the producer warp issues 16-byte cp.async per lane (cp.async.mbarrier.arrive.noinc)
//   ldg    no ring: every warp streams with 16-byte loads, 8 in flight per lane (the old kernels' way)
// Prints GB/s for each (loader, slot bytes, slots).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/common/bulk_ring.cuh"

using namespace mx::cuda::ring;

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e = (x);                                                                       \
    if (e != cudaSuccess) { std::printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); std::exit(1); } \
  } while (0)

constexpr int kConsumers = 8;
__shared__ unsigned long long s_full[32], s_empty[32];
extern __shared__ __align__(128) uint8_t s_ring[];

// mode 0: bulk (pieces copies per slot), 1: per-lane cp.async, 2: per-lane cp.async with an L2
// evict-first policy. busy: consumer warps spend about that many integer ops on each slot (as the
// MXFP4 math does) before freeing it.
__global__ void __launch_bounds__((kConsumers + 1) * 32, 1) ring_k(const uint8_t* src, size_t per_sm, int bytes,
                                                                   int slots, int mode, int pieces, int busy,
                                                                   unsigned* sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int i = 0; i < slots; ++i) {
      mbar_init(smem_u32(&s_full[i]), mode >= 1 ? 32 : 1);
      mbar_init(smem_u32(&s_empty[i]), 1);
    }
    mbar_init_fence();
  }
  __syncthreads();
  const uint8_t* base = src + per_sm * blockIdx.x;
  const int n = int(per_sm / bytes);
  const uint32_t ring = smem_u32(s_ring);
  if (warp == kConsumers) {
    const uint64_t pol = l2_evict_first();
    for (int k = 0; k < n; ++k) {
      const int s = k % slots, r = k / slots;
      if (mode >= 1) {
        if (r) mbar_wait(smem_u32(&s_empty[s]), (r - 1) & 1);
        const uint32_t dst = ring + s * bytes;
        if (mode == 2)
          for (int o = lane * 16; o < bytes; o += 512) cp_async16(dst + o, base + size_t(k) * bytes + o, pol);
        else
          for (int o = lane * 16; o < bytes; o += 512)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + o), "l"(base + size_t(k) * bytes + o));
        asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(&s_full[s])));
      } else if (lane == 0) {
        if (r) mbar_wait(smem_u32(&s_empty[s]), (r - 1) & 1);
        mbar_arrive_expect_tx(smem_u32(&s_full[s]), bytes);
        const int piece = bytes / pieces;
        for (int q = 0; q < pieces; ++q)
          bulk_load(ring + s * bytes + q * piece, base + size_t(k) * bytes + q * piece, piece, smem_u32(&s_full[s]),
                    pol);
      }
    }
  } else {
    unsigned acc = 0;
    for (int k = warp; k < n; k += kConsumers) {
      const int s = k % slots, r = k / slots;
      mbar_wait(smem_u32(&s_full[s]), r & 1);
      acc += lds_u8(ring + s * bytes + lane * 4);
      for (int i = 0; i < busy; ++i) acc = (acc * 0x1040u) & 0x81C081C0u ^ uint32_t(i);
      __syncwarp();
      if (lane == 0) mbar_arrive(smem_u32(&s_empty[s]));
    }
    if (acc == 0x12345678u) sink[0] = acc;
  }
#endif
}

__global__ void __launch_bounds__(256) ldg_k(const uint4* src, size_t per_sm16, unsigned* sink) {
  const uint4* base = src + per_sm16 * blockIdx.x;
  unsigned acc = 0;
  constexpr int U = 8;
  for (size_t i = threadIdx.x; i < per_sm16; i += size_t(blockDim.x) * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t j = i + size_t(u) * blockDim.x;
      v[u] = j < per_sm16 ? __ldcs(base + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].w;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

__global__ void fill_k(uint32_t* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint32_t(i * 2654435761u) ^ 0x9e3779b9u;
}

int main() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  int sms = 0, optin = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  const size_t total = size_t(2) << 30, per_sm = (total / sms) & ~size_t(65535);
  uint8_t* buf = nullptr;
  unsigned* sink = nullptr;
  CK(cudaMalloc(&buf, total));
  CK(cudaMalloc(&sink, 64));
  fill_k<<<1024, 256>>>(reinterpret_cast<uint32_t*>(buf), total / 4);
  CK(cudaFuncSetAttribute(ring_k, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - 1024));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  auto time = [&](auto launch) -> double {
    launch();
    CK(cudaDeviceSynchronize());
    float best = 1e30f;
    for (int rep = 0; rep < 5; ++rep) {
      CK(cudaEventRecord(a));
      launch();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      best = ms < best ? ms : best;
    }
    CK(cudaGetLastError());
    return double(per_sm) * sms / (best * 1e-3) / 1e9;
  };
  std::printf("SMs %d, %.2f GB streamed per run; GB/s (best of 5)\n", sms, double(per_sm) * sms / 1e9);
  std::printf("ldg (8 x 16 B in flight per lane, 8 warps): %.0f\n",
              time([&] { ldg_k<<<sms, 256>>>(reinterpret_cast<const uint4*>(buf), per_sm / 16, sink); }));
  const int sizes[] = {2048, 4096, 8192, 12288, 16384};
  const int slot_counts[] = {8, 16, 24};  // multiples of the consumer warps: a slot has one consumer
  const char* names[] = {"bulk  ", "bulk1K", "lanes ", "lanesP"};
  for (int mode = 0; mode < 4; ++mode)
    for (int bytes : sizes)
      for (int slots : slot_counts) {
        if (size_t(bytes) * slots > size_t(optin) - 2048 || slots > 32) continue;
        if (mode == 1 && bytes != 12288) continue;
        const int m = mode >= 2 ? mode - 1 : 0, pieces = mode == 1 ? bytes / 1024 : 1;
        for (int busy : {0, 2000}) {
          if (busy && bytes != 12288) continue;
          const double g = time([&] {
            ring_k<<<sms, (kConsumers + 1) * 32, size_t(bytes) * slots>>>(buf, per_sm, bytes, slots, m, pieces, busy,
                                                                         sink);
          });
          std::printf("%s bytes %5d slots %2d busy %4d: %6.0f GB/s\n", names[mode], bytes, slots, busy, g);
        }
      }
  return 0;
}
