// Bodies of the MXFP4 expert decode kernels as device functions, shared by their own grids
// (moe_decode.cu) and by the persistent decode step (decode_step.cu). A CTA works on one distinct
// expert (slot) of the step's M <= 8 tokens, so its weight tiles are read once for all the tokens
// that chose it. The routing (top-4 on raw logits, lowest index on ties, softmax over the four) is
// computed per CTA from the router's logits, which is cheaper than a kernel boundary.
#pragma once
#include "kernels/common/device_math.cuh"
#include "kernels/decode/decode_gemv.h"
#include "kernels/decode/mma_tile.cuh"
#include "kernels/decode/stage.cuh"

namespace mx::cuda::body {
using namespace mma;

constexpr int kMoeWarps = 4;
constexpr int kMaxSlots = kMaxDecodeTokens * kTopK;
// Weight segments in flight per warp. Deeper batches (6) measured slower than 4 here: the MXFP4
// kernels are as much ALU- as latency-bound. __launch_bounds__(128, 3) lets them use up to 168
// registers (both grids need under 3 CTAs per SM).
constexpr int kFc1U = 4, kFc2U = 4;
// FC1 has 4x the rows of FC2: one warp per tile keeps all its warps resident in one wave.
constexpr int kFc1Split = 1, kFc2Split = 2;

// Grid of each expert kernel: (row-tile CTAs, distinct-expert slots).
__host__ __device__ inline int fc1_ctas(int I, int ksplit = kFc1Split) {
  return (I / 8 + kMoeWarps / ksplit - 1) / (kMoeWarps / ksplit);
}
__host__ __device__ inline int fc2_ctas(int H) {
  return ((H + 15) / 16 + kMoeWarps / kFc2Split - 1) / (kMoeWarps / kFc2Split);
}
__host__ __device__ inline int moe_slots(int M, int E) { return M * kTopK < E ? M * kTopK : E; }

struct Routing {
  int idx[kMaxDecodeTokens][kTopK];
  float w[kMaxDecodeTokens][kTopK];
  int experts[kMaxSlots];  // distinct experts in order of first use (token-major)
  int count;
};

// Top-4 of token n's logits (the sum of `splits` partial rows [splits, M, E]; lowest index on ties, a
// NaN never wins) and the softmax over the four, by one warp: four rounds of a warp argmax. Every lane
// gets the result.
// The top-4 and softmax of the logits v[i] of experts lane + 32 i (E <= 128), every lane gets them.
__device__ inline void top4_softmax(float (&v)[4], int E, int (&sel)[kTopK], float (&wt)[kTopK]) {
  const int lane = threadIdx.x & 31;
  bool used[4];
  for (int i = 0; i < 4; ++i) {
    v[i] = v[i] == v[i] ? v[i] : -INFINITY;
    used[i] = lane + 32 * i >= E;
  }
  // Each round is two warp reductions (redux.sync) instead of five shuffle-and-compare steps: the
  // routing sits on FC1's critical path. Keys order the floats as unsigned ints (-0 taken as +0).
  uint32_t key[4];
  for (int i = 0; i < 4; ++i) {
    const uint32_t u = __float_as_uint(v[i] + 0.f);
    key[i] = u & 0x80000000u ? ~u : u | 0x80000000u;
  }
  float val[kTopK];
  for (int j = 0; j < kTopK; ++j) {
    uint32_t best = 0;
    for (int i = 0; i < 4; ++i)
      if (!used[i]) best = max(best, key[i]);
    const uint32_t m = __reduce_max_sync(0xffffffffu, best);
    uint32_t mine = 0x7fffffffu;  // this lane's lowest expert with the maximum
    for (int i = 3; i >= 0; --i)
      if (!used[i] && key[i] == m) mine = uint32_t(lane + 32 * i);
    const int be = int(__reduce_min_sync(0xffffffffu, mine));
    if ((be & 31) == lane) used[be >> 5] = true;
    sel[j] = be;
    val[j] = __uint_as_float(m & 0x80000000u ? m & 0x7fffffffu : ~m);
  }
  float z = 0.f, ex[kTopK];
  for (int j = 0; j < kTopK; ++j) z += (ex[j] = expf(val[j] - val[0]));
  for (int j = 0; j < kTopK; ++j) wt[j] = ex[j] / z;
}

__device__ inline void route_token(const float* logits, int splits, int M, int n, int E, int (&sel)[kTopK],
                                   float (&wt)[kTopK]) {
  const int lane = threadIdx.x & 31;
  float v[4];
  for (int i = 0; i < 4; ++i) {
    const int e = lane + 32 * i;
    float x = -INFINITY;
    if (e < E) {
      x = 0.f;
      for (int k = 0; k < splits; ++k) x += __ldcg(logits + (size_t(k) * M + n) * E + e);
    }
    v[i] = x;
  }
  top4_softmax(v, E, sel, wt);
}

// One token whose router ran in the o-proj (dense_o_proj_router_m1): 1 / rms from the per-tile sums
// of squares (added in a fixed order, so every warp gets the same bits), logits = acc / 2^28 / rms +
// bias, then the top-4. Returns 1 / rms (the expert input's norm). Every lane gets the results.
__device__ inline float route_token_acc(const MoeDecodeParams& p, int (&sel)[kTopK], float (&wt)[kTopK]) {
  const int lane = threadIdx.x & 31;
  // Every load issued before any is used: one L2 round trip on FC1's critical path, not two.
  long long acc[4];
  float bias[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int e = lane + 32 * i;
    acc[i] = e < p.E ? __ldcg(p.route_acc + e) : 0;
    bias[i] = e < p.E ? bf(p.router_bias[e]) : 0.f;
  }
  // The sums of squares too, in one round of loads: a loop adding one load at a time is a round trip
  // per iteration on FC1's prologue.
  constexpr int kSsPer = 8;
  float sp[kSsPer];
#pragma unroll
  for (int u = 0; u < kSsPer; ++u) sp[u] = lane + 32 * u < p.ss_parts ? __ldcg(p.ss_part + lane + 32 * u) : 0.f;
  float ss = 0.f;
#pragma unroll
  for (int u = 0; u < kSsPer; ++u) ss += sp[u];
  for (int i = lane + 32 * kSsPer; i < p.ss_parts; i += 32) ss += __ldcg(p.ss_part + i);
  ss = warp_sum(ss);
  const float inv = rsqrtf(ss / p.H + p.eps);
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    v[i] = lane + 32 * i < p.E ? float(acc[i]) * (1.f / kRouteAccScale) * inv + bias[i] : -INFINITY;
  top4_softmax(v, p.E, sel, wt);
  return inv;
}

// One warp per token (route_token), then the distinct experts among those held here ([lo, hi): expert
// parallelism leaves the others to another GPU). Contains __syncthreads: call from every thread.
__device__ inline void route_tokens(const float* logits, int splits, int M, int E, Routing& r, int lo = 0,
                                    int hi = 1 << 30) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int n = warp; n < M; n += blockDim.x >> 5) {
    int sel[kTopK];
    float wt[kTopK];
    route_token(logits, splits, M, n, E, sel, wt);
    if (lane == 0)
      for (int j = 0; j < kTopK; ++j) {
        r.idx[n][j] = sel[j];
        r.w[n][j] = wt[j];
      }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int c = 0;
    for (int n = 0; n < M; ++n)
      for (int j = 0; j < kTopK; ++j) {
        const int e = r.idx[n][j];
        int u = 0;
        while (u < c && r.experts[u] != e) ++u;
        if (u == c && e >= lo && e < hi) r.experts[c++] = e;
      }
    r.count = c;
  }
  __syncthreads();
}

