// MXFP4 weights x one token on FP8 tensor cores (sm_89+): the one-token path of the decode MoE.
//
// Why: with one token, the bf16 mma path (mma_tile.cuh) spends ~35 ops per 8 weights on the E2M1 ->
// bf16 placement and the block-scale multiply, so FC1 is issue-bound (docs/decode-plan.md). Here:
//   - E2M1 is exact in e4m3 by bit placement (sign -> bit 7, e1 e0 m -> bits 4..2; the value times
//     2^-6): five integer ops per 8 weights, in place in the checkpoint's nibble layout (low nibbles
//     -> one register, high nibbles -> another), and one m16n8k32 mma takes 32 k.
//   - The activations are split into two e4m3 terms, x * 2^xs = hi + lo (hi = RN(x * 2^xs),
//     lo = RN(x * 2^xs - hi)), with a power-of-two scale 2^xs per 32-value group. For bf16 x the split
//     is exact for every value within 2^-9 of its group's maximum, and off by at most 2^-17 of that
//     maximum below it; the tensor cores accumulate the exact products.
//   - With one token, seven of the mma's eight B columns would be idle; instead column 2t + h holds
//     term h of group t of a 128-value segment and is zero outside that group's k slots, so
//     C[row][2t] + C[row][2t + 1] is the row's unscaled dot with group t. The E8M0 block scale and
//     2^-xs are applied to it in fp32, once per 32 weights: no per-weight scale multiply.
//
// On sm_90 ptxas lowers the e4m3 mma.sync to f16 conversions and HMMA (Hopper's native FP8 path is
// wgmma); even so the one-token FC1 is faster than on the bf16 path. wgmma (A from these registers, B
// from a zero-padded shared-memory layout) is correct but slower: each batch waits for its group to
// retire (docs/perf.md).
//
// Fragment mapping (m16n8k32, 8-bit A row-major / B col-major): lane (g, t) loads the 16-byte group
// t of a 128-value segment for rows g and g + 8. Its A registers for step q (word q of the group,
// values 8q..8q+7) are the word's low nibbles (values 8q + {0,2,4,6}) at k 4t..4t+3 and its high
// nibbles (8q + {1,3,5,7}) at k 4t+16..4t+19. B's nonzero registers live in lanes (2t + h, t): the
// same values of group t's term h. C: lane (g, t) holds rows g, g + 8 x columns 2t, 2t + 1.
#pragma once
#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/decode/mma_tile.cuh"

namespace mx::cuda::e4m3 {

// Staged activations in shared memory: per 128-value segment 256 bytes, [half q/2][column 2t + h]
// [q%2][two registers]; then one signed byte per group (xs); then 16 zero bytes, which the lanes
// with no B values read.
constexpr int kSegBytes = 256;
__host__ __device__ inline int stage_segs(int K) { return (K / 32 + 3) / 4; }
__host__ __device__ inline int stage_xs_off(int K) { return stage_segs(K) * kSegBytes; }
__host__ __device__ inline int stage_zero_off(int K) { return (stage_xs_off(K) + K / 32 + 15) & ~15; }
__host__ __device__ inline int stage_bytes(int K) { return stage_zero_off(K) + 16; }

// 8 E2M1 values (a 32-bit word of the checkpoint) -> e4m3 of the low nibbles (lo) and high nibbles
// (hi), each value times 2^-6, byte i of each register from byte i of w.
__device__ __forceinline__ void e2m1x8_to_e4m3(uint32_t w, uint32_t& lo, uint32_t& hi) {
  hi = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
  lo = ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);
}

__device__ __forceinline__ void mma_16832(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// Two fp32 -> e4m3x2 (round to nearest even, saturating; byte 0 = lo), and back (exact).
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  uint32_t d = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t h;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(hi), "f"(lo));
  d = h;
#endif
  return d;
}
__device__ __forceinline__ float2 e4m3x2_to_f32(uint32_t v) {
  float2 r = make_float2(0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(uint16_t(v)));
  r = __half22float2(*reinterpret_cast<const __half2*>(&h2));
#endif
  return r;
}

// (hi, lo) e4m3 terms of the value pairs (a0, a1) and (b0, b1), packed as registers (a0 a1 b0 b1).
__device__ __forceinline__ void split4(float a0, float a1, float b0, float b1, uint32_t& hi, uint32_t& lo) {
  const uint32_t ha = e4m3x2(a0, a1), hb = e4m3x2(b0, b1);
  const float2 fa = e4m3x2_to_f32(ha), fb = e4m3x2_to_f32(hb);
  hi = ha | (hb << 16);
  lo = e4m3x2(a0 - fa.x, a1 - fa.y) | (e4m3x2(b0 - fb.x, b1 - fb.y) << 16);
}

