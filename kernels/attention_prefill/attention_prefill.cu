// Flash-attention prefill (FA2 style, mma.sync m16n8k16 bf16, fp32 accumulate).
//
// A CTA takes 16 consecutive queries and the G query heads of one KV head, one warp per head, so a
// K/V tile is read from the cache once for all G heads (GQA) and every warp has the same causal
// extent (uniform loops, no divergence). Per 64-key tile a warp computes S = Q K^T (16 x 64) in
// registers, runs the online softmax on them (scores in log2 units, the sink as the initial max with
// weight 1), reuses S's accumulator layout directly as the A operand of P V, and rescales O in
// registers. K/V tiles are double-buffered with cp.async; rows come through the block table. Keys
// below the first query's window and past the last query are zero-filled, not loaded: with sliding
// layers those blocks may already belong to someone else, and a masked P of 0 times a non-finite V
// would still poison the sum.
//
// FP8 cache (kv_cache.h): a thread loads its pieces of the next tile into registers before the
// current tile's math and widens them to f16 (exact, one conversion a pair) into the other buffer
// after it; the mma then run on f16, with q (bf16, exact in f16 within its range) and P as f16.
#include "kernels/attention_prefill/attention_prefill.h"

#include <stdexcept>
#include <string>

#include "kernels/common/async_copy.cuh"
#include "kernels/common/device_math.cuh"
#include "kernels/common/kv_fp8.cuh"
#include "kernels/decode/mma_tile.cuh"

namespace mx::cuda {
namespace {

constexpr int D = 64, BQ = 16, BK = 64, LDS = D + 8;  // smem row stride 144 B: ldmatrix without bank conflicts
constexpr int kMaxG = 8;
constexpr float kLog2e = 1.4426950408889634f;

// Round to nearest even without mma::f32_to_bf16_bits's NaN test: every value here is finite, and
// the test is costly in the softmax loop (docs/perf.md).
__device__ __forceinline__ uint32_t bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) { return bf16_bits(lo) | (bf16_bits(hi) << 16); }
__device__ __forceinline__ float bf16_round(float f) { return __uint_as_float(bf16_bits(f) << 16); }

// The mma's input type: bf16, or f16 with the FP8 cache.
template <bool kF16>
__device__ __forceinline__ void mma_in(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
  if constexpr (kF16) mma::mma_16816_f16(c, a0, a1, a2, a3, b0, b1);
  else mma::mma_16816(c, a0, a1, a2, a3, b0, b1);
}
template <bool kF16>
__device__ __forceinline__ float round_in(float f) {
  if constexpr (kF16) return __half2float(__float2half_rn(f));
  else return bf16_round(f);
}
template <bool kF16>
__device__ __forceinline__ uint32_t pack_in(float lo, float hi) {
  if constexpr (kF16) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    return pack_bf16(lo, hi);
  }
}