// The weight rows (rA, rB) of expert matrix [*, K] in MXFP4 for split kp of KSPLIT; first batch issued.
// kRawScale: the scale bytes as they are (the FP8 one-token path, e4m3_split.cuh).
template <int KSPLIT, int U, bool kRawScale = false>
__device__ __forceinline__ Mxfp4PipeT<U, kRawScale> expert_pipe(const uint8_t* blocks, const uint8_t* scales, size_t rA,
                                                                size_t rB, int K, int kp, int t, int& s0) {
  const int groups = K / 32, segs = (groups + 3) / 4;
  s0 = segs * kp / KSPLIT;
  Mxfp4PipeT<U, kRawScale> pipe{{}, {}, {}, {}, blocks + rA * (K / 2), blocks + rB * (K / 2), scales + rA * groups,
                     scales + rB * groups, segs * (kp + 1) / KSPLIT, groups, t};
  pipe.load(s0);
  return pipe;
}

__device__ __forceinline__ int slot_of(const Routing& r, int n, int e) {
  for (int j = 0; j < kTopK; ++j)
    if (r.idx[n][j] == e) return j;
  return -1;
}

// FC1 + bias + clamped SwiGLU of distinct expert `slot` (< r.count), row-tile CTA `cta`.
__device__ __forceinline__ void fc1_swiglu(const MoeDecodeParams& p, const Routing& r, int cta, int slot, float* red) {
  extern __shared__ __align__(16) uint16_t xs[];
  constexpr int KSPLIT = kFc1Split;
  const int e = r.experts[slot], H = p.H, I = p.I;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = cta * (kMoeWarps / KSPLIT) + warp / KSPLIT, kp = warp % KSPLIT, ntiles = I / 8;
  // Fragment rows g / g+8 are gate row 2i / up row 2i+1 of activation i: SwiGLU meets in one thread.
  const int i = min(tile, ntiles - 1) * 8 + g;
  const size_t rA = size_t(e) * 2 * I + 2 * i, rB = rA + 1;
  int s0;
  Mxfp4PipeT<kFc1U> pipe = expert_pipe<KSPLIT, kFc1U>(p.fc1_blocks, p.fc1_scales, rA, rB, H, kp, t, s0);
  stage_bf16_rows([&](int n) -> const uint16_t* { return slot_of(r, n, e) >= 0 ? p.xn + size_t(n) * H : nullptr; },
                  p.M, H, true, xs);
  __syncthreads();
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  tile_mxfp4_run(pipe, xs + min(g, p.M - 1) * staged_ld(H), s0, c);
  reduce_ksplit(c, red, KSPLIT);
  if (kp != 0 || tile >= ntiles) return;
  const float bg = bf(p.fc1_bias[rA]), bu = bf(p.fc1_bias[rB]);
  for (int q = 0; q < 2; ++q) {
    const int n = 2 * t + q;
    if (n >= p.M) break;
    const int j = slot_of(r, n, e);
    if (j < 0) continue;
    const float gate = fminf(c[q] + bg, p.limit);
    const float up = fminf(fmaxf(c[2 + q] + bu, -p.limit), p.limit);
    const float glu = gate / (1.f + expf(-p.alpha * gate));
    p.act[(size_t(n) * kTopK + j) * I + i] = uint16_t(f32_to_bf16_bits(glu * (up + 1.f)));
  }
}

