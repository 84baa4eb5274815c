// The persistent decode step: all layers of one decode step (M <= 8 tokens) in one launch. Every
// resident CTA walks the same global sequence of work items (per layer: qkv tiles, attention splits,
// o-proj tiles, router tiles, FC1 tiles per expert, FC2 tiles per expert) and takes every gridDim-th
// one. An item first issues its weight loads, then waits on a ready counter of the items it reads
// from, so weights stream while the previous phase drains: there are no grid boundaries between the
// six ops of a layer or between layers. Items only wait on items earlier in the sequence and every
// CTA is resident (the grid is sized from the occupancy and launched cooperatively), so the item
// with the lowest unfinished index can always run: no deadlock.
// The kernel bodies are the ones of the per-op grids (gemv_body.cuh, moe_body.cuh,
// attention_decode_body.cuh); the per-op path alone has the one-token FP8 experts, the router folded
// into the o-proj and the tensor-core attention, so the two paths agree to rounding. At one token the
// per-op launches are faster (docs/perf.md): an item is a chain of dependent memory round trips
// (weights, staging, outputs) that a phase waits for, and a CTA cannot start the next phase's item
// while it runs one of the current phase.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

#include "kernels/common/dense_weight.h"
#include "kernels/common/kv_cache.h"

namespace mx::cuda {

// Per-layer weights and caches, in device memory (uploaded once). qkv and o-proj: values and scales in
// DecodeStepParams::dense's format (dense_weight.h).
struct DecodeStepLayer {
  const void *qkv_w, *qkv_sc, *o_w, *o_sc;
  const uint16_t *attn_norm, *qkv_b, *o_b, *sinks, *mlp_norm, *router_w, *router_b;
  const uint8_t *up_blocks, *up_scales, *down_blocks, *down_scales;
  const uint16_t *up_bias, *down_bias;
  KvLayer kv;  // the layer's paged cache (bf16 or fp8)
  int window;  // 0 = full attention
};

struct DecodeStepParams {
  const DecodeStepLayer* layers = nullptr;  // device array [num_layers]
  int num_layers = 0;
  // Residual stream: layer l reads (l even ? xa : xb) plus the previous layer's expert outputs and
  // writes the other buffer. xa holds the embeddings at launch; the result is in
  // decode_step_output(xa, xb, num_layers) plus y_slot.
  float *xa = nullptr, *xb = nullptr;
  float* y_slot = nullptr;         // fp32 [M, 4, H]
  float* q = nullptr;              // fp32 [M, Hq * D]
  uint16_t* attn = nullptr;        // bf16 [M, Hq * D]
  float* attn_partials = nullptr;  // attention_decode_scratch_floats(M, Hkv, D)
  int* attn_tickets = nullptr;     // [M * Hkv], zero; left zero
  float* router_logits = nullptr;  // fp32 [kRouterSplits, M, E]
  uint16_t* xn = nullptr;          // bf16 [M, H]
  uint16_t* act = nullptr;         // bf16 [M, 4, I]
  unsigned* counters = nullptr;    // decode_step_counter_words(num_layers), zeroed by decode_step()
  const int32_t *pos = nullptr, *slot = nullptr, *bt_off = nullptr, *block_tables = nullptr;  // [M] / tables
  const int32_t *slot_sw = nullptr, *bt_off_sw = nullptr;  // [M] of the sliding layers (window != 0)
  const float* inv_freq = nullptr;
  float concentration = 1.f, eps = 1e-5f, alpha = 1.702f, limit = 7.f;
  int M = 1, H = 0, I = 0, E = 0, Hq = 0, Hkv = 0, D = 64;
  bool kv_stable = false;   // one token per sequence: attention reads older keys before waiting
  bool kv_fp8 = false;      // every layer's cache is E4M3 (kv_cache.h)
  DenseFormat dense = DenseFormat::kBf16;  // of qkv and o-proj (one format for both)
  // Diagnostics (bench --step-trace): per work item in sequence order, 4 words: globaltimer ns at
  // entry, when its wait was satisfied (0: no wait), at exit, and sm | phase << 8 | layer << 16.
  unsigned long long* trace = nullptr;
};

// Work items of one step (the trace's length / 4).
size_t decode_step_items(int M, int num_layers, int H, int I, int E, int Hq, int Hkv, int D);

size_t decode_step_counter_words(int num_layers);
inline float* decode_step_output(float* xa, float* xb, int num_layers) { return num_layers % 2 ? xb : xa; }

// Zeroes the counters and launches the step (one cooperative grid). Throws on shapes it does not
// handle (M > 8, head_dim not 16 / 64, more than 16 KV heads).
void decode_step(const DecodeStepParams& p, cudaStream_t s);

}  // namespace mx::cuda