// Grid: (query tiles, Hkv), heaviest (latest) query tiles first. Block: 32 * G threads. FP8: held to
// two CTAs an SM (128 registers), as the bf16 kernel's 121 give; unbounded it takes 130 and gets one.
template <bool kFp8>
__global__ void __launch_bounds__(32 * kMaxG, kFp8 ? 2 : 0) attn_prefill_kernel(AttnPrefillParams p) {
  __shared__ __align__(128) uint16_t ks[2][BK * LDS];
  __shared__ __align__(128) uint16_t vs[2][BK * LDS];
  const int G = p.Hq / p.Hkv, kvh = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int h = kvh * G + warp;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;
  const int pmin = p.start + q0, pmax = p.start + min(q0 + BQ, p.T) - 1;
  const int klo = p.window > 0 ? max(0, pmin - p.window + 1) : 0;  // keys below: zero-filled
  const int kbeg = klo / BK * BK;
  const int ntiles = (pmax - kbeg) / BK + 1;
  const int nthreads = 32 * G, bs = p.kv.block_size;

  // Element offset of piece i (8 values) of a tile's K / V rows; false for keys not to load.
  auto piece = [&](int k0, int i, size_t& off) {
    const int r = i >> 3, c = (i & 7) * 8, j = k0 + r;
    const bool valid = j >= klo && j <= pmax;
    off = valid ? (size_t(size_t(p.block_table[j / bs]) * bs + j % bs) * p.Hkv + kvh) * D + c : 0;
    return valid;
  };
  auto load_tile = [&](int tile, int buf) {
    const int k0 = kbeg + tile * BK;
    for (int i = threadIdx.x; i < BK * (D / 8); i += nthreads) {
      const int r = i >> 3, c = (i & 7) * 8;
      size_t off;
      const bool valid = piece(k0, i, off);
      cp_async16(&ks[buf][r * LDS + c], p.kv.k_bf16() + off, valid);
      cp_async16(&vs[buf][r * LDS + c], p.kv.v_bf16() + off, valid);
    }
    cp_async_commit();
  };
  // FP8: round `round` of a thread's pieces (kStage of K and of V) into registers, then widened into smem.
  constexpr int kStage = 2, kPieces = BK * (D / 8);  // 2: one round with 8 warps (gpt-oss)
  const int rounds = (kPieces + nthreads * kStage - 1) / (nthreads * kStage);
  uint2 kr[kStage], vr[kStage];
  auto fetch8 = [&](int tile, int round) {
    const int k0 = kbeg + tile * BK;
#pragma unroll
    for (int u = 0; u < kStage; ++u) {
      const int i = threadIdx.x + (round * kStage + u) * nthreads;
      size_t off;
      const bool valid = i < kPieces && piece(k0, i, off);
      kr[u] = valid ? *reinterpret_cast<const uint2*>(p.kv.k_fp8() + off) : make_uint2(0, 0);
      vr[u] = valid ? *reinterpret_cast<const uint2*>(p.kv.v_fp8() + off) : make_uint2(0, 0);
    }
  };
  auto widen = [](uint2 x) {
    return make_uint4(e4m3x2_to_f16x2(x.x), e4m3x2_to_f16x2(x.x >> 16), e4m3x2_to_f16x2(x.y),
                      e4m3x2_to_f16x2(x.y >> 16));
  };
  auto put8 = [&](int buf, int round) {
#pragma unroll
    for (int u = 0; u < kStage; ++u) {
      const int i = threadIdx.x + (round * kStage + u) * nthreads;
      if (i >= kPieces) break;
      const int r = i >> 3, c = (i & 7) * 8;
      *reinterpret_cast<uint4*>(&ks[buf][r * LDS + c]) = widen(kr[u]);
      *reinterpret_cast<uint4*>(&vs[buf][r * LDS + c]) = widen(vr[u]);
    }
  };
  auto fill8 = [&](int tile, int buf, int first_round) {  // the rest of a tile, round by round
    for (int round = first_round; round < rounds; ++round) {
      fetch8(tile, round);
      put8(buf, round);
    }
  };
  if constexpr (kFp8) fill8(0, 0, 0);
  else load_tile(0, 0);

  // Q fragments of this warp's 16 queries x 64 dims (A operand, 4 k-steps), straight from global.
  uint32_t qa[4][4];
  {
    const int ra = q0 + g, rb = q0 + g + 8;
    const uint16_t* qp = p.q + size_t(h) * D + 2 * t;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int d0 = kk * 16;
      qa[kk][0] = ra < p.T ? *reinterpret_cast<const uint32_t*>(qp + size_t(ra) * p.q_stride + d0) : 0u;
      qa[kk][1] = rb < p.T ? *reinterpret_cast<const uint32_t*>(qp + size_t(rb) * p.q_stride + d0) : 0u;
      qa[kk][2] = ra < p.T ? *reinterpret_cast<const uint32_t*>(qp + size_t(ra) * p.q_stride + d0 + 8) : 0u;
      qa[kk][3] = rb < p.T ? *reinterpret_cast<const uint32_t*>(qp + size_t(rb) * p.q_stride + d0 + 8) : 0u;
    }
    if constexpr (kFp8)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          qa[kk][i] = pack_in<true>(__uint_as_float(qa[kk][i] << 16), __uint_as_float(qa[kk][i] & 0xffff0000u));
  }
  const float sc = p.scale * kLog2e;
  const float sink = bf(p.sinks[h]) * kLog2e;
  float m[2] = {sink, sink}, l[2] = {1.f, 1.f};  // rows g and g + 8; the sink's weight is exp2(0)
  float o[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  const int pos[2] = {p.start + q0 + g, p.start + q0 + g + 8};
  const bool live[2] = {q0 + g < p.T, q0 + g + 8 < p.T};

  for (int tile = 0; tile < ntiles; ++tile) {
    const int buf = tile & 1;
    if constexpr (kFp8) {
      if (tile + 1 < ntiles) fetch8(tile + 1, 0);  // in flight during this tile's math
    } else if (tile + 1 < ntiles) {
      load_tile(tile + 1, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int k0 = kbeg + tile * BK;
    // S = Q K^T: 8 n-tiles of 8 keys; ldmatrix x4 gives b0/b1 of two n-tiles per k-step.
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        const int mi = lane >> 3, r = lane & 7;
        const int key = jp * 16 + r + (mi >> 1) * 8, d = kk * 16 + (mi & 1) * 8;
        uint32_t b[4];
        ldmatrix_x4(b[0], b[1], b[2], b[3], &ks[buf][key * LDS + d]);
        mma_in<kFp8>(s[2 * jp], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b[0], b[1]);
        mma_in<kFp8>(s[2 * jp + 1], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b[2], b[3]);
      }
    // Mask, online softmax (per row: the quad t = 0..3 holds its 64 columns).
    const bool full_tile = k0 + BK - 1 <= pmin && (p.window == 0 || k0 > pmax - p.window);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = e >> 1, key = k0 + 8 * j + 2 * t + (e & 1);
        const bool ok = live[row] && (full_tile || (key <= pos[row] && (p.window == 0 || key > pos[row] - p.window)));
        s[j][e] = ok ? s[j][e] * sc : -INFINITY;
        mx[row] = fmaxf(mx[row], s[j][e]);
      }
    float alpha[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int row = 0; row < 2; ++row) {
      mx[row] = fmaxf(mx[row], __shfl_xor_sync(0xffffffffu, mx[row], 1));
      mx[row] = fmaxf(mx[row], __shfl_xor_sync(0xffffffffu, mx[row], 2));
      const float mn = fmaxf(m[row], mx[row]);  // finite: m starts at the sink
      alpha[row] = exp2f(m[row] - mn);
      m[row] = mn;
    }
    uint32_t pa[4][4];  // P as the A operand of P V: k-step kk = keys 16 kk .. 16 kk + 15
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float e[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        e[q] = round_in<kFp8>(exp2f(s[j][q] - m[q >> 1]));  // P V uses the rounded weights: so does l
        sum[q >> 1] += e[q];
      }
      pa[j >> 1][(j & 1) * 2 + 0] = pack_in<kFp8>(e[0], e[1]);
      pa[j >> 1][(j & 1) * 2 + 1] = pack_in<kFp8>(e[2], e[3]);
    }
#pragma unroll
    for (int row = 0; row < 2; ++row) {
      sum[row] += __shfl_xor_sync(0xffffffffu, sum[row], 1);
      sum[row] += __shfl_xor_sync(0xffffffffu, sum[row], 2);
      l[row] = l[row] * alpha[row] + sum[row];
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      o[j][0] *= alpha[0]; o[j][1] *= alpha[0];
      o[j][2] *= alpha[1]; o[j][3] *= alpha[1];
    }
    // O += P V: V rows are keys (k), columns dims (n): transposed ldmatrix gives the col operand.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      // pa[kk] holds (row g, keys 2t..) (row g+8, keys 2t..) (row g, keys 2t+8..) (row g+8, keys 2t+8..)
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        const int mi = lane >> 3, r = lane & 7;
        const int key = kk * 16 + r + (mi & 1) * 8, d = jp * 16 + (mi >> 1) * 8;
        uint32_t b[4];
        ldmatrix_x4_trans(b[0], b[1], b[2], b[3], &vs[buf][key * LDS + d]);
        mma_in<kFp8>(o[2 * jp], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], b[0], b[1]);
        mma_in<kFp8>(o[2 * jp + 1], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], b[2], b[3]);
      }
    }
    if constexpr (kFp8) {
      if (tile + 1 < ntiles) {  // the other buffer was last read before this iteration's barrier
        put8(buf ^ 1, 0);
        fill8(tile + 1, buf ^ 1, 1);
      }
    }
    __syncthreads();  // the buffer is refilled by the next iteration's load
  }
  uint16_t* out = p.out + size_t(h) * D + 2 * t;
