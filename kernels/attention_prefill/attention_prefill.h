// Causal flash-attention prefill for gpt-oss: head_dim 64, GQA (Hq / Hkv heads), per-head sink
// logits in the softmax denominator, optional sliding window. bf16 tensor cores (mma.sync m16n8k16)
// for Q K^T and P V, fp32 online softmax in registers; Hq / Hkv <= 8. Keys that no query of a tile
// may see are never loaded, so their blocks may hold anything (given-back sliding blocks).
//
// KV cache (kv_cache.h; the decode path owns the KV write): bf16 rows of Hkv * 64 values,
//   block_table[i] = physical block holding positions [i * block_size, (i+1) * block_size).
// The chunk's own K/V must already be in the cache (written by the rope/KV kernel) before launch.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "kernels/common/kv_cache.h"

namespace mx::cuda {

struct AttnPrefillParams {
  const uint16_t* q = nullptr;        // bf16, query t head h at q[t * q_stride + h * 64] (after RoPE)
  int q_stride = 0;                   // 5120 when reading the fused QKV buffer
  KvLayer kv;                         // the layer's paged cache (bf16)
  const int32_t* block_table = nullptr;
  const uint16_t* sinks = nullptr;    // bf16 [Hq]
  uint16_t* out = nullptr;            // bf16 [T, Hq * 64]
  int T = 0;                          // queries at positions [start, start + T)
  int start = 0;                      // keys [0, start + T) are in the cache
  int Hq = 64, Hkv = 8;
  int window = 0;                     // 0 = full causal; 128 = keys p-127..p
  float scale = 0.125f;
};
void attention_prefill_bf16(const AttnPrefillParams& p, cudaStream_t s);

// CPU reference (double softmax), same inputs on the host; out fp32 [T, Hq * 64].
void attention_prefill_ref(const AttnPrefillParams& p, float* out);

}  // namespace mx::cuda
