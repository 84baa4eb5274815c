// The reference gpt-oss forward pass on the CPU: fp32 arithmetic on the checkpoint's bf16 and
// MXFP4 weights, one token at a time against a paged fp32 KV cache. It is the oracle every
// GPU kernel is checked against, so it favours plain code over speed (the big matvecs are
// split over a thread pool). Intermediate activations stay fp32 (the GPU path rounds
// activations to bf16 between kernels; tolerances account for that).
#pragma once
#include <cstdint>
#include <vector>

#include "core/parallel.h"
#include "model/config.h"
#include "model/weights.h"

namespace mx {

// KV storage as the CUDA runner lays it out: K and V arrays of [num_blocks][block_size][num_kv_heads
// * head_dim] fp32, one per (full, sliding) layer pair: the j-th full layer and the j-th sliding layer
// share array j, the full one through the block table and the sliding one through the sliding table,
// so a block handed to both tables at once would corrupt the results (the tests rely on that).
struct CpuKvCache {
  int block_size = 16;
  int num_blocks = 0;
  // FP8 KV (--kv-cache-dtype fp8): each K and V value is rounded to E4M3 when written (a scale of
  // one, core/fp8.h); the values stay fp32 here.
  bool fp8 = false;
  std::vector<std::vector<float>> k, v;  // [array]
  std::vector<int> array_of;             // [layer]
  void allocate(const ModelConfig& cfg, int block_size, int num_blocks);
};

class CpuReference {
 public:
  CpuReference(const ModelConfig& cfg, const ModelWeights& w, ThreadPool* pool);

  // Computes token `token` at position `pos` of a sequence whose KV blocks are `block_table` (full
  // layers) and `sliding_table` (sliding-window layers; may be null without them). Positions < pos
  // must already be in the cache; writes its K/V. If logits != nullptr, writes the fp32 logits
  // [vocab_size] of this position.
  void forward_token(int32_t token, int pos, const int32_t* block_table, const int32_t* sliding_table, CpuKvCache& kv,
                     float* logits);
  // The smallest gap, over the layers of the last forward_token, between the k-th and the (k+1)-th router
  // logit: below the activations' rounding (bf16 on the GPU) another implementation may route the token
  // to the other expert, a legitimate difference in that position's output.
  float route_margin() const { return route_margin_; }

 private:
  void matvec_bf16(const uint16_t* w, const uint16_t* bias, const float* x, float* y, int rows, int cols);
  void rmsnorm(const float* x, const uint16_t* gamma, float* y) const;
  void attention(int layer, int pos, const int32_t* table, CpuKvCache& kv);
  void moe(int layer);

  const ModelConfig& cfg_;
  const ModelWeights& w_;
  ThreadPool* pool_;
  std::vector<float> inv_freq_;
  float concentration_ = 1.0f;
  // Scratch, sized once.
  std::vector<float> x_, t_, q_, k_, v_, attn_, proj_, router_, h_, act_, y_, moe_out_, expert_w_;
  std::vector<int> expert_idx_;
  float route_margin_ = 0.f;
  std::vector<float> scores_;  // attention scores of one head; grows to the longest context seen
};

}  // namespace mx