#pragma unroll
  for (int row = 0; row < 2; ++row) {
    if (!live[row]) continue;
    const float inv = 1.f / l[row];
    uint16_t* orow = out + size_t(q0 + g + 8 * row) * p.Hq * D;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      *reinterpret_cast<uint32_t*>(orow + 8 * j) = pack_bf16(o[j][2 * row] * inv, o[j][2 * row + 1] * inv);
  }
}

}  // namespace

void attention_prefill_bf16(const AttnPrefillParams& p, cudaStream_t s) {
  require_kv(p.kv, "attention_prefill");
  if (p.T <= 0) return;
  if (p.Hkv <= 0 || p.Hq % p.Hkv || p.Hq / p.Hkv > kMaxG)
    throw std::invalid_argument("attention_prefill_bf16: needs Hq a multiple of Hkv with at most " +
                                std::to_string(kMaxG) + " query heads per KV head");
  dim3 grid((p.T + BQ - 1) / BQ, p.Hkv);
  if (p.kv.fp8()) attn_prefill_kernel<true><<<grid, 32 * (p.Hq / p.Hkv), 0, s>>>(p);
  else attn_prefill_kernel<false><<<grid, 32 * (p.Hq / p.Hkv), 0, s>>>(p);
}

}  // namespace mx::cuda
