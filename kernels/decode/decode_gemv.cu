// Dense decode kernels: qkv + RoPE + KV write, o-proj + residual, router, lm_head, as one grid each
// (bodies in gemv_body.cuh), instantiated for each weight format of qkv, o-proj and lm_head.
#include "kernels/decode/decode_gemv.h"

#include <type_traits>

#include "kernels/common/cta_trace.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/device_math.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/decode/gemv_body.cuh"

namespace mx::cuda {
namespace {
using namespace mma;
using body::GemvParams;
using DF = DenseFormat;

// Calls f(std::integral_constant<DenseFormat, fmt>) : one instantiation per weight format.
template <class F>
void with_format(DenseFormat fmt, F f) {
  if (fmt == DF::kMxfp4) f(std::integral_constant<DF, DF::kMxfp4>{});
  else if (fmt == DF::kFp8) f(std::integral_constant<DF, DF::kFp8>{});
  else f(std::integral_constant<DF, DF::kBf16>{});
}

template <bool kFp8, DF WF>
__global__ void __launch_bounds__(128) qkv_rope_kv_k(QkvRopeKvParams p) {
  __shared__ float red[body::kWarps * 32 * 4];
  trace_begin(p.trace);
  body::qkv_rope_kv<body::kQkvSplit, true, true, kFp8, WF>(p, blockIdx.x, red, TracedPdlWait{p.trace.buf});
  trace_end(p.trace, 0);
}

__global__ void __launch_bounds__(128) router_k(RouterParams p) {
  __shared__ float red[body::kWarps * 32 * 4];
  trace_begin(p.trace);
  body::router<body::kRouterSplit>(p, blockIdx.x, blockIdx.y, red, TracedPdlWait{p.trace.buf});
  trace_end(p.trace, 3);
}

template <int KSPLIT, int U, DF WF>
__global__ void __launch_bounds__(128) gemv_k(GemvParams p, CtaTrace tr) {
  __shared__ float red[body::kWarps * 32 * 4];
  trace_begin(tr);
  body::gemv<KSPLIT, U, WF>(p, blockIdx.x, red, TracedPdlWait{tr.buf});
  trace_end(tr, 2);
}

// One token, one 16-row tile per CTA (KSPLIT warps): the o-proj, then the router's partial sums over
// the tile's rows (OProjRouterParams). Thread e loads expert e's router weights and gamma for the 16 rows
// before the wait and multiplies them in the epilogue: on sliding layers these CTAs only enter once the
// attention has finished, and a product formed before the wait held the wait for their round trip.
template <DF WF>
__global__ void __launch_bounds__(128, 3) oproj_router_m1_k(OProjRouterParams p) {
  static_assert(body::kWarps / body::kOprojSplit == 1, "one tile per CTA");
  extern __shared__ __align__(16) uint16_t xs[];
  __shared__ float red[body::kWarps * 32 * 4];
  __shared__ float hs[16];
  const OProjParams& o = p.o;
  trace_begin(o.trace);
  // Quantized rows: a shallower batch keeps the conversion within the 168 registers of 3 CTAs per SM
  // (8 segments with 2 CTAs per SM measured slower).
  constexpr int U = WF == DF::kBf16 ? body::kOprojU : body::kOprojQuantU;
  body::PlainTile<body::kOprojSplit, U, WF> pt(o.w, o.N, o.K, blockIdx.x);
  const int e = threadIdx.x, r0 = blockIdx.x * 16;
  const bool aligned = e < p.E && r0 + 16 <= o.N && o.N % 8 == 0;  // 16-byte aligned rows
  uint4 rw[2] = {}, rg[2] = {};
  if (aligned) {
    const uint4* wr = reinterpret_cast<const uint4*>(p.router_w + size_t(e) * o.N + r0);
    const uint4* gr = reinterpret_cast<const uint4*>(p.norm_w + r0);
    rw[0] = wr[0], rw[1] = wr[1], rg[0] = gr[0], rg[1] = gr[1];
  }
  if (o.bias && threadIdx.x == 0) l2_prefetch_keep(o.bias + r0, uint32_t(min(16, o.N - r0)) * 2);  // the epilogue's
  // The residual rows this lane adds (lanes (g, 0) of warp 0): written by the qkv kernel, which has finished
  // before this grid launches.
  const int g = (threadIdx.x & 31) >> 2;
  float xr[2] = {0.f, 0.f};
  if (threadIdx.x < 32 && (threadIdx.x & 3) == 0)
    for (int i = 0; i < 2; ++i)
      if (r0 + g + 8 * i < o.N) xr[i] = o.x[r0 + g + 8 * i];
  TracedPdlWait{o.trace.buf}();
  stage_bf16_rows(body::Bf16Rows{o.attn, o.K}, 1, o.K, pt.pipe.kPermute, xs);
  __syncthreads();
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  if (pt.run(xs, 1, o.K, red, c) && (threadIdx.x & 3) == 0) {  // lanes (g, 0): token 0, rows g and g + 8
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = r0 + g + 8 * i;
      float h = 0.f;
      if (r < o.N) {
        h = xr[i] + c[2 * i] + (o.bias ? bf(o.bias[r]) : 0.f);
        o.x[r] = h;
      }
      hs[g + 8 * i] = h;
    }
  }
  float wg[16];
  if (aligned) {
    const uint32_t w[8] = {rw[0].x, rw[0].y, rw[0].z, rw[0].w, rw[1].x, rw[1].y, rw[1].z, rw[1].w};
    const uint32_t gg[8] = {rg[0].x, rg[0].y, rg[0].z, rg[0].w, rg[1].x, rg[1].y, rg[1].z, rg[1].w};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      wg[2 * j] = bf16_lo(w[j]) * bf16_lo(gg[j]);  // exact: bf16 x bf16 fits in fp32
      wg[2 * j + 1] = bf16_hi(w[j]) * bf16_hi(gg[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j)
      wg[j] = e < p.E && r0 + j < o.N ? bf(p.router_w[size_t(e) * o.N + r0 + j]) * bf(p.norm_w[r0 + j]) : 0.f;
  }
  __syncthreads();
  if (e < p.E) {
    float a = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) a = fmaf(wg[j], hs[j], a);
    // |a| < 2^27 keeps 128 tiles' sum inside int64 at 2^28 (saturated, never wrapped).
    const long long q = __float2ll_rn(fminf(fmaxf(a, -134217728.f), 134217728.f) * kRouteAccScale);
    atomicAdd(reinterpret_cast<unsigned long long*>(p.route_acc + e), static_cast<unsigned long long>(q));
  }
  if (threadIdx.x == 0) {
    float ss = 0.f;
    for (int j = 0; j < 16; ++j) ss = fmaf(hs[j], hs[j], ss);
    p.ss_part[blockIdx.x] = ss;
  }
  trace_end(o.trace, 2);
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

size_t smem_bytes(int M, int K) { return size_t(M) * staged_ld(K) * 2; }
void check_m(int M) {
  if (M < 1 || M > kDecodeMaxTokens)
    throw_error("decode kernels take 1.." + std::to_string(kDecodeMaxTokens) + " tokens, got " + std::to_string(M));
}
void check_k(const char* what, int K) {
  if (K % 32) throw_error(std::string(what) + ": K=" + std::to_string(K) + " must be a multiple of 32");
}

}  // namespace

void dense_qkv_rope_kv(const QkvRopeKvParams& p, cudaStream_t s) {
  require_kv(p.kv, "qkv decode");
  check_m(p.M);
  if (p.D % 16 || p.H % 32) throw_error("qkv decode: head_dim must be a multiple of 16 and hidden of 32");
  with_format(p.w.fmt, [&](auto wf) {
    constexpr DF WF = decltype(wf)::value;
    const dim3 grid(body::qkv_ctas(p.Hq, p.Hkv, p.D));
    static std::atomic<unsigned long long> ready{0};
    once_per_device(ready, [] {
      allow_dynamic_smem(qkv_rope_kv_k<false, WF>);
      allow_dynamic_smem(qkv_rope_kv_k<true, WF>);
    });
    if (p.kv.fp8()) launch_pdl(qkv_rope_kv_k<true, WF>, grid, dim3(128), smem_bytes(p.M, p.H), s, p);
    else launch_pdl(qkv_rope_kv_k<false, WF>, grid, dim3(128), smem_bytes(p.M, p.H), s, p);
  });
}

void dense_o_proj_residual(const OProjParams& p, cudaStream_t s) {
  check_m(p.M);
  check_k("o-proj decode", p.K);
  with_format(p.w.fmt, [&](auto wf) {
    constexpr auto k = gemv_k<body::kOprojSplit, body::kOprojU, decltype(wf)::value>;
    static std::atomic<unsigned long long> ready{0};
    once_per_device(ready, [] { allow_dynamic_smem(k); });
    launch_pdl(k, dim3(body::oproj_ctas(p.N)), dim3(128), smem_bytes(p.M, p.K), s,
               GemvParams{p.attn, p.w, p.bias, p.x, p.M, p.N, p.K, true}, p.trace);
  });
}

void dense_o_proj_router_m1(const OProjRouterParams& p, cudaStream_t s) {
  if (p.o.M != 1) throw_error("dense_o_proj_router_m1: one token only, got " + std::to_string(p.o.M));
  if (p.E < 1 || p.E > 128) throw_error("dense_o_proj_router_m1: 1..128 experts, got " + std::to_string(p.E));
  check_k("dense_o_proj_router_m1", p.o.K);
  with_format(p.o.w.fmt, [&](auto wf) {
    constexpr auto k = oproj_router_m1_k<decltype(wf)::value>;
    static std::atomic<unsigned long long> ready{0};
    once_per_device(ready, [] { allow_dynamic_smem(k); });
    launch_pdl(k, dim3(oproj_router_tiles(p.o.N)), dim3(128), smem_bytes(1, p.o.K), s, p);
  });
}

void bf16_router(const RouterParams& p, cudaStream_t s) {
  check_m(p.M);
  static std::atomic<unsigned long long> ready{0};
  once_per_device(ready, [] { allow_dynamic_smem(router_k); });
  launch_pdl(router_k, dim3(body::router_ctas(p.E), kRouterSplits), dim3(128), smem_bytes(p.M, p.H), s, p);
}

void final_rmsnorm_bf16(const DecodeResidual& res, const int32_t* rows, const uint16_t* norm_w, float eps,
                        uint16_t* xn, int S, int H, cudaStream_t s) {
  if (S > 0) final_norm_k<<<S, 256, 0, s>>>(res, rows, norm_w, eps, xn, H);
}

void dense_lm_head(const uint16_t* xn, const DenseWeight& w, float* logits, int M, int V, int H, cudaStream_t s) {
  check_m(M);
  check_k("lm_head decode", H);
  with_format(w.fmt, [&](auto wf) {
    constexpr auto k = gemv_k<body::kLmHeadSplit, 4, decltype(wf)::value>;
    static std::atomic<unsigned long long> ready{0};
    once_per_device(ready, [] { allow_dynamic_smem(k); });
    launch_pdl(k, dim3(body::tiles_ctas((V + 15) / 16, body::kLmHeadSplit)), dim3(128), smem_bytes(M, H), s,
               GemvParams{xn, w, nullptr, logits, M, V, H, false}, CtaTrace{});
  });
}

void bf16_gemv_small_m(const uint16_t* x, const uint16_t* w, const uint16_t* bias, float* y, int M, int N, int K,
                       cudaStream_t s) {
  check_m(M);
  if (K % 32) throw_error("bf16_gemv_small_m: K=" + std::to_string(K) + " must be a multiple of 32");
  static std::atomic<unsigned long long> ready{0};
  once_per_device(ready, [] { allow_dynamic_smem(gemv_k<4, 4, DF::kBf16>); });
  launch_pdl(gemv_k<4, 4, DF::kBf16>, dim3((N + 15) / 16), dim3(128), smem_bytes(M, K), s,
             GemvParams{x, bf16_weight(w), bias, y, M, N, K, false}, CtaTrace{});
}

void mxfp4_count_bad_scales(const uint8_t* scales, size_t n, unsigned long long* bad, cudaStream_t s) {
  count_bad_scales_k<<<264, 256, 0, s>>>(scales, n, bad);
}

}  // namespace mx::cuda