// Sources of stage_split: load(k) fetches what the 8 values at k need, convert() makes them floats
// (split so that the stager can issue every load before it uses any). The 8 bf16 values of a bf16 row ...
struct Bf16Src {
  const uint16_t* src;  // 16-byte aligned
  using Raw = uint4;
  __device__ __forceinline__ Raw load(int k) const { return __ldcg(reinterpret_cast<const uint4*>(src + k)); }
  __device__ __forceinline__ void convert(const Raw& w, float (&v)[8]) const {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[2 * j] = mma::bf16_lo(ws[j]);
      v[2 * j + 1] = mma::bf16_hi(ws[j]);
    }
  }
};
// ... or bf16(gamma * (h * inv)) of an fp32 row h: the RMSNorm the router kernel would have staged
// (stage.cuh stage_rmsnorm), rounded to bf16 the same way.
struct NormSrc {
  const float* h;         // 16-byte aligned
  const uint16_t* gamma;  // 16-byte aligned
  float inv;
  struct Raw {
    float4 a, b;
    uint4 g;
  };
  __device__ __forceinline__ Raw load(int k) const {
    return {__ldcg(reinterpret_cast<const float4*>(h + k)), __ldcg(reinterpret_cast<const float4*>(h + k + 4)),
            *reinterpret_cast<const uint4*>(gamma + k)};
  }
  __device__ __forceinline__ void convert(const Raw& r, float (&v)[8]) const {
    const float x[8] = {r.a.x, r.a.y, r.a.z, r.a.w, r.b.x, r.b.y, r.b.z, r.b.w};
    const uint32_t gw[4] = {r.g.x, r.g.y, r.g.z, r.g.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t r = mma::pack_bf16x2(mma::bf16_lo(gw[j]) * (x[2 * j] * inv), mma::bf16_hi(gw[j]) * (x[2 * j + 1] * inv));
      v[2 * j] = mma::bf16_lo(r);
      v[2 * j + 1] = mma::bf16_hi(r);
    }
  }
};

// One stager item: the 8 values v of word q of group G (zeros past the last group) -> their (hi, lo)
// e4m3 terms at dst, and the group's scale byte. Every lane of the warp must call it (shuffles).
__device__ __forceinline__ void stage_split_item(float (&v)[8], int G, int q, bool store, int K, uint8_t* dst) {
  float m = 0.f;
#pragma unroll
  for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(v[k]));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
  // m in [2^e, 2^(e+1)) -> m * 2^xs in [128, 256): below e4m3's 448. Clamped so 2^xs is a normal
  // float; NaN / Inf inputs saturate.
  const int e = int((__float_as_uint(m) >> 23) & 0xff) - 127;
  const int xs = m > 0.f ? min(max(7 - e, -100), 100) : 0;
  const float f = __uint_as_float(uint32_t(xs + 127) << 23);
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] *= f;
  if (!store) return;
  uint32_t he, le, ho, lo;
  split4(v[0], v[2], v[4], v[6], he, le);  // even values: the low nibbles' k slots
  split4(v[1], v[3], v[5], v[7], ho, lo);
  uint8_t* at = dst + (G >> 2) * kSegBytes + (q >> 1) * 128 + (G & 3) * 32 + (q & 1) * 8;
  *reinterpret_cast<uint2*>(at) = make_uint2(he, ho);
  *reinterpret_cast<uint2*>(at + 16) = make_uint2(le, lo);
  if (q == 0 && G < K / 32) reinterpret_cast<int8_t*>(dst + stage_xs_off(K))[G] = int8_t(xs);
}

// Stages K values (K % 32 == 0) from src at `dst` in shared memory. One thread per (group, word):
// the four threads of a group are adjacent lanes and share the group's maximum. A thread's items are
// taken three at a time with all their loads issued first (K = 2880 is three items a thread at 128
// threads): FC2 stages after its wait, on the layer's critical path, where a dependent L2 round trip
// per item shows (docs/perf.md). Contains no barrier: __syncthreads before reading.
constexpr int kStageBatch = 3;

// The loads of one batch of a thread's stager items (items b0 + u * blockDim.x + threadIdx.x).
template <class Src>
__device__ __forceinline__ void stage_split_load(const Src& src, int K, int b0, typename Src::Raw (&raw)[kStageBatch]) {
  const int groups = K / 32;
#pragma unroll
  for (int u = 0; u < kStageBatch; ++u) {
    const int i = b0 + u * blockDim.x + threadIdx.x, G = i >> 2, q = i & 3;
    if (G < groups) raw[u] = src.load(G * 32 + q * 8);
  }
}