// FC2 + bias, times the routing weight, into y_slot, for distinct expert `slot` (< r.count). wait()
// guards FC1's activations; the weight loads before it only need the routing.
template <class Wait>
__device__ __forceinline__ void fc2(const MoeDecodeParams& p, const Routing& r, int cta, int slot, float* red,
                                    Wait wait) {
  extern __shared__ __align__(16) uint16_t xs[];
  constexpr int KSPLIT = kFc2Split;
  const int e = r.experts[slot], H = p.H, I = p.I;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = cta * (kMoeWarps / KSPLIT) + warp / KSPLIT, kp = warp % KSPLIT, ntiles = (H + 15) / 16;
  const int r0 = min(tile, ntiles - 1) * 16;
  const size_t rA = size_t(e) * H + min(r0 + g, H - 1), rB = size_t(e) * H + min(r0 + g + 8, H - 1);
  int s0;
  Mxfp4PipeT<kFc2U> pipe = expert_pipe<KSPLIT, kFc2U>(p.fc2_blocks, p.fc2_scales, rA, rB, I, kp, t, s0);
  wait();
  stage_bf16_rows(
      [&](int n) -> const uint16_t* {
        const int j = slot_of(r, n, e);
        return j >= 0 ? p.act + (size_t(n) * kTopK + j) * I : nullptr;
      },
      p.M, I, true, xs);
  __syncthreads();
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  tile_mxfp4_run(pipe, xs + min(g, p.M - 1) * staged_ld(I), s0, c);
  reduce_ksplit(c, red, KSPLIT);
  if (kp != 0 || tile >= ntiles) return;
  for (int q = 0; q < 4; ++q) {
    const int n = 2 * t + (q & 1), row = r0 + g + (q >> 1) * 8;
    if (n >= p.M || row >= H) continue;
    const int j = slot_of(r, n, e);
    if (j < 0) continue;
    p.y_slot[(size_t(n) * kTopK + j) * H + row] = r.w[n][j] * (c[q] + bf(p.fc2_bias[size_t(e) * H + row]));
  }
}

}  // namespace mx::cuda::body
