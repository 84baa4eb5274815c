// Decode-step kernels for M = 1..8 tokens (one mma n=8 column per token), fp32 residual stream. The
// experts are MXFP4 in their checkpoint layout; the dense kernels (dense_*) take qkv, o-proj and lm_head
// as bf16, MXFP4 or FP8 (dense_weight.h, --mxfp4-layers / --fp8-layers). A layer is six launches:
//   dense_qkv_rope_kv  (rmsnorm prologue, bias, YaRN RoPE, K/V written to the paged cache)
//   attention_decode  (attention_decode.h)
//   dense_o_proj_residual
//   bf16_router       (rmsnorm prologue, also writes the normalized row for the experts)
//   mxfp4_moe_fc1_swiglu (top-4 + softmax prologue, bias, clamped SwiGLU)
//   mxfp4_moe_fc2     (bias, routing weight; per-slot outputs summed by the next consumer's prologue)
//   (one token on sm_89+: both on FP8 tensor cores, e4m3_split.cuh, and no router kernel: the o-proj
//   leaves the router's sums, dense_o_proj_router_m1, so a layer is five launches)
// Then final_rmsnorm_bf16 + dense_lm_head + argmax. All pointers are device pointers.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "kernels/common/cta_trace.h"
#include "kernels/common/dense_weight.h"
#include "kernels/common/kv_cache.h"

