// Dense (BF16-weight) decode kernels: qkv + RoPE + KV write, o-proj + residual, router, lm_head.
// CTA = 4 warps; a 16-row tile is computed by KSPLIT warps that split K and add their partials.
#include "kernels/decode/decode_gemv.h"

#include "kernels/common/cuda_check.h"
#include "kernels/common/device_math.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/decode/mma_tile.cuh"
#include "kernels/decode/stage.cuh"

namespace mx::cuda {
namespace {
using namespace mma;

constexpr int kWarps = 4;
// Weight segments each warp keeps in flight (registers). All CTAs of these grids fit in one wave, so
// the registers of a deeper batch cost no occupancy: 8 segments (162 / 160 registers) measured
// +4 % on the 120b decode step over 4 (docs/perf.md, 2026-11-23).
constexpr int kQkvU = 8, kOprojU = 8;

__device__ __forceinline__ uint16_t to_bf(float f) { return uint16_t(f32_to_bf16_bits(f)); }

__device__ __forceinline__ ResidualIn residual_in(const DecodeResidual& r, bool first_cta) {
  return ResidualIn{r.x, r.y_slot, first_cta ? r.x_out : nullptr};
}

// Rows [s0, s1) of the K split of warp `kp` (in 32-value segments).
__device__ __forceinline__ void split_range(int segs, int kp, int ksplit, int& s0, int& s1) {
  s0 = segs * kp / ksplit;
  s1 = segs * (kp + 1) / ksplit;
}

template <int KSPLIT>
__global__ void __launch_bounds__(128) qkv_rope_kv_k(QkvRopeKvParams p) {
  extern __shared__ __align__(16) uint16_t xs[];
  __shared__ float red[kWarps * 32 * 4];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * (kWarps / KSPLIT) + warp / KSPLIT, kp = warp % KSPLIT;
  const int dq = p.D / 16, ntiles = (p.Hq + 2 * p.Hkv) * dq;
  const int tl = min(tile, ntiles - 1);
  // Fragment rows g / g+8 are head dims d and d + D/2: the RoPE pair meets in one thread.
  const int h = tl / dq, d = 8 * (tl % dq) + g, half = p.D / 2;
  const int rA = h * p.D + d, rB = rA + half;
  int s0, s1;
  split_range(p.H / 32, kp, KSPLIT, s0, s1);
  Bf16PipeT<kQkvU> pipe{{}, {}, p.w + size_t(rA) * p.H, p.w + size_t(rB) * p.H, s1, t};
  pipe.load(s0);
  pdl_wait();
  pdl_launch_dependents();
  const bool first = blockIdx.x == 0;
  stage_rmsnorm(residual_in(p.res, first), p.norm_w, p.eps, p.M, p.H, false, xs, first, nullptr);
  __syncthreads();
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  tile_bf16_run(pipe, xs + min(g, p.M - 1) * staged_ld(p.H), s0, c);
  reduce_ksplit(c, red, KSPLIT);
  if (kp != 0 || tile >= ntiles) return;
  const float bA = bf(p.bias[rA]), bB = bf(p.bias[rB]);
  for (int i = 0; i < 2; ++i) {
    const int n = 2 * t + i;
    if (n >= p.M) break;
    float x1 = c[i] + bA, x2 = c[2 + i] + bB;
    if (h < p.Hq + p.Hkv) {
      float sn, cs;
      sincosf(float(p.pos[n]) * p.inv_freq[d], &sn, &cs);
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
      uint16_t* row = (is_k ? p.k_cache : p.v_cache) + size_t(p.slot[n]) * p.Hkv * p.D + kvh * p.D;
      row[d] = to_bf(x1);
      row[d + half] = to_bf(x2);
    }
  }
}

// Shared body of the plain GEMVs: stage bf16 rows, tile, reduce; returns false for idle warps.
struct Bf16Rows {
  const uint16_t* x;
  int K;
  __device__ const uint16_t* operator()(int n) const { return x + size_t(n) * K; }
};

// The plain GEMVs: weight rows of this warp's tile, first batch issued before staging.
template <int KSPLIT, int U = 4>
struct PlainTile {
  Bf16PipeT<U> pipe;
  int r0, s0, tile, kp, ntiles;
  // K segments [seg_lo, seg_hi) of 32 values (default: all) are split over the KSPLIT warps.
  __device__ PlainTile(const uint16_t* w, int N, int K, int seg_lo = 0, int seg_hi = -1) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    tile = blockIdx.x * (kWarps / KSPLIT) + warp / KSPLIT;
    kp = warp % KSPLIT;
    ntiles = (N + 15) / 16;
    r0 = min(tile, ntiles - 1) * 16;
    const int rA = min(r0 + g, N - 1), rB = min(r0 + g + 8, N - 1);
    if (seg_hi < 0) seg_hi = K / 32;
    int s1;
    split_range(seg_hi - seg_lo, kp, KSPLIT, s0, s1);
    s0 += seg_lo;
    s1 += seg_lo;
    pipe = Bf16PipeT<U>{{}, {}, w + size_t(rA) * K, w + size_t(rB) * K, s1, t};
    pipe.load(s0);
  }
  // After staging + __syncthreads: the tile's outputs in c; false for warps with nothing to write.
  __device__ bool run(const uint16_t* xs, int M, int K, float* red, float (&c)[4]) {
    const int g = (threadIdx.x & 31) >> 2;
    tile_bf16_run(pipe, xs + min(g, M - 1) * staged_ld(K), s0, c);
    reduce_ksplit(c, red, KSPLIT);
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

template <int KSPLIT>
__global__ void __launch_bounds__(128) router_k(RouterParams p) {
  extern __shared__ __align__(16) uint16_t xs[];
  __shared__ float red[kWarps * 32 * 4];
  // The router is tiny (E rows): CTAs split K too (blockIdx.y) so it spreads over the GPU; the
  // routing prologue of the expert kernels adds the partials in a fixed order.
  const int ks = blockIdx.y, segs = p.H / 32;
  PlainTile<KSPLIT> pt(p.w, p.E, p.H, segs * ks / kRouterSplits, segs * (ks + 1) / kRouterSplits);
  pdl_wait();
  pdl_launch_dependents();
  const bool first = blockIdx.x == 0 && blockIdx.y == 0;
  stage_rmsnorm(residual_in(p.res, first), p.norm_w, p.eps, p.M, p.H, false, xs, first, p.xn);
  __syncthreads();
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  if (!pt.run(xs, p.M, p.H, red, c)) return;
  for_outputs(c, pt.r0, p.E, p.M, [&](int n, int r, float v) {
    p.logits[(size_t(ks) * p.M + n) * p.E + r] = v + (ks == 0 ? bf(p.bias[r]) : 0.f);
  });
}

// y (+)= W . x + bias: the plain GEMV behind lm_head (no bias), o-proj (accumulates into the
// residual) and the generic small-M entry point.
struct GemvParams {
  const uint16_t* x; const uint16_t* w; const uint16_t* bias; float* y; int M, N, K; bool accumulate;
};
template <int KSPLIT, int U = 4>
__global__ void __launch_bounds__(128) gemv_k(GemvParams p) {
  extern __shared__ __align__(16) uint16_t xs[];
  __shared__ float red[kWarps * 32 * 4];
  PlainTile<KSPLIT, U> pt(p.w, p.N, p.K);
  pdl_wait();
  pdl_launch_dependents();
  stage_bf16_rows(Bf16Rows{p.x, p.K}, p.M, p.K, false, xs);
  __syncthreads();
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  if (!pt.run(xs, p.M, p.K, red, c)) return;
  for_outputs(c, pt.r0, p.N, p.M, [&](int n, int r, float v) {
    float& y = p.y[size_t(n) * p.N + r];
    y = (p.accumulate ? y : 0.f) + v + (p.bias ? bf(p.bias[r]) : 0.f);
  });
}

__global__ void __launch_bounds__(256) final_norm_k(DecodeResidual res, const int32_t* rows, const uint16_t* gamma,
                                                    float eps, uint16_t* xn, int H) {
  __shared__ float part[8];
  const int i = blockIdx.x, n = rows ? rows[i] : i, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const ResidualIn r{res.x, res.y_slot, nullptr};
  float ss = 0.f;
  for (int k = threadIdx.x * 8; k < H; k += blockDim.x * 8) {
    float v[8];
    load8_residual(r, n, H, k, v);
    for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
  }
  ss = warp_sum(ss);
  if (lane == 0) part[warp] = ss;
  __syncthreads();
  float tot = 0.f;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) tot += part[w];
  const float inv = rsqrtf(tot / H + eps);
  for (int k = threadIdx.x * 8; k < H; k += blockDim.x * 8) {
    float v[8];
    load8_residual(r, n, H, k, v);
    for (int j = 0; j < 8; ++j) v[j] = bf(gamma[k + j]) * (v[j] * inv);
    *reinterpret_cast<uint4*>(xn + size_t(i) * H + k) = pack8(v, false);
  }
}

__global__ void count_bad_scales_k(const uint8_t* s, size_t n, unsigned long long* bad) {
  unsigned long long c = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    c += s[i] > 128;
  if (c) atomicAdd(bad, c);
}

template <class K>
void allow_smem(K kernel) {
  MX_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024));
}
size_t smem_bytes(int M, int K) { return size_t(M) * staged_ld(K) * 2; }
void check_m(int M) {
  if (M < 1 || M > kDecodeMaxTokens)
    throw_error("decode kernels take 1.." + std::to_string(kDecodeMaxTokens) + " tokens, got " + std::to_string(M));
}

}  // namespace

