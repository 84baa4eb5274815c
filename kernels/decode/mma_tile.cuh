// Device helpers of the decode GEMV family: one warp computes a 16-row weight tile against up to
// 8 token columns with mma.sync m16n8k16 (bf16 in, fp32 accumulate), weights as the 16-row A operand
// ("swap AB"), activations as B from shared memory.
//
// The weights are read in their checkpoint layout (row-major bf16, or MXFP4 blocks [N, K/32, 16]).
// That works because a dot product does not care in which order k is summed: each lane may pick any
// physical k for its fragment slots as long as the lanes sharing a fragment k (same thread-in-group t)
// agree, and the activations are read with the same mapping. So lane (g, t) streams 16 contiguous bytes
// of row g and of row g+8 per step:
//   bf16 : bytes [16t, 16t+16) of a 32-value segment -> 2 k-steps, values 8t + {0..7}
//   MXFP4: group t of a 128-value segment (16 bytes, one scale) -> 8 k-steps
// MXFP4 nibbles become bf16 by bit placement (sign -> bit 15, e1 e0 m -> bits 8..6) and one bf16x2
// multiply by 2^(scale-1), which is exact; the fragment pairs of an 8-value word are (0,4) (1,5) then
// (2,6) (3,7) (see group_mxfp4), so MXFP4 activations are staged in that order.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace mx::cuda::mma {

// Staged activations: bf16, group of 32 values at stride 40 (spreads the 4 lanes of a group over
// banks), row stride chosen so rows g and g+1 land 16 words apart.
constexpr int kGroupStride = 40;
__host__ __device__ inline int staged_ld(int K) {
  const int words = (K / 32) * (kGroupStride / 2);
  return 2 * (words + ((16 - words % 32) + 32) % 32);
}
__device__ __forceinline__ int staged_at(int k) { return (k >> 5) * kGroupStride + (k & 31); }

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t f32_to_bf16_bits(float f) {  // round to nearest even, NaN kept
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return f32_to_bf16_bits(lo) | (f32_to_bf16_bits(hi) << 16);
}

// Weights read once: no L1 allocation. kL2Bytes (128 or 256): an L2 miss fetches that many bytes, so a row read
// 64 bytes a segment finds its next segments in L2 (128: the sparse MoE; the decode kernels measured even with it).
template <int kL2Bytes = 0>
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  static_assert(kL2Bytes == 0 || kL2Bytes == 128 || kL2Bytes == 256, "an L2 fetch size PTX has");
  uint4 r;
  if constexpr (kL2Bytes == 256)
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  else if constexpr (kL2Bytes == 128)
    asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// The same with f16 inputs (the FP8 KV cache widens exactly to f16).
__device__ __forceinline__ void mma_16816_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two E2M1 nibble pairs (bytes at bits 0-7 and 16-23 of t) -> bf16x2 of the low nibbles / high
// nibbles, scaled by 2^-126 (the multiply below restores it together with the block scale): the sign
// goes to bit 15 and e1 e0 m to bits 8..6 of each half. The masked nibbles times (2^a + 2^b) make both
// shifted copies at once (they do not overlap, so nothing carries); one mask keeps the wanted bits.
__device__ __forceinline__ uint32_t fp4_lo(uint32_t t) {
  return ((t & 0x000F000Fu) * ((1u << 6) + (1u << 12))) & 0x81C081C0u;
}
__device__ __forceinline__ uint32_t fp4_hi(uint32_t t) {
  return ((t & 0x00F000F0u) * ((1u << 2) + (1u << 8))) & 0x81C081C0u;
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}
// E8M0 scale s -> bf16x2 of 2^(s-1). The loader rejects s > 128; s < 2 (|w| < 2^-125) is raised
// to 2, an error below 2^-121 absolute.
__device__ __forceinline__ uint32_t e8m0_mult(uint32_t s) {
  const uint32_t h = (min(max(s, 2u), 128u) + 126u) << 7;
  return h | (h << 16);
}

// Weight loads run one batch of U segments ahead of the math, and the first batch is issued before
// the CTA stages its activations, so HBM streaming starts at kernel entry.
// bf16 rows: batch = U segments of 32 values.
template <int U_>
struct Bf16PipeT {
  static constexpr int U = U_;
  uint4 wa[U], wb[U];
  const uint16_t *rowA, *rowB;
  int s1, t;
  __device__ __forceinline__ void load(int s) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (s + u < s1) {
        wa[u] = ldg_stream(rowA + (s + u) * 32 + 8 * t);
        wb[u] = ldg_stream(rowB + (s + u) * 32 + 8 * t);
      }
  }
};

template <int U>
__device__ __forceinline__ void bf16_batch_mma(const uint4 (&wa)[U], const uint4 (&wb)[U], const uint16_t* x_row, int s,
                                               int s1, int t, float (&c)[4]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (s + u >= s1) break;  // uniform across the warp
    const uint4 x = *reinterpret_cast<const uint4*>(x_row + (s + u) * kGroupStride + 8 * t);
    mma_16816(c, wa[u].x, wb[u].x, wa[u].y, wb[u].y, x.x, x.y);
    mma_16816(c, wa[u].z, wb[u].z, wa[u].w, wb[u].w, x.z, x.w);
  }
}

// c += W[rowA|rowB] . x over 32-value segments [s0, s1), with p.load(s0) already issued.
template <int U>
__device__ __forceinline__ void tile_bf16_run(Bf16PipeT<U>& p, const uint16_t* x_row, int s0, float (&c)[4]) {
  for (int s = s0; s < p.s1; s += U) {
    uint4 wa[U], wb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) { wa[u] = p.wa[u]; wb[u] = p.wb[u]; }
    if (s + U < p.s1) p.load(s + U);
    bf16_batch_mma<U>(wa, wb, x_row, s, p.s1, p.t, c);
  }
}

