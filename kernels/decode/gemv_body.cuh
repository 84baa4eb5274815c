// Bodies of the dense decode kernels (weights bf16, MXFP4 or FP8: dense_tile.cuh) as device functions, shared by their own grids
// (decode_gemv.cu: one kernel per op, programmatic dependent launch) and by the persistent decode-step
// kernel (decode_step.cu: work items behind ready counters). A body gets its CTA coordinates as
// arguments and calls wait() at the point where everything before is independent of the kernels
// before it (in practice: after issuing the first weight loads).
// CTA = 4 warps; a 16-row tile is computed by KSPLIT warps that split K and add their partials.
#pragma once
#include "kernels/common/cta_trace.cuh"
#include "kernels/common/device_math.cuh"
#include "kernels/common/kv_fp8.cuh"
#include "kernels/common/l2_prefetch.cuh"
#include "kernels/decode/decode_gemv.h"
#include "kernels/decode/dense_tile.cuh"
#include "kernels/decode/mma_tile.cuh"
#include "kernels/decode/stage.cuh"

namespace mx::cuda::body {
using namespace mma;

constexpr int kWarps = 4;
// Weight segments each warp keeps in flight (registers). All CTAs of these grids fit in one wave, so
// the registers of a deeper batch cost no occupancy and buy more bytes in flight (docs/perf.md).
constexpr int kQkvU = 8, kOprojU = 8;
constexpr int kQkvSplit = 4, kOprojSplit = 4, kRouterSplit = 4, kLmHeadSplit = 1;
// Quantized rows (dense_tile.cuh): MXFP4 qkv at 8 segments a batch takes 209 registers, 2 CTAs per SM and
// two waves (slower); 4 keep one wave. The quantized o-proj takes 4 (the one-token kernel's 168 registers).
// Other depths and splits measured no better (docs/perf.md).
template <DenseFormat WF> constexpr int kQkvUOf = WF == DenseFormat::kMxfp4 ? 4 : kQkvU;
constexpr int kOprojQuantU = 4;

// y (+)= W . x + bias: the plain GEMV behind lm_head (no bias), o-proj (accumulates into the
// residual) and the generic small-M entry point.
struct GemvParams {
  const uint16_t* x; DenseWeight w; const uint16_t* bias; float* y; int M, N, K; bool accumulate;
};

// CTAs of each grid (one tile of 16 rows per KSPLIT warps).
__host__ __device__ inline int tiles_ctas(int ntiles, int ksplit) {
  const int per = kWarps / ksplit;
  return (ntiles + per - 1) / per;
}
__host__ __device__ inline int qkv_ctas(int Hq, int Hkv, int D) {
  return tiles_ctas((Hq + 2 * Hkv) * D / 16, kQkvSplit);
}
__host__ __device__ inline int oproj_ctas(int N) { return tiles_ctas((N + 15) / 16, kOprojSplit); }
__host__ __device__ inline int router_ctas(int E) { return tiles_ctas((E + 15) / 16, kRouterSplit); }

__device__ __forceinline__ uint16_t to_bf(float f) { return uint16_t(f32_to_bf16_bits(f)); }

__device__ __forceinline__ ResidualIn residual_in(const DecodeResidual& r, bool first_cta) {
  return ResidualIn{r.x, r.y_slot, first_cta ? r.x_out : nullptr};
}

// One token: the full-attention layer's older K / V blocks (those holding keys [0, pos)) into L2, one
// prefetch of a block's K or V rows (all KV heads, contiguous) per item, the items spread over the CTAs.
template <bool kFp8>
__device__ __forceinline__ void prefetch_kv_l2(const QkvRopeKvParams& p, int cta) {
  const int pos = ld_keep(p.pos), nb = (pos + p.kv.block_size - 1) / p.kv.block_size;
  const int32_t* bt = p.block_tables + ld_keep(p.bt_off);
  const size_t block_elems = size_t(p.kv.block_size) * p.Hkv * p.D;
  for (int i = cta; i < 2 * nb; i += gridDim.x) {
    if constexpr (kFp8)
      l2_prefetch((i & 1 ? p.kv.v_fp8() : p.kv.k_fp8()) + size_t(ld_keep(bt + i / 2)) * block_elems, uint32_t(block_elems));
    else
      l2_prefetch((i & 1 ? p.kv.v_bf16() : p.kv.k_bf16()) + size_t(ld_keep(bt + i / 2)) * block_elems, uint32_t(block_elems * 2));
  }
}

// rmsnorm prologue, q / k / v rows with bias, RoPE on q and k, K and V into the paged cache.
// kEarlyInputs: the epilogue's bias, RoPE frequency and token 0's position and cache row are read before the
// wait (l2_prefetch.cuh). The persistent step's item reads them in its epilogue: held across the item they
// add to its spills (docs/perf.md). kFp8: the cache is E4M3 (kv_cache.h). WF: the weights' format.
template <int KSPLIT, bool kOneTokenNorm, bool kEarlyInputs, bool kFp8, DenseFormat WF, class Wait>
__device__ __forceinline__ void qkv_rope_kv(const QkvRopeKvParams& p, int cta, float* red, Wait wait) {
  extern __shared__ __align__(16) uint16_t xs[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = cta * (kWarps / KSPLIT) + warp / KSPLIT, kp = warp % KSPLIT;
  const int dq = p.D / 16, ntiles = (p.Hq + 2 * p.Hkv) * dq;
  const int tl = min(tile, ntiles - 1);
  // Fragment rows g / g+8 are head dims d and d + D/2: the RoPE pair meets in one thread.
  const int h = tl / dq, d = 8 * (tl % dq) + g, half = p.D / 2;
  const int rA = h * p.D + d, rB = rA + half;
  DensePipe<WF, kQkvUOf<WF>> pipe;
  pipe.init(p.w, rA, rB, p.H, kp, KSPLIT);
  if (p.kv_prefetch && threadIdx.x == 0) prefetch_kv_l2<kFp8>(p, cta);
  if (threadIdx.x == 0) {
    l2_prefetch_keep(p.norm_w, p.H * 2);  // the staging's gamma, after the wait
    if (p.M > 1) l2_prefetch_keep(p.pos, p.M * 4), l2_prefetch_keep(p.slot, p.M * 4);
  }
  float bA = 0.f, bB = 0.f, inv_freq = 0.f;
  int pos0 = 0, slot0 = 0;
  if (kEarlyInputs) {
    bA = bf(p.bias[rA]), bB = bf(p.bias[rB]), inv_freq = p.inv_freq[d];
    pos0 = ld_keep(p.pos), slot0 = ld_keep(p.slot);
  }
  wait();
  const bool first = cta == 0;
  stage_rmsnorm<kOneTokenNorm>(residual_in(p.res, first), p.norm_w, p.eps, p.M, p.H, pipe.kPermute, xs, first,
                               nullptr);
  __syncthreads();
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  pipe.run(xs + min(g, p.M - 1) * staged_ld(p.H), c);
  reduce_ksplit(c, red, KSPLIT);
  if (kp != 0 || tile >= ntiles) return;
  pipe.scale(c);
  if (!kEarlyInputs) bA = bf(p.bias[rA]), bB = bf(p.bias[rB]), inv_freq = p.inv_freq[d], pos0 = p.pos[0], slot0 = p.slot[0];
  for (int i = 0; i < 2; ++i) {
    const int n = 2 * t + i;
    if (n >= p.M) break;
    float x1 = c[i] + bA, x2 = c[2 + i] + bB;
    if (h < p.Hq + p.Hkv) {
      float sn, cs;
      sincosf(float(n ? p.pos[n] : pos0) * inv_freq, &sn, &cs);
      cs *= p.concentration;
      sn *= p.concentration;
      const float y1 = x1 * cs - x2 * sn, y2 = x2 * cs + x1 * sn;
      x1 = y1;
      x2 = y2;
    }
    if (h < p.Hq) {
      float* q = p.q_out + size_t(n) * p.Hq * p.D + h * p.D;
      q[d] = x1;
      q[d + half] = x2;
    } else {
      const bool is_k = h < p.Hq + p.Hkv;
      const int kvh = is_k ? h - p.Hq : h - p.Hq - p.Hkv;
      if constexpr (kFp8) {
        uint8_t* row = (is_k ? p.kv.k_fp8() : p.kv.v_fp8()) + size_t(n ? p.slot[n] : slot0) * p.Hkv * p.D + kvh * p.D;
        row[d] = kv_to_e4m3(x1);
        row[d + half] = kv_to_e4m3(x2);
      } else {
        uint16_t* row = (is_k ? p.kv.k_bf16() : p.kv.v_bf16()) + size_t(n ? p.slot[n] : slot0) * p.Hkv * p.D + kvh * p.D;
        row[d] = to_bf(x1);
        row[d + half] = to_bf(x2);
      }
    }
  }
}

// The KV head whose attention needs qkv CTA `cta`'s output (its tiles lie in one head).
__device__ __forceinline__ int qkv_cta_kv_head(int cta, int Hq, int Hkv, int D) {
  const int h = cta * (kWarps / kQkvSplit) / (D / 16);
  return h < Hq ? h / (Hq / Hkv) : (h < Hq + Hkv ? h - Hq : h - Hq - Hkv);
}

struct Bf16Rows {
  const uint16_t* x;
  int K;
  __device__ const uint16_t* operator()(int n) const { return x + size_t(n) * K; }
};

// The plain GEMVs: weight rows of this warp's tile, first batch issued before staging.
template <int KSPLIT, int U = 4, DenseFormat WF = DenseFormat::kBf16>
struct PlainTile {
  DensePipe<WF, U> pipe;
  int r0, tile, kp, ntiles;
  // K segments [seg_lo, seg_hi) of 32 values (bf16 only; default: all) are split over the KSPLIT warps.
  __device__ PlainTile(const DenseWeight& w, int N, int K, int cta, int seg_lo = 0, int seg_hi = -1) {
    const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
    tile = cta * (kWarps / KSPLIT) + warp / KSPLIT;
    kp = warp % KSPLIT;
    ntiles = (N + 15) / 16;
    r0 = min(tile, ntiles - 1) * 16;
    const int rA = min(r0 + g, N - 1), rB = min(r0 + g + 8, N - 1);
    if constexpr (WF == DenseFormat::kBf16) pipe.init(w, rA, rB, K, kp, KSPLIT, seg_lo, seg_hi);
    else pipe.init(w, rA, rB, K, kp, KSPLIT);
  }
  // After staging + __syncthreads: the tile's outputs in c; false for warps with nothing to write.
  __device__ bool run(const uint16_t* xs, int M, int K, float* red, float (&c)[4]) {
    const int g = (threadIdx.x & 31) >> 2;
    pipe.run(xs + min(g, M - 1) * staged_ld(K), c);
    reduce_ksplit(c, red, KSPLIT);
    pipe.scale(c);
    return kp == 0 && tile < ntiles;
  }
};

// Calls f(n, row, value) for the lane's valid outputs.
template <class F>
__device__ __forceinline__ void for_outputs(const float (&c)[4], int r0, int N, int M, F f) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; ++i) {
    const int n = 2 * t + (i & 1), r = r0 + g + (i >> 1) * 8;
    if (n < M && r < N) f(n, r, c[i]);
  }
}