void bf16_qkv_rope_kv(const QkvRopeKvParams& p, cudaStream_t s) {
  check_m(p.M);
  if (p.D % 16 || p.H % 32) throw_error("qkv decode: head_dim must be a multiple of 16 and hidden of 32");
  static bool init = (allow_smem(qkv_rope_kv_k<4>), true);
  (void)init;
  const int ntiles = (p.Hq + 2 * p.Hkv) * p.D / 16;
  launch_pdl(qkv_rope_kv_k<4>, dim3(ntiles), dim3(128), smem_bytes(p.M, p.H), s, p);
}

void bf16_o_proj_residual(const OProjParams& p, cudaStream_t s) {
  check_m(p.M);
  static bool init = (allow_smem(gemv_k<4, kOprojU>), true);
  (void)init;
  launch_pdl(gemv_k<4, kOprojU>, dim3((p.N + 15) / 16), dim3(128), smem_bytes(p.M, p.K), s,
             GemvParams{p.attn, p.w, p.bias, p.x, p.M, p.N, p.K, true});
}

void bf16_router(const RouterParams& p, cudaStream_t s) {
  check_m(p.M);
  static bool init = (allow_smem(router_k<4>), true);
  (void)init;
  launch_pdl(router_k<4>, dim3((p.E + 15) / 16, kRouterSplits), dim3(128), smem_bytes(p.M, p.H), s, p);
}

