// Decode-path kernels (M = 1..max tokens per step), fp32 activations, bf16 / MXFP4 weights.
// First correct version: warp-per-row GEMVs with 16-byte weight loads; MXFP4 decoded in registers.
// Launchers only; device code lives in decode_kernels.cu. All pointers are device pointers.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace mx::cuda {

// x[m, :] = embed[tokens[m], :]
void launch_embed_bf16(const uint16_t* embed, const int32_t* tokens, float* x, int M, int H, cudaStream_t s);
// y[i, :] = gamma * x[rows ? rows[i] : i, :] / rms  (fp32 stats)
void launch_rmsnorm_f32(const float* x, const int32_t* rows, const uint16_t* gamma, float* y, int M, int H,
                        float eps, cudaStream_t s);
// y[m, r] (+)= W[r, :] . x[m, :] + b[r]; W bf16 [N, K] (K % 8 == 0), x fp32 [M, K], y stride ldy.
void launch_gemv_bf16(const uint16_t* W, const uint16_t* b, const float* x, float* y, int M, int N, int K, int ldy,
                      bool accumulate, cudaStream_t s);
// Rotates q (in place in qkv) and k with YaRN RoPE, writes k, v to the paged bf16 cache.
struct RopeKvParams {
  float* qkv;               // [M, (Hq + 2 Hkv) D]
  const int32_t* pos;       // [M]
  const int32_t* slot;      // [M] cache row index (block * block_size + offset)
  const float* inv_freq;    // [D / 2]
  float concentration;
  uint16_t* k_cache;        // [rows, Hkv * D]
  uint16_t* v_cache;
  int M, Hq, Hkv, D;
};
void launch_rope_kv(const RopeKvParams& p, cudaStream_t s);
// Decode/prefill attention over the paged cache, GQA, sinks, optional sliding window.
struct AttnParams {
  const float* qkv;          // q read from [M, qkv_dim]
  const uint16_t* k_cache;
  const uint16_t* v_cache;
  const int32_t* pos;        // [M]
  const int32_t* bt_off;     // [M] offset of the token's sequence block table in `block_tables`
  const int32_t* block_tables;
  const uint16_t* sinks;     // [Hq] bf16
  float* out;                // [M, Hq * D]
  int M, Hq, Hkv, D, block_size, window;  // window 0 = full
};
void launch_attention(const AttnParams& p, cudaStream_t s);
// Top-k over router logits [M, E] (lowest index wins ties), softmax over the k.
void launch_topk_softmax(const float* logits, int32_t* idx, float* w, int M, int E, int k, cudaStream_t s);
// act[m, j, i] = SwiGLU of FC1 rows (2i, 2i+1) of expert idx[m, j] over x[m, :]; MXFP4 [E, 2I, H/32, 16].
struct MoeFc1Params {
  const uint8_t* blocks; const uint8_t* scales; const uint16_t* bias;
  const float* x; const int32_t* idx; float* act;
  int M, k, H, I; float alpha, limit;
};
void launch_moe_fc1_swiglu(const MoeFc1Params& p, cudaStream_t s);
// x[m, h] += sum_j w[m, j] * (down[idx[m, j]][h, :] . act[m, j, :] + bias)
struct MoeFc2Params {
  const uint8_t* blocks; const uint8_t* scales; const uint16_t* bias;
  const float* act; const int32_t* idx; const float* w; float* x;
  int M, k, H, I;
};
void launch_moe_fc2_combine(const MoeFc2Params& p, cudaStream_t s);
// Per row: argmax (lowest id on ties) and its log-softmax. out_tok [S], out_lp [S].
void launch_argmax_logprob(const float* logits, int S, int V, int32_t* out_tok, float* out_lp, cudaStream_t s);
// Random bf16 in [-scale, scale) / random bytes, generated on the device (dummy weights).
void launch_fill_random_bf16(uint16_t* p, size_t n, float scale, float offset, uint64_t seed, cudaStream_t s);
void launch_fill_random_u8(uint8_t* p, size_t n, uint8_t lo, uint8_t span, uint64_t seed, cudaStream_t s);

}  // namespace mx::cuda
