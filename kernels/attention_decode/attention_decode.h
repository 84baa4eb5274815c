// Decode attention over the paged KV cache (bf16 or fp8, kv_cache.h): one CTA per (KV head, head
// group, token, key split) handles heads_per_cta of the 8 query heads of its GQA group, which share
// its K/V loads. Splits write (max, sum, output) partials; the last CTA of a (token, KV head, head
// group), found by an atomic ticket, merges them and adds the sink exp(sink - max) to the denominator
// exactly once.
// Sliding-window layers simply start at pos - window + 1. A split covers at least 128 keys, so
// sliding-window layers and short contexts run as one split that writes its output directly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

#include "kernels/common/kv_cache.h"

#include "kernels/common/cta_trace.h"

namespace mx::cuda {

constexpr int kAttnDecodeSplits = 32;  // 2049 keys: 17 splits of 128, one 32-key chunk per warp
constexpr int kAttnDecodeGroup = 8;  // query heads per KV head (gpt-oss: 64 / 8)

struct AttnDecodeParams {
  const float* q = nullptr;             // fp32, query of token r at q + r * q_stride, RoPE applied
  int q_stride = 0;                     // Hq * D, or the fused qkv row length
  const int32_t* rows = nullptr;        // optional [M]: query i is token rows[i] (q, pos, bt_off, out)
  KvLayer kv;                           // the layer's paged cache (bf16 or fp8, kv_cache.h)
  const int32_t* pos = nullptr;         // [M] position of each query; keys [lo, pos] are in the cache
  const int32_t* bt_off = nullptr;      // [M] offset of each query's block table in block_tables
  const int32_t* block_tables = nullptr;
  const uint16_t* sinks = nullptr;      // bf16 [Hq]
  uint16_t* out = nullptr;              // bf16 [tokens, Hq * D]
  float* partials = nullptr;            // attention_decode_scratch_floats(M, Hkv, D)
  int* tickets = nullptr;               // [M * Hkv * 8], zero before the first launch; left zero
  // attention_decode_mma only: its splits' partials as tagged words (attention_decode_mma_scratch_words),
  // zero before the first launch.
  unsigned long long* mma_partials = nullptr;
  int M = 1, Hq = 64, Hkv = 8, D = 64;
  int window = 0;                       // 0 = full attention
  // Query heads per CTA (8, 4, 2 or 1): fewer shorten each CTA's chain of dependent math
  // (attention_decode_body.cuh); see attention_decode_heads_per_cta.
  int heads_per_cta = 8;
  // attention_decode_mma only: the grid's key splits a query, 0 = kAttnMmaSplits; each query is cut into
  // at most this many (attention_decode_mma_splits(keys, splits)). A caller that knows every query's keys
  // may pass the most attention_decode_mma_splits gives, so no CTA launches idle, or fewer (longer splits).
  int splits = 0;
  // attention_decode_mma only: key rows a pass holds (a multiple of 32, at least 32, at most
  // kAttnMmaKeys; 0 = kAttnMmaKeys). Fewer rows need less shared memory, so more CTAs share an SM; a
  // launch with it set is not overlapped by PDL and takes the SM's whole carveout.
  int pass_keys = 0;
  // True when each query's own key is the only one the kernel before wrote (one token per sequence
  // in the step): the older keys are then read before pdl_wait.
  bool kv_stable = false;
  CtaTrace trace;                       // diagnostics (cta_trace.h)
};

inline size_t attention_decode_scratch_floats(int M, int Hkv, int D) {
  return size_t(M) * Hkv * kAttnDecodeSplits * (2 * kAttnDecodeGroup + kAttnDecodeGroup * D);
}

// The engine's choice of AttnDecodeParams::heads_per_cta. A sliding layer (128 keys, one split) runs one
// CTA per query head: many short CTAs instead of a few that each do 8 heads. A full layer at depth has
// many splits a KV head; there 4 heads a CTA is best: more CTAs do not fit beside the qkv kernel and start
// late, fewer heads lengthen each CTA's chain of math (docs/perf.md).
inline int attention_decode_heads_per_cta(int window) { return window > 0 ? 1 : 4; }

// D must be 16 or 64 and Hq == 8 * Hkv.
void attention_decode(const AttnDecodeParams& p, cudaStream_t s);

// The same attention on tensor cores for full-context layers (attention_decode_mma.cu): one CTA per (KV
// head, token, split) with all 8 query heads, up to kAttnMmaSplits splits of at least 64 keys (the launch's
// splits: fewer for wide steps, attention_decode_mma_wide_splits), each split's K/V
// copied into shared memory (kAttnMmaKeys rows at a time; kv_stable: before the PDL wait). Any context
// length is correct; past attention_decode_mma_max_keys() a split takes several passes, and the register
// kernel's 32 splits are the faster choice. Needs D == 64, Hq == 8 * Hkv, and the launches' uniform
// shared-memory carveout (pdl.cuh) to fit beside the qkv kernel.
constexpr int kAttnMmaSplits = 8;
constexpr int kAttnMmaKeys = 320;  // 80 KB of K and V rows
// Per (token, KV head): each split's partial as 64-bit words (launch tag << 32 | float bits), max and sum
// of the 8 heads then the output [8][64], and after the splits the count of finished launches (the tag).
constexpr size_t kAttnMmaPartialWords = 2 * kAttnDecodeGroup + kAttnDecodeGroup * 64;
constexpr size_t kAttnMmaRecordWords = kAttnMmaSplits * kAttnMmaPartialWords + 2;
inline size_t attention_decode_mma_scratch_words(int M, int Hkv) { return size_t(M) * Hkv * kAttnMmaRecordWords; }
constexpr int attention_decode_mma_max_keys() { return kAttnMmaSplits * kAttnMmaKeys; }
constexpr int kAttnMmaMinKeysPerSplit = 64;  // short contexts take fewer splits
// A query over `keys` keys cut into at most `splits` splits: keys a split (whole 32-key chunks) and
// splits. The kernel cuts each query for its grid's splits; the launch's splits being the most any of its
// queries takes at kAttnMmaSplits, every query is cut as at kAttnMmaSplits.
__host__ __device__ constexpr int attention_decode_mma_keys_per_split(int keys, int splits = kAttnMmaSplits) {
  const int even = ((keys + splits - 1) / splits + 31) / 32 * 32;
  return even > kAttnMmaMinKeysPerSplit ? even : kAttnMmaMinKeysPerSplit;
}
__host__ __device__ constexpr int attention_decode_mma_splits(int keys, int splits = kAttnMmaSplits) {
  const int per = attention_decode_mma_keys_per_split(keys, splits);
  return (keys + per - 1) / per;
}
// A wide step launches rows x KV heads x splits CTAs: splits are capped so that the launch has about this
// many CTAs (each split's partial is written, and merged by the last; many rows fill the GPU without them).
constexpr int kAttnMmaWideCtas = 1024;
inline int attention_decode_mma_wide_splits(int rows, int Hkv) {
  const int cap = kAttnMmaWideCtas / (rows * Hkv);
  return cap < 1 ? 1 : cap > kAttnMmaSplits ? kAttnMmaSplits : cap;
}
void attention_decode_mma(const AttnDecodeParams& p, cudaStream_t s);

}  // namespace mx::cuda
