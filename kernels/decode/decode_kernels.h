// Small kernels shared by the decode and prefill paths: embedding gather, RMSNorm to bf16, RoPE +
// KV-cache write for prefill, top-k routing for prefill, greedy pick, dummy-weight fill.
// Launchers only; device code lives in decode_kernels.cu. All pointers are device pointers.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

#include "kernels/common/kv_cache.h"

namespace mx::cuda {

// x[m, :] = embed[tokens[m], :], or embed[picked[j], :] where tokens[m] = -(j + 1) < 0 (decode ahead: the
// token the previous step picked on the device for its sampled row j).
void launch_embed_bf16(const uint16_t* embed, const int32_t* tokens, float* x, int M, int H, cudaStream_t s,
                       const int32_t* picked = nullptr);
// y[i, :] = bf16(gamma * x[rows ? rows[i] : i, :] / rms)  (fp32 stats)
void launch_rmsnorm_bf16(const float* x, const int32_t* rows, const uint16_t* gamma, uint16_t* y, int M, int H,
                         float eps, cudaStream_t s);
// Rotates q (in place) and k of the fp32 qkv rows with YaRN RoPE, also writes q as bf16
// (q_bf16 [M, Hq * D]) and k, v to the paged cache (bf16 or fp8, kv_cache.h).
struct RopeKvParams {
  float* qkv;               // [M, (Hq + 2 Hkv) D]
  const int32_t* pos;       // [M]
  const int32_t* slot;      // [M] cache row index (block * block_size + offset)
  const float* inv_freq;    // [D / 2]
  float concentration;
  KvLayer kv;               // the layer's paged cache (bf16 or fp8)
  uint16_t* q_bf16;         // [M, Hq * D]
  int M, Hq, Hkv, D;
};
void launch_rope_kv(const RopeKvParams& p, cudaStream_t s);
// Top-k over router logits [M, E] (lowest index wins ties), softmax over the k.
void launch_topk_softmax(const float* logits, int32_t* idx, float* w, int M, int E, int k, cudaStream_t s);
// Per row (stride V), over ids [0, V_limit): the greedy pick (lowest id on ties), or, where
// inv_temp[row] > 0, a sample from softmax(logits * inv_temp) by the Gumbel-max trick: the argmax of
// logits * inv_temp - log(-log(u_i)), u_i a uniform derived from (key[row], i). out_lp = log-softmax of
// the raw logits at the pick. out_tok [S], out_lp [S]; inv_temp / key [S] or null (all greedy).
// scratch: argmax_scratch_floats(S, V_limit) floats. tok_dev (optional, device) gets a copy of out_tok.
// Up to 128 chunks of >= 1024 logits: a 201k row is ~6 logits a thread, loaded in one round.
constexpr int kArgmaxMaxChunks = 128;
constexpr size_t kArgmaxPartFloats = 5;  // a chunk's partial: best score, its id, max, sum, its logit
inline int argmax_chunks(int V_limit) { return std::clamp((V_limit + 1023) / 1024, 1, kArgmaxMaxChunks); }
// A vocabulary split over `ranks` (tensor parallelism): every rank takes the same chunk count for its
// slice of slice_rows ids, so the gathered partials line up.
inline int argmax_chunks_split(int slice_rows, int ranks) {
  return std::clamp((slice_rows + 1023) / 1024, 1, kArgmaxMaxChunks / ranks);
}
// Enough for one GPU's pick over V_limit ids and for a split one's gathered partials.
inline size_t argmax_scratch_floats(int S, int V_limit, int ranks = 1) {
  const int per_row = std::max(argmax_chunks(V_limit), ranks * argmax_chunks_split((V_limit + ranks - 1) / ranks, ranks));
  return size_t(S) * per_row * kArgmaxPartFloats;
}
void launch_argmax_logprob(const float* logits, int S, int V, int V_limit, int32_t* out_tok, float* out_lp,
                           float* scratch, cudaStream_t s, const float* inv_temp = nullptr,
                           const uint64_t* key = nullptr, int32_t* tok_dev = nullptr);
// The same pick over a vocabulary split by tensor parallelism, in two halves around an all-gather:
// argmax_parts writes this rank's partials of ids [id0, id0 + V_limit) (logits of row r at lg + r * stride
// + (id - id0); the Gumbel noise keyed by the global id, so the sample is the one-GPU sample) to
// parts [S][nchunks] (nchunks = argmax_chunks_split); argmax_merge reads every rank's, [ranks][S][nchunks].
void launch_argmax_parts(const float* lg, int S, int stride, int V_limit, int id0, int nchunks, float* parts,
                         cudaStream_t s, const float* inv_temp = nullptr, const uint64_t* key = nullptr);
void launch_argmax_merge(const float* parts, int ranks, int S, int nchunks, int32_t* out_tok, float* out_lp,
                         cudaStream_t s, int32_t* tok_dev = nullptr);
// Logit adjustments before the pick (model/logit_adjust.h: a logit_bias, -inf for a banned token, the
// penalties): adj[0] entries, then kAdjustWords words each (s, id, add, rep, sub as float bits; on the
// device, so a captured graph reads each step's list), applied to logits[(s - s0) * stride + (id - id0)]
// for s in [s0, s0 + S) and id in [id0, id0 + n_ids) (a rank's vocabulary slice). One entry an (s, id).
constexpr int kAdjustWords = 5;
void launch_adjust_logits(float* logits, int stride, int id0, int n_ids, const int32_t* adj, int s0, int S,
                          cudaStream_t s);
// Constrained rows (structured output's allowed ids), after the adjustments: mask[0] rows (on the device),
// their row indices in mask[1, 1 + slots), then each one's bits (`words` uint32, bit id % 32 of word id / 32)
// from mask + 1 + slots; every id of the slice [id0, id0 + n_ids) whose bit is clear gets -inf.
void launch_mask_logits(float* logits, int stride, int id0, int n_ids, const int32_t* mask, int slots, int words,
                        int s0, int S, cudaStream_t s);
// Random bf16 in [-scale, scale) / random bytes, generated on the device (dummy weights).
void launch_fill_random_bf16(uint16_t* p, size_t n, float scale, float offset, uint64_t seed, cudaStream_t s);
void launch_fill_random_u8(uint8_t* p, size_t n, uint8_t lo, uint8_t span, uint64_t seed, cudaStream_t s);

}  // namespace mx::cuda