void final_rmsnorm_bf16(const DecodeResidual& res, const int32_t* rows, const uint16_t* norm_w, float eps,
                        uint16_t* xn, int S, int H, cudaStream_t s) {
  if (S > 0) final_norm_k<<<S, 256, 0, s>>>(res, rows, norm_w, eps, xn, H);
}

void bf16_lm_head(const uint16_t* xn, const uint16_t* w, float* logits, int M, int V, int H, cudaStream_t s) {
  check_m(M);
  static bool init = (allow_smem(gemv_k<1>), true);
  (void)init;
  const int ntiles = (V + 15) / 16;
  launch_pdl(gemv_k<1>, dim3((ntiles + 3) / 4), dim3(128), smem_bytes(M, H), s, GemvParams{xn, w, nullptr, logits, M, V, H, false});
}

void bf16_gemv_small_m(const uint16_t* x, const uint16_t* w, const uint16_t* bias, float* y, int M, int N, int K,
                       cudaStream_t s) {
  check_m(M);
  if (K % 32) throw_error("bf16_gemv_small_m: K=" + std::to_string(K) + " must be a multiple of 32");
  static bool init = (allow_smem(gemv_k<4>), true);
  (void)init;
  launch_pdl(gemv_k<4>, dim3((N + 15) / 16), dim3(128), smem_bytes(M, K), s, GemvParams{x, w, bias, y, M, N, K, false});
}

void mxfp4_count_bad_scales(const uint8_t* scales, size_t n, unsigned long long* bad, cudaStream_t s) {
  count_bad_scales_k<<<264, 256, 0, s>>>(scales, n, bad);
}

}  // namespace mx::cuda
