// One warp's 16-row tile of a dense weight (dense_weight.h) in any of its formats, behind one
// interface, so the dense decode bodies (gemv_body.cuh) are written once and instantiated per format:
//   DensePipe<F, U>::init(w, rA, rB, K, kp, ksplit, ...)  rows rA / rB (fragment rows g / g + 8), this
//                                                        warp's share of K; the first batch is issued
//   run(x_row, c)     c += W[rA|rB] . x over that share (x staged by stage.cuh, kPermute order)
//   scale(c)          the per-row factor the fragments left out (FP8's row scale), after the K reduction
// A segment is what the four lanes of a fragment row read in one step (16 bytes each): 32 bf16 values,
// 128 MXFP4 values (mma_tile.cuh) or 64 FP8 values.
#pragma once
#include "kernels/common/dense_weight.h"
#include "kernels/decode/mma_tile.cuh"

namespace mx::cuda::mma {

// Segments [seg_lo, seg_hi) split over the ksplit warps of a tile: warp kp's share.
__device__ __forceinline__ void segment_share(int seg_lo, int seg_hi, int kp, int ksplit, int& s0, int& s1) {
  s0 = seg_lo + (seg_hi - seg_lo) * kp / ksplit;
  s1 = seg_lo + (seg_hi - seg_lo) * (kp + 1) / ksplit;
}

template <DenseFormat F, int U>
struct DensePipe;

template <int U>
struct DensePipe<DenseFormat::kBf16, U> {
  static constexpr bool kPermute = false;
  static constexpr int kSegValues = 32;
  Bf16PipeT<U> pipe;
  int s0;
  // seg_hi < 0: to the end of the row.
  __device__ __forceinline__ void init(const DenseWeight& w, int rA, int rB, int K, int kp, int ksplit, int seg_lo = 0,
                                       int seg_hi = -1) {
    const int t = threadIdx.x & 3;
    int s1;
    segment_share(seg_lo, seg_hi < 0 ? K / 32 : seg_hi, kp, ksplit, s0, s1);
    pipe = Bf16PipeT<U>{{}, {}, w.bf16() + size_t(rA) * K, w.bf16() + size_t(rB) * K, s1, t};
    pipe.load(s0);
  }
  __device__ __forceinline__ void run(const uint16_t* x_row, float (&c)[4]) { tile_bf16_run(pipe, x_row, s0, c); }
  __device__ __forceinline__ void scale(float (&)[4]) const {}
};

template <int U>
struct DensePipe<DenseFormat::kMxfp4, U> {
  static constexpr bool kPermute = true;
  static constexpr int kSegValues = 128;
  Mxfp4PipeT<U> pipe;
  int s0;
  __device__ __forceinline__ void init(const DenseWeight& w, int rA, int rB, int K, int kp, int ksplit) {
    const int t = threadIdx.x & 3, groups = K / 32;
    int s1;
    segment_share(0, (groups + 3) / 4, kp, ksplit, s0, s1);
    pipe = Mxfp4PipeT<U>{{}, {}, {}, {}, w.bytes() + size_t(rA) * (K / 2), w.bytes() + size_t(rB) * (K / 2),
                         w.mx_scales() + size_t(rA) * groups, w.mx_scales() + size_t(rB) * groups, s1, groups, t};
    pipe.load(s0);
  }
  __device__ __forceinline__ void run(const uint16_t* x_row, float (&c)[4]) { tile_mxfp4_run(pipe, x_row, s0, c); }
  __device__ __forceinline__ void scale(float (&)[4]) const {}
};

// Two E4M3 bytes at bits 0-7 and 16-23 of t -> bf16x2 times 2^-120 (sign to bit 15, exponent and
// mantissa to bits 4..10 of each half); the multiply by 2^120 makes it exact, subnormals included.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t t) {
  const uint32_t v = ((t << 4) & 0x07F007F0u) | ((t << 8) & 0x80008000u);
  return bf16x2_mul(v, 0x7B807B80u);  // 2^120 in each half
}

// E4M3 rows: lane t reads 16 values (16 bytes) of row rA and of row rB per segment of 64.
template <int U>
struct DensePipe<DenseFormat::kFp8, U> {
  static constexpr bool kPermute = false;
  static constexpr int kSegValues = 64;
  uint4 wa[U], wb[U];
  const uint8_t *rowA, *rowB;
  float scA, scB;
  int s0, s1, chunks, t;
  __device__ __forceinline__ void load(int s) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int ch = 4 * (s + u) + t;  // 16-value chunk
      if (s + u < s1 && ch < chunks) {
        wa[u] = ldg_stream(rowA + ch * 16);
        wb[u] = ldg_stream(rowB + ch * 16);
      } else {
        wa[u] = wb[u] = make_uint4(0, 0, 0, 0);
      }
    }
  }
  __device__ __forceinline__ void init(const DenseWeight& w, int rA, int rB, int K, int kp, int ksplit) {
    t = threadIdx.x & 3;
    chunks = K / 16;
    segment_share(0, (chunks + 3) / 4, kp, ksplit, s0, s1);
    rowA = w.bytes() + size_t(rA) * K;
    rowB = w.bytes() + size_t(rB) * K;
    load(s0);
    scA = w.row_scale()[rA];
    scB = w.row_scale()[rB];
  }
  __device__ __forceinline__ void run(const uint16_t* x_row, float (&c)[4]) {
    for (int s = s0; s < s1; s += U) {
      uint4 a[U], b[U];
#pragma unroll
      for (int u = 0; u < U; ++u) { a[u] = wa[u]; b[u] = wb[u]; }
      if (s + U < s1) load(s + U);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (s + u >= s1) break;  // uniform across the warp
        // Lanes past the last chunk read the last chunk's x: their weights are zero, x must be finite.
        const int ch = min(4 * (s + u) + t, chunks - 1);
        const uint16_t* xg = x_row + (ch >> 1) * kGroupStride + 16 * (ch & 1);
        const uint4 x0 = *reinterpret_cast<const uint4*>(xg), x1 = *reinterpret_cast<const uint4*>(xg + 8);
        const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        const uint32_t wa4[4] = {a[u].x, a[u].y, a[u].z, a[u].w}, wb4[4] = {b[u].x, b[u].y, b[u].z, b[u].w};
#pragma unroll
        for (int q = 0; q < 4; ++q)  // word q: values 4q .. 4q+3 as the pairs (0,1) and (2,3)
          mma_16816(c, e4m3x2_to_bf16x2(__byte_perm(wa4[q], 0, 0x4140)), e4m3x2_to_bf16x2(__byte_perm(wb4[q], 0, 0x4140)),
                    e4m3x2_to_bf16x2(__byte_perm(wa4[q], 0, 0x4342)), e4m3x2_to_bf16x2(__byte_perm(wb4[q], 0, 0x4342)),
                    xw[2 * q], xw[2 * q + 1]);
      }
    }
  }
  __device__ __forceinline__ void scale(float (&c)[4]) const {
    c[0] *= scA; c[1] *= scA; c[2] *= scB; c[3] *= scB;
  }
};

}  // namespace mx::cuda::mma