namespace mx::cuda {

constexpr int kDecodeMaxTokens = 8;
constexpr int kDecodeTopK = 4;
constexpr int kRouterSplits = 8;  // K slices of the router GEMV, summed by the expert kernels
// Fixed-point scale of the one-token router's partial sums (OProjRouterParams): integer adds are exact,
// so the sums do not depend on the order the CTAs finish in.
constexpr float kRouteAccScale = 268435456.f;  // 2^28

// Residual input of a norm prologue: x + sum_j y_slot[:, j] (y_slot null after attention).
struct DecodeResidual {
  const float* x = nullptr;       // fp32 [M, H]
  const float* y_slot = nullptr;  // fp32 [M, 4, H] weighted expert outputs, or null
  float* x_out = nullptr;         // receives the summed residual (may be null)
};

struct QkvRopeKvParams {
  DecodeResidual res;
  const uint16_t* norm_w = nullptr;  // [H]
  float eps = 1e-5f;
  DenseWeight w;                     // [(Hq + 2 Hkv) D, H]  q rows, then k, then v
  const uint16_t* bias = nullptr;
  const int32_t* pos = nullptr;      // [M]
  const int32_t* slot = nullptr;     // [M] cache row (block * block_size + offset)
  const float* inv_freq = nullptr;   // [D / 2]
  float concentration = 1.f;
  float* q_out = nullptr;            // fp32 [M, Hq * D], rotated
  KvLayer kv;                        // the layer's paged cache (bf16 or fp8, kv_cache.h)
  int M = 1, H = 0, Hq = 0, Hkv = 0, D = 64;
  // One token, full attention: prefetch the older K / V blocks into L2 while the weights stream. The
  // attention CTAs that get an SM only as this kernel's leave then read them from L2 (docs/perf.md).
  bool kv_prefetch = false;
  const int32_t* block_tables = nullptr;
  const int32_t* bt_off = nullptr;   // [M]
  CtaTrace trace;                    // diagnostics (cta_trace.h)
};
void dense_qkv_rope_kv(const QkvRopeKvParams& p, cudaStream_t s);

// x[m, :] += W . attn[m, :] + bias
struct OProjParams {
  const uint16_t* attn = nullptr;  // bf16 [M, K]
  DenseWeight w;                   // [N, K]
  const uint16_t* bias = nullptr;
  float* x = nullptr;              // fp32 [M, N]
  int M = 1, N = 0, K = 0;
  CtaTrace trace;
};
void dense_o_proj_residual(const OProjParams& p, cudaStream_t s);

// One token: the o-proj above, and the router folded into it (RMSNorm is linear up to 1 / rms), so the
// expert kernels route without a router kernel. With h the new residual and r over the CTA's 16 rows:
//   route_acc[e] += round(2^28 * sum_r W[e, r] * gamma[r] * h[r])   (int64, exact adds)
//   ss_part[tile] = sum_r h[r]^2
// route_acc must be zero before the launch. MoeDecodeParams::route_acc consumes them.
struct OProjRouterParams {
  OProjParams o;                       // M must be 1
  const uint16_t* norm_w = nullptr;    // the MoE's RMSNorm gamma [N]
  const uint16_t* router_w = nullptr;  // [E, N]
  long long* route_acc = nullptr;      // [E]
  float* ss_part = nullptr;            // [oproj_router_tiles(N)]
  int E = 0;                           // <= 128
};
inline int oproj_router_tiles(int N) { return (N + 15) / 16; }
void dense_o_proj_router_m1(const OProjRouterParams& p, cudaStream_t s);

// logits = W . rmsnorm(res[m]) + bias as kRouterSplits partial sums [kRouterSplits, M, E] (the bias in
// slice 0); xn = the normalized rows (bf16 [M, H]).
struct RouterParams {
  DecodeResidual res;
  const uint16_t* norm_w = nullptr;
  float eps = 1e-5f;
  const uint16_t* w = nullptr;     // [E, H]
  const uint16_t* bias = nullptr;
  float* logits = nullptr;         // fp32 [kRouterSplits, M, E]
  uint16_t* xn = nullptr;          // bf16 [M, H]
  int M = 1, E = 0, H = 0;
  CtaTrace trace;
};
void bf16_router(const RouterParams& p, cudaStream_t s);

// Experts of one layer, MXFP4: blocks [E, N, K/32, 16], scales [E, N, K/32], bias bf16 [E, N].
struct MoeDecodeParams {
  const float* router_logits = nullptr;  // fp32 [router_splits, M, E] partials; top-4 + softmax per CTA
  int router_splits = 1;
  const uint8_t* fc1_blocks = nullptr; const uint8_t* fc1_scales = nullptr; const uint16_t* fc1_bias = nullptr;
  const uint8_t* fc2_blocks = nullptr; const uint8_t* fc2_scales = nullptr; const uint16_t* fc2_bias = nullptr;
  const uint16_t* xn = nullptr;    // bf16 [M, H] normalized input
  uint16_t* act = nullptr;         // bf16 [M, 4, I] SwiGLU output per (token, slot)
  float* y_slot = nullptr;         // fp32 [M, 4, H] = w * (W2 . act + b2) per (token, slot)
  int M = 1, E = 0, H = 0, I = 0;
  float alpha = 1.702f, limit = 7.0f;
  // One token on the FP8 path with the router folded into the o-proj (dense_o_proj_router_m1): routing
  // from route_acc / ss_part instead of router_logits, and the input normalized from h instead of xn.
  const long long* route_acc = nullptr;   // [E]
  const float* ss_part = nullptr;         // [ss_parts]
  int ss_parts = 0;
  const uint16_t* router_bias = nullptr;  // [E]
  const uint16_t* norm_w = nullptr;       // [H]
  const float* h = nullptr;               // fp32 [H]: the residual the norm reads
  float eps = 1e-5f;
  // Expert parallelism: only experts [expert_lo, expert_hi) have weights here (the weight and bias pointers
  // are offset so that an expert's model id indexes them); CTAs of other experts exit at once, leaving
  // their y_slot rows to the caller (zeroed, then summed over the GPUs).
  int expert_lo = 0, expert_hi = 1 << 30;
  CtaTrace trace;   // diagnostics (cta_trace.h): both kernels
};
void mxfp4_moe_fc1_swiglu(const MoeDecodeParams& p, cudaStream_t s);
void mxfp4_moe_fc2(const MoeDecodeParams& p, cudaStream_t s);
// True when these kernels take the one-token FP8 path for M tokens (M == 1 on sm_89+), the path that
// can route from route_acc.
bool mxfp4_moe_one_token_fp8(int M);

// xn[i] = bf16(rmsnorm(res[rows[i]])) for the S sampled rows.
void final_rmsnorm_bf16(const DecodeResidual& res, const int32_t* rows, const uint16_t* norm_w, float eps,
                        uint16_t* xn, int S, int H, cudaStream_t s);

// logits[m, v] = W[v, :] . xn[m, :] (fp32), M <= 8.
void dense_lm_head(const uint16_t* xn, const DenseWeight& w, float* logits, int M, int V, int H, cudaStream_t s);

// Generic M <= 8 bf16 GEMV for tests and odd uses: y[m, n] = W . x[m] + bias (x bf16 [M, K]).
void bf16_gemv_small_m(const uint16_t* x, const uint16_t* w, const uint16_t* bias, float* y, int M, int N, int K,
                       cudaStream_t s);

// Counts MXFP4 scale bytes above 128 (2^1), which the decode kernels cannot represent; result in *bad.
void mxfp4_count_bad_scales(const uint8_t* scales, size_t n, unsigned long long* bad, cudaStream_t s);

}  // namespace mx::cuda