// Converts and stores them.
template <class Src>
__device__ __forceinline__ void stage_split_store(const Src& src, int K, int b0, const typename Src::Raw (&raw)[kStageBatch],
                                                  uint8_t* dst) {
  const int groups = K / 32, n = stage_segs(K) * 16;
#pragma unroll
  for (int u = 0; u < kStageBatch; ++u) {
    const int i0 = b0 + u * blockDim.x;
    if (i0 >= n) break;  // uniform: whole warps, the shuffles below need every lane
    const int i = i0 + threadIdx.x, G = i >> 2, q = i & 3;
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (G < groups) src.convert(raw[u], v);
    stage_split_item(v, G, q, i < n, K, dst);
  }
}

// The staging after its first batch's loads (stage_split_load at b0 = 0, issued by the caller, e.g.
// before other work that does not need them).
template <class Src>
__device__ inline void stage_split_rest(const Src& src, int K, const typename Src::Raw (&first)[kStageBatch], uint8_t* dst) {
  const int n = stage_segs(K) * 16;
  stage_split_store(src, K, 0, first, dst);
  for (int b0 = kStageBatch * blockDim.x; b0 < n; b0 += kStageBatch * blockDim.x) {
    typename Src::Raw raw[kStageBatch];
    stage_split_load(src, K, b0, raw);
    stage_split_store(src, K, b0, raw, dst);
  }
  if (threadIdx.x < 4) reinterpret_cast<uint32_t*>(dst + stage_zero_off(K))[threadIdx.x] = 0u;
}

template <class Src>
__device__ inline void stage_split_from(Src src, int K, uint8_t* dst) {
  typename Src::Raw raw[kStageBatch];
  stage_split_load(src, K, 0, raw);
  stage_split_rest(src, K, raw, dst);
}

__device__ inline void stage_split(const uint16_t* src, int K, uint8_t* dst) { stage_split_from(Bf16Src{src}, K, dst); }

// Weight loads of one warp's two rows (mma_tile.cuh's pipe, with the raw E8M0 scale bytes).
template <int U>
using Pipe = mma::Mxfp4PipeT<U, true>;

// 2^(s - 127) * 2^6 (the e4m3 placement) * 2^-xs as float bits; zero where it underflows.
__device__ __forceinline__ float block_factor(uint32_t scale, int xs) {
  return __uint_as_float(uint32_t(max(int(scale) + 6 - xs, 0)) << 23);
}

// (row A, row B) . x over segments [s0, p.s1), x staged at xst by stage_split. Every lane returns
// the full dots.
template <int U>
__device__ __forceinline__ float2 tile_run(Pipe<U>& p, const uint8_t* xst, int K, int s0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const bool has_b = (g >> 1) == t;  // lanes (2t + h, t) hold B values
  const uint8_t* xb = has_b ? xst + g * 16 : xst + stage_zero_off(K);
  const int xstride = has_b ? kSegBytes : 0, xhalf = has_b ? 128 : 0;
  const int8_t* xsg = reinterpret_cast<const int8_t*>(xst + stage_xs_off(K));
  float2 acc = make_float2(0.f, 0.f);
  mma::for_each_segment(p, s0, [&](int s, const uint4& wa, const uint4& wb, uint32_t sa, uint32_t sb) {
    const uint8_t* xq = xb + s * xstride;
    const uint4 x01 = *reinterpret_cast<const uint4*>(xq), x23 = *reinterpret_cast<const uint4*>(xq + xhalf);
    const int xs = xsg[min(4 * s + t, p.groups - 1)];
    const uint32_t a[4] = {wa.x, wa.y, wa.z, wa.w}, b[4] = {wb.x, wb.y, wb.z, wb.w};
    const uint32_t bx[8] = {x01.x, x01.y, x01.z, x01.w, x23.x, x23.y, x23.z, x23.w};
    float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t alo, ahi, blo, bhi;
      e2m1x8_to_e4m3(a[q], alo, ahi);
      e2m1x8_to_e4m3(b[q], blo, bhi);
      mma_16832(c, alo, blo, ahi, bhi, bx[2 * q], bx[2 * q + 1]);
    }
    acc.x = fmaf(c[0] + c[1], block_factor(sa, xs), acc.x);
    acc.y = fmaf(c[2] + c[3], block_factor(sb, xs), acc.y);
  });
  // Lane t summed the groups t, t + 4, ...: add the four.
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    acc.x += __shfl_xor_sync(0xffffffffu, acc.x, o);
    acc.y += __shfl_xor_sync(0xffffffffu, acc.y, o);
  }
  return acc;
}

}  // namespace mx::cuda::e4m3