// The router is tiny (E rows): CTAs split K too (ks of kRouterSplits) so it spreads over the GPU; the
// routing prologue of the expert kernels adds the partials in a fixed order.
template <int KSPLIT, class Wait>
__device__ __forceinline__ void router(const RouterParams& p, int cta, int ks, float* red, Wait wait) {
  extern __shared__ __align__(16) uint16_t xs[];
  const int segs = p.H / 32;
  PlainTile<KSPLIT> pt(bf16_weight(p.w), p.E, p.H, cta, segs * ks / kRouterSplits, segs * (ks + 1) / kRouterSplits);
  wait();
  const bool first = cta == 0 && ks == 0;
  stage_rmsnorm(residual_in(p.res, first), p.norm_w, p.eps, p.M, p.H, false, xs, first, p.xn);
  __syncthreads();
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  if (!pt.run(xs, p.M, p.H, red, c)) return;
  for_outputs(c, pt.r0, p.E, p.M, [&](int n, int r, float v) {
    p.logits[(size_t(ks) * p.M + n) * p.E + r] = v + (ks == 0 ? bf(p.bias[r]) : 0.f);
  });
}

template <int KSPLIT, int U, DenseFormat WF, class Wait>
__device__ __forceinline__ void gemv(const GemvParams& p, int cta, float* red, Wait wait) {
  extern __shared__ __align__(16) uint16_t xs[];
  PlainTile<KSPLIT, U, WF> pt(p.w, p.N, p.K, cta);
  wait();
  stage_bf16_rows(Bf16Rows{p.x, p.K}, p.M, p.K, pt.pipe.kPermute, xs);
  __syncthreads();
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  if (!pt.run(xs, p.M, p.K, red, c)) return;
  for_outputs(c, pt.r0, p.N, p.M, [&](int n, int r, float v) {
    float& y = p.y[size_t(n) * p.N + r];
    y = (p.accumulate ? y : 0.f) + v + (p.bias ? bf(p.bias[r]) : 0.f);
  });
}

}  // namespace mx::cuda::body
