// Everything the CUDA runner allocates, planned once at start-up (nothing allocates in the step loop):
// the activation arena, the step metadata buffers, and the paged KV cache with its format.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/common/kv_cache.h"
#include "kernels/decode/decode_step.h"
#include "kernels/engine/cuda_runner.h"
#include "kernels/engine/device_model.h"

namespace mx {

// The activation arena, in order (see bind_activations).
struct Activations {
  float *xa, *xb;                  // fp32 residual stream [T, H] (the decode path ping-pongs between them)
  float *qkv, *router, *ew, *ysl;  // qkv rows, router logits, top-k weights, per-slot expert outputs
  float *logits, *scratch, *inv_freq, *attn_part;  // scratch: S * 8 bytes (the scale check)
  uint16_t *xn, *qbf, *attn, *act_bf, *xs;  // bf16: normed rows, q, attention out, SwiGLU out, final norm
  int32_t *eidx, *tickets;
  // grouped-MoE routing scratch (prefill)
  int32_t *moe_counts, *moe_offsets, *moe_sorted_tok, *moe_sorted_slot, *moe_tile_expert, *moe_tile_row0,
      *moe_num_tiles;
  float* moe_sorted_w;
  float* argmax_part;                    // the pick's per-chunk partials
  unsigned* step_counters;               // ready counters of the persistent decode step
  cuda::DecodeStepLayer* step_layers;    // its per-layer pointers
  long long* route_acc;                  // one-token router sums [layers][E] (OProjRouterParams)
  float* ss_part;                        // and the sums of squares of the current layer
  unsigned long long* attn_mma_part;     // attention_decode_mma's tagged partials (max(8, S) rows)
  int32_t* picked;                       // [S] the last step's picks on the device (decode ahead's input)
  uint16_t* wdq;                         // bf16 scratch of quantized dense weights (dense_scratch_elems)
  float* logits_tp;                      // tensor parallel: every rank's vocabulary slice [ranks][S][slice]
  float* tp_part;                        // tensor parallel, ranks > 0: the decode o-proj's partial rows [8, H], zero
  // A prompt's log-prob rows, MemoryPlan::prompt_rows at a time [rows, V]: ysl's memory, free once a prefill
  // forward is over; on the decode path an 8-token chunk's rows are normed (reading ysl) before their
  // lm_head writes here, in one launch.
  float* prompt_logits;
};

// One step's metadata: int32 token arrays, then (8-byte aligned) the sampled rows' keys and filters,
// then the block tables. One pinned host block and its device mirror, copied in one H2D copy.
struct StepMeta {
  int32_t *tok, *pos, *slot, *bt_off, *srow, *srow_local, *decode_rows, *bt;
  // The sliding-window layers' cache rows and block-table offsets (equal to slot / bt_off when the
  // model has no sliding layers).
  int32_t *slot_sw, *bt_off_sw;
  uint64_t* sample_key;  // [S] random stream of each sampled row (GPU sampling)
  float* inv_temp;       // [S] 1 / temperature for GPU sampling, 0 = greedy (or sampled on the host)
  float *top_p, *min_p;  // [S] filters of GPU sampling (1 / 0 = off)
  int32_t* top_k;        // [S] 0 = off
  // Logit adjustments before the pick: adj[0] entries, then LogitAdjustEntry's five words each (a
  // logit_bias, -inf for a banned token, penalties; model/logit_adjust.h); at most MemoryPlan::adj_cap();
  // after the block tables, copied only by steps that have any.
  int32_t* adj;
  // Constrained rows (SeqStep::allowed) masked on the GPU: mask[0] rows, their sampled-row indices in
  // [1, 1 + mask_slots()), then each one's allowed bits (mask_words uint32); after the adjustments.
  int32_t* mask;
};

// The paged KV cache: its format and one KvLayer per model layer. A block is a page of the full
// layers or of the sliding ones (model_runner.h), so the j-th full and the j-th sliding layer share
// array j, and a sequence's sliding pages cover only its window.
struct KvCache {
  cuda::KvCacheSpec spec;
  int num_blocks = 0;     // the blocks sequences may hold (the engine's KvCacheShape)
  int scratch_block = 0;  // one more, never a sequence's: the padding rows of a wide graph step write here
  int sliding_window = 0;  // 0 when no layer slides
  std::vector<cuda::KvLayer> layers;
};

struct MemoryPlan {
  int T = 0, S = 0;          // tokens a step, sampled rows a step
  // Logit rows a launch of the prompt's log-probs takes (SeqStep::prompt_targets), at most S (the lm_head's
  // tensor-parallel scratch holds S rows) and what ysl holds (8 or more): each launch reads the whole head,
  // so not a few.
  static constexpr int kPromptRows = 128;
  int prompt_rows = 0;
  int attn_rows = 0;         // rows the decode attention's split-K scratch holds
  int moe_max_tiles = 0;     // grouped-MoE tiles of a T-token step
  int bt_cap = 0;            // block-table entries a step
  std::vector<size_t> activation_sizes;  // in Activations order
  size_t activation_bytes = 0;
  size_t meta_bytes = 0;     // one metadata buffer
  cuda::KvCacheSpec kv_spec;
  int kv_arrays = 0;         // K and V array pairs
  int num_blocks = 0, sliding_window = 0;  // num_blocks: the sequences' (KvCache::scratch_block is one more)
  size_t kv_block_bytes = 0; // one block across every array, K and V
  size_t kv_bytes() const { return size_t(num_blocks + 1) * kv_block_bytes; }
  size_t weight_bytes = 0;
  // int32 words of the metadata before the block tables: 9 token arrays, then (at an even offset) the
  // 64-bit sample keys, the inverse temperatures, top_p, min_p and top_k of the sampled rows.
  int meta_key_off() const { return (9 * T + 1) & ~1; }
  int meta_tail() const { return meta_key_off() + 6 * S; }
  // Adjustments a step: an entry an id a sampled row biases, bans (its stop ids below min_tokens) or
  // penalizes (each distinct id of its history, ~1,500 at 1k/1k with a repetition penalty): 2,048 a row
  // of max_num_seqs, 40 MB a buffer at 1,024 rows. A row past what is left (long penalized histories in a
  // full step) samples on the host.
  static constexpr int kAdjPerRow = 2048;
  int adj_cap() const { return kAdjPerRow * S; }
  int meta_adj_off() const { return meta_tail() + bt_cap; }
  // Constrained rows a step masked on the GPU (25 KB of bits each); the rest sample on the host.
  static constexpr int kMaskRows = 64;
  int mask_words = 0;  // uint32 words of one row's bits: the vocabulary / 32, rounded up
  int mask_slots() const { return std::min(S, kMaskRows); }
  int meta_mask_off() const { return meta_adj_off() + 1 + 5 * adj_cap(); }
};

// Sizes every buffer and the KV cache from the options and the free device memory; fails with the
// numbers when the model does not fit.
MemoryPlan plan_memory(const CudaEngineOptions& opt, const DeviceModel& model);
Activations bind_activations(uint8_t* arena, const MemoryPlan& plan);
StepMeta bind_step_meta(int32_t* base, const MemoryPlan& plan);
KvCache bind_kv_cache(uint8_t* arena, const MemoryPlan& plan, const ModelConfig& cfg);

}  // namespace mx