// One 16-byte MXFP4 group of rows A and B (already scaled multipliers ma, mb) against the group's
// activations x (32 values in the staged order, as four 16-byte words).
__device__ __forceinline__ void group_mxfp4_x(const uint4& wa, const uint4& wb, uint32_t ma, uint32_t mb,
                                              const uint4 (&x)[4], float (&c)[4]) {
  const uint32_t a[4] = {wa.x, wa.y, wa.z, wa.w}, b[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    // Word q holds values 8q..8q+7 (byte i: 8q+2i low nibble, 8q+2i+1 high). The nibbles of bytes
    // 0 and 2 (then 1 and 3, after a shift) sit 16 bits apart, so they convert in place: the pairs
    // (v0,v4) (v1,v5) feed the first k-step and (v2,v6) (v3,v7) the second; x is staged to match.
    mma_16816(c, bf16x2_mul(fp4_lo(a[q]), ma), bf16x2_mul(fp4_lo(b[q]), mb),
              bf16x2_mul(fp4_hi(a[q]), ma), bf16x2_mul(fp4_hi(b[q]), mb), x[q].x, x[q].y);
    const uint32_t ta = a[q] >> 8, tb = b[q] >> 8;
    mma_16816(c, bf16x2_mul(fp4_lo(ta), ma), bf16x2_mul(fp4_lo(tb), mb),
              bf16x2_mul(fp4_hi(ta), ma), bf16x2_mul(fp4_hi(tb), mb), x[q].z, x[q].w);
  }
}

// The same with the activations read from the staged row at xg.
__device__ __forceinline__ void group_mxfp4(const uint4& wa, const uint4& wb, uint32_t ma, uint32_t mb,
                                            const uint16_t* xg, float (&c)[4]) {
  uint4 x[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) x[q] = *reinterpret_cast<const uint4*>(xg + 8 * q);
  group_mxfp4_x(wa, wb, ma, mb, x, c);
}

// MXFP4 rows: batch = U segments of 128 values (one 16-byte group per lane and row each). kRawScale:
// ma / mb hold the E8M0 bytes (the FP8 path applies them itself, e4m3_split.cuh), else the bf16x2
// multipliers.
template <int U_, bool kRawScale = false>
struct Mxfp4PipeT {
  static constexpr int U = U_;
  uint4 wa[U], wb[U];
  uint32_t ma[U], mb[U];
  const uint8_t *blkA, *blkB, *scA, *scB;
  int s1, groups, t;
  __device__ __forceinline__ void load(int s) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int G = 4 * (s + u) + t;
      if (s + u < s1 && G < groups) {
        wa[u] = ldg_stream(blkA + G * 16);
        wb[u] = ldg_stream(blkB + G * 16);
        ma[u] = kRawScale ? uint32_t(scA[G]) : e8m0_mult(scA[G]);
        mb[u] = kRawScale ? uint32_t(scB[G]) : e8m0_mult(scB[G]);
      } else {
        wa[u] = wb[u] = make_uint4(0, 0, 0, 0);
        ma[u] = mb[u] = 0;
      }
    }
  }
};

// The MXFP4 pipe's loop over segments [s0, p.s1), p.load(s0) issued: each batch is copied out of the
// pipe, the next batch's loads are issued, then f(s, wa, wb, ma, mb) runs for each of its segments.
template <int U, bool kRawScale, class F>
__device__ __forceinline__ void for_each_segment(Mxfp4PipeT<U, kRawScale>& p, int s0, F f) {
  for (int s = s0; s < p.s1; s += U) {
    uint4 wa[U], wb[U];
    uint32_t ma[U], mb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) { wa[u] = p.wa[u]; wb[u] = p.wb[u]; ma[u] = p.ma[u]; mb[u] = p.mb[u]; }
    if (s + U < p.s1) p.load(s + U);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (s + u >= p.s1) break;  // uniform across the warp
      f(s + u, wa[u], wb[u], ma[u], mb[u]);
    }
  }
}

// c += W[rowA|rowB] . x over 128-value segments [s0, s1) (the last may be partial), p.load(s0) issued.
template <int U>
__device__ __forceinline__ void tile_mxfp4_run(Mxfp4PipeT<U>& p, const uint16_t* x_row, int s0, float (&c)[4]) {
  for_each_segment(p, s0, [&](int s, const uint4& wa, const uint4& wb, uint32_t ma, uint32_t mb) {
    // Lanes past the last group read group (groups - 1)'s x: their A is zero, x must be finite.
    const int G = min(4 * s + p.t, p.groups - 1);
    group_mxfp4(wa, wb, ma, mb, x_row + G * kGroupStride, c);
  });
}

// Sum the split-K partials of `ksplit` warps (warps w0 .. w0+ksplit-1 of this CTA) into warp w0.
// red: shared scratch of 4 * 32 * 4 floats per CTA; call from every thread of the CTA.
__device__ __forceinline__ void reduce_ksplit(float (&c)[4], float* red, int ksplit) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (ksplit > 1) {
    float* mine = red + (warp * 32 + lane) * 4;
    mine[0] = c[0]; mine[1] = c[1]; mine[2] = c[2]; mine[3] = c[3];
    __syncthreads();
    if (warp % ksplit == 0)
      for (int w = 1; w < ksplit; ++w) {
        const float* o = red + ((warp + w) * 32 + lane) * 4;
        c[0] += o[0]; c[1] += o[1]; c[2] += o[2]; c[3] += o[3];
      }
  }
}

}  // namespace mx::cuda::mma
