// Staging of decode activations into shared memory in the layout mma_tile.cuh reads (bf16, padded
// groups, optional quad permutation for MXFP4 weights). Every CTA stages its own copy: M <= 8 rows of
// at most 4096 values come from L2, which is cheaper than a separate kernel boundary.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "kernels/common/device_math.cuh"
#include "kernels/decode/mma_tile.cuh"

namespace mx::cuda::mma {

constexpr int kMaxDecodeTokens = 8;   // one n=8 fragment column per token
constexpr int kTopK = 4;


// 8 fp32 values -> one 16-byte staged chunk; permute: the MXFP4 order (0,4) (1,5) (2,6) (3,7).
__device__ __forceinline__ uint4 pack8(const float (&v)[8], bool permute) {
  if (permute)
    return make_uint4(pack_bf16x2(v[0], v[4]), pack_bf16x2(v[1], v[5]), pack_bf16x2(v[2], v[6]),
                      pack_bf16x2(v[3], v[7]));
  return make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]),
                    pack_bf16x2(v[6], v[7]));
}

// The residual row of token n: x[n] + sum_j y_slot[n][j] (the previous MoE's weighted expert outputs,
// summed in slot order so the result does not depend on the launch).
struct ResidualIn {
  const float* x = nullptr;       // [M, H]
  const float* y_slot = nullptr;  // [M, kTopK, H] or null
  float* x_out = nullptr;         // if set, CTA (0,0) writes the summed residual here
};

__device__ __forceinline__ void load8_residual(const ResidualIn& r, int n, int H, int k, float (&v)[8]) {
  const float4* xp = reinterpret_cast<const float4*>(r.x + size_t(n) * H + k);
  float4 a = xp[0], b = xp[1];
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  if (r.y_slot)
    for (int j = 0; j < kTopK; ++j) {
      const float4* yp = reinterpret_cast<const float4*>(r.y_slot + (size_t(n) * kTopK + j) * H + k);
      a = yp[0]; b = yp[1];
      v[0] += a.x; v[1] += a.y; v[2] += a.z; v[3] += a.w; v[4] += b.x; v[5] += b.y; v[6] += b.z; v[7] += b.w;
    }
}

// The residual values of one row after the norm's scale `in`: x_out / xn_out when asked, and xs.
__device__ __forceinline__ void put_normalized(const ResidualIn& r, const uint4& g, float in, int n, int H, int k,
                                               int ld, bool permute, uint16_t* xs, bool write_globals,
                                               uint16_t* xn_out, float (&v)[8]) {
  if (write_globals && r.x_out) {
    float4* o = reinterpret_cast<float4*>(r.x_out + size_t(n) * H + k);
    o[0] = make_float4(v[0], v[1], v[2], v[3]);
    o[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
  const uint32_t gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = bf16_lo(gw[i]) * (v[2 * i] * in);
    v[2 * i + 1] = bf16_hi(gw[i]) * (v[2 * i + 1] * in);
  }
  *reinterpret_cast<uint4*>(xs + n * ld + staged_at(k)) = pack8(v, permute);
  if (write_globals && xn_out) *reinterpret_cast<uint4*>(xn_out + size_t(n) * H + k) = pack8(v, false);
}

// xs[n] = bf16(gamma * res[n] / rms(res[n])) for n < M, all threads of the CTA sharing each row so
// the L2 reads overlap. Also writes the summed residual (x_out) and / or the normalized row (xn_out,
// bf16 natural order) when asked. Contains __syncthreads: call from every thread.
// kOneToken: one token's row is read once and kept in registers (the per-op qkv kernel; the persistent
// step's items and the router kernel, which one-token steps on sm_89+ do not launch, leave it out).
template <bool kOneToken = false>
__device__ inline void stage_rmsnorm(const ResidualIn& r, const uint16_t* gamma, float eps, int M, int H, bool permute,
                                     uint16_t* xs, bool write_globals, uint16_t* xn_out) {
  __shared__ float part[32][kMaxDecodeTokens];
  __shared__ float inv[kMaxDecodeTokens];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  const int ld = staged_ld(H), step = blockDim.x * 8;
  constexpr int kIt = 4;
  if (kOneToken && M == 1 && H <= kIt * step) {  // one token: the row stays in registers, x and y_slot read once
    float v[kIt][8];
    uint4 g[kIt];  // gamma with the row, not in a round trip of its own after the barrier
    float ss = 0.f;
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      const int k = threadIdx.x * 8 + it * step;
      if (k >= H) continue;
      g[it] = *reinterpret_cast<const uint4*>(gamma + k);
      load8_residual(r, 0, H, k, v[it]);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += v[it][i] * v[it][i];
    }
    ss = warp_sum(ss);
    if (lane == 0) part[warp][0] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
      float tot = 0.f;
      for (int w = 0; w < nwarps; ++w) tot += part[w][0];
      inv[0] = rsqrtf(tot / H + eps);
    }
    __syncthreads();
    const float in = inv[0];
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      const int k = threadIdx.x * 8 + it * step;
      if (k < H) put_normalized(r, g[it], in, 0, H, k, ld, permute, xs, write_globals, xn_out, v[it]);
    }
    return;
  }
  for (int n = 0; n < M; ++n) {
    float ss = 0.f;
#pragma unroll 4
    for (int k = threadIdx.x * 8; k < H; k += step) {
      float v[8];
      load8_residual(r, n, H, k, v);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
    }
    ss = warp_sum(ss);
    if (lane == 0) part[warp][n] = ss;
  }
  __syncthreads();
  if (threadIdx.x < M) {
    float tot = 0.f;
    for (int w = 0; w < nwarps; ++w) tot += part[w][threadIdx.x];
    inv[threadIdx.x] = rsqrtf(tot / H + eps);
  }
  __syncthreads();
  for (int n = 0; n < M; ++n) {
    const float in = inv[n];
#pragma unroll 4
    for (int k = threadIdx.x * 8; k < H; k += step) {
      float v[8];
      load8_residual(r, n, H, k, v);
      put_normalized(r, *reinterpret_cast<const uint4*>(gamma + k), in, n, H, k, ld, permute, xs, write_globals, xn_out, v);
    }
  }
}

// xs[n] = src row of token n (bf16, natural order); a null row pointer stages zeros.
template <class RowOf>
__device__ inline void stage_bf16_rows(RowOf row_of, int M, int K, bool permute, uint16_t* xs) {
  const int ld = staged_ld(K), chunks = K / 8;
#pragma unroll 4
  for (int i = threadIdx.x; i < M * chunks; i += blockDim.x) {
    const int n = i / chunks, k = (i % chunks) * 8;
    const uint16_t* src = row_of(n);
    uint4 w = src ? *reinterpret_cast<const uint4*>(src + k) : make_uint4(0, 0, 0, 0);
    if (permute) {  // bf16 pairs (0,1)(2,3)(4,5)(6,7) -> (0,4)(1,5)(2,6)(3,7), the MXFP4 order
      const uint32_t x = __byte_perm(w.x, w.z, 0x5410), y = __byte_perm(w.x, w.z, 0x7632);
      const uint32_t z = __byte_perm(w.y, w.w, 0x5410), u = __byte_perm(w.y, w.w, 0x7632);
      w = make_uint4(x, y, z, u);
    }
    *reinterpret_cast<uint4*>(xs + n * ld + staged_at(k)) = w;
  }
}

}  // namespace mx::cuda::mma
