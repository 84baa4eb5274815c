// Dense (BF16-weight) decode kernels: qkv + RoPE + KV write, o-proj + residual, router, lm_head, as
// one grid each (bodies in gemv_body.cuh).
#include "kernels/decode/decode_gemv.h"

#include "kernels/common/cuda_check.h"
#include "kernels/common/device_math.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/decode/gemv_body.cuh"

namespace mx::cuda {
namespace {
using namespace mma;
using body::GemvParams;

__global__ void __launch_bounds__(128) qkv_rope_kv_k(QkvRopeKvParams p) {
  __shared__ float red[body::kWarps * 32 * 4];
  body::qkv_rope_kv<body::kQkvSplit>(p, blockIdx.x, red, PdlWait{});
}

__global__ void __launch_bounds__(128) router_k(RouterParams p) {
  __shared__ float red[body::kWarps * 32 * 4];
  body::router<body::kRouterSplit>(p, blockIdx.x, blockIdx.y, red, PdlWait{});
}

template <int KSPLIT, int U = 4>
__global__ void __launch_bounds__(128) gemv_k(GemvParams p) {
  __shared__ float red[body::kWarps * 32 * 4];
  body::gemv<KSPLIT, U>(p, blockIdx.x, red, PdlWait{});
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

}  // namespace

void bf16_qkv_rope_kv(const QkvRopeKvParams& p, cudaStream_t s) {
  check_m(p.M);
  if (p.D % 16 || p.H % 32) throw_error("qkv decode: head_dim must be a multiple of 16 and hidden of 32");
  static bool init = (allow_dynamic_smem(qkv_rope_kv_k), true);
  (void)init;
  launch_pdl(qkv_rope_kv_k, dim3(body::qkv_ctas(p.Hq, p.Hkv, p.D)), dim3(128), smem_bytes(p.M, p.H), s, p);
}

void bf16_o_proj_residual(const OProjParams& p, cudaStream_t s) {
  check_m(p.M);
  static bool init = (allow_dynamic_smem(gemv_k<body::kOprojSplit, body::kOprojU>), true);
  (void)init;
  launch_pdl(gemv_k<body::kOprojSplit, body::kOprojU>, dim3(body::oproj_ctas(p.N)), dim3(128), smem_bytes(p.M, p.K), s,
             GemvParams{p.attn, p.w, p.bias, p.x, p.M, p.N, p.K, true});
}

void bf16_router(const RouterParams& p, cudaStream_t s) {
  check_m(p.M);
  static bool init = (allow_dynamic_smem(router_k), true);
  (void)init;
  launch_pdl(router_k, dim3(body::router_ctas(p.E), kRouterSplits), dim3(128), smem_bytes(p.M, p.H), s, p);
}

void final_rmsnorm_bf16(const DecodeResidual& res, const int32_t* rows, const uint16_t* norm_w, float eps,
                        uint16_t* xn, int S, int H, cudaStream_t s) {
  if (S > 0) final_norm_k<<<S, 256, 0, s>>>(res, rows, norm_w, eps, xn, H);
}

void bf16_lm_head(const uint16_t* xn, const uint16_t* w, float* logits, int M, int V, int H, cudaStream_t s) {
  check_m(M);
  static bool init = (allow_dynamic_smem(gemv_k<body::kLmHeadSplit>), true);
  (void)init;
  launch_pdl(gemv_k<body::kLmHeadSplit>, dim3(body::tiles_ctas((V + 15) / 16, body::kLmHeadSplit)), dim3(128),
             smem_bytes(M, H), s, GemvParams{xn, w, nullptr, logits, M, V, H, false});
}

void bf16_gemv_small_m(const uint16_t* x, const uint16_t* w, const uint16_t* bias, float* y, int M, int N, int K,
                       cudaStream_t s) {
  check_m(M);
  if (K % 32) throw_error("bf16_gemv_small_m: K=" + std::to_string(K) + " must be a multiple of 32");
  static bool init = (allow_dynamic_smem(gemv_k<4>), true);
  (void)init;
  launch_pdl(gemv_k<4>, dim3((N + 15) / 16), dim3(128), smem_bytes(M, K), s, GemvParams{x, w, bias, y, M, N, K, false});
}

void mxfp4_count_bad_scales(const uint8_t* scales, size_t n, unsigned long long* bad, cudaStream_t s) {
  count_bad_scales_k<<<264, 256, 0, s>>>(scales, n, bad);
}

}  // namespace mx::cuda
