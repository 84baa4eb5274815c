// The GPU forward of one step: embedding, the layer loop, final norm, lm_head and the pick. Two paths:
//   decode  (forward_decode.cpp)  M <= 8 tokens: six kernels a layer (five for one token), or from
//           decode_step_min_tokens one persistent kernel for the whole step (decode_step.h);
//   prefill (forward_prefill.cpp) more tokens: cuBLASLt GEMMs, the grouped MoE, flash attention.
// The layer loops name their reduce points (after the attention's o-proj, after the experts): a
// tensor-parallel rank sums its partial rows with the other GPUs' there (docs/tensor_parallel.md). On one
// GPU they are no-ops.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/comm/tp_comm.h"
#include "kernels/engine/device_model.h"
#include "kernels/engine/memory_plan.h"
#include "kernels/engine/probe.h"
#include "kernels/gemm/gemm_bf16.h"

namespace mx {

// What the forward reads of the step being run.
struct StepView {
  const StepMeta* dev = nullptr;   // the metadata on the device
  const StepMeta* host = nullptr;  // its host copy (read for positions on the host)
  float* results = nullptr;        // where the picks go: S tokens (int32), then S log-probs (mapped host memory)
  int num_sampled = 0;             // S
  bool attn_long = false;          // a context past the tensor-core attention's one pass: full layers use registers
  bool full_logits = false;        // tensor parallel: the step reads logits [S, V] after the pick (gathered)
  bool adjust = false;             // logit adjustments and masks (StepMeta::adj, mask) before the pick
  int mask_slots = 0, mask_words = 0;  // StepMeta::mask's layout (MemoryPlan)
};

// One sequence's rows in a prefill step: first token row, token count, block-table offsets of the
// full and the sliding layers.
struct SeqRows {
  int row = 0, n = 0, bt_off = 0, bt_off_sw = 0;
};

struct ForwardOptions {
  int decode_step_min_tokens = 6;       // CudaEngineOptions
  bool flash_prefill_attention = true;  // CudaEngineOptions
  int vocab_limit = 0;                  // ids >= this are never picked
  const cuda::TpComm* tp = nullptr;     // the tensor-parallel group (null on one GPU)
};

class Forward {
 public:
  Forward(const DeviceModel& model, const KvCache& kv, const Activations& act, const ForwardOptions& opt,
          cudaStream_t stream, Probe& probe);
  ~Forward();
  Forward(const Forward&) = delete;
  Forward& operator=(const Forward&) = delete;

  // Decode forward over tokens [t0, t0 + M) of the step (M <= 8); picks the S rows listed in
  // srow_local[s0 .. s0 + S) into result slot s0. one_token_per_seq: no two of the M tokens belong to
  // the same sequence.
  void decode(const StepView& st, int t0, int M, int s0, int S, bool one_token_per_seq);
  // Prefill forward over all M tokens of the step; n_decode rows are single-token sequences.
  void prefill(const StepView& st, int M, int S, const std::vector<SeqRows>& seqs, int n_decode);
  // The single-token rows' tensor-core attention splits in a prefill step (host-chosen launch shapes,
  // so part of what a captured wide step depends on).
  struct DecodeRowSplits {
    int full = 0, sliding = 0, full_keys = 0, sliding_keys = 0;  // keys: a split's most
    bool operator==(const DecodeRowSplits&) const = default;
  };
  DecodeRowSplits decode_row_splits(const StepView& st, const std::vector<SeqRows>& seqs, int n_decode) const;
  // Logits [n, V] into `logits` of rows rows[0, n) of the last layer's output x (+ y_slot, the decode path's
  // last experts, [rows, top_k, H]): a prompt's own log-probs (echo, prompt_logprobs). n <= the plan's S.
  void row_logits(const float* x, const float* y_slot, const int32_t* rows, int n, float* logits);

 private:
  // The decode path's layer, op by op: `x` is the residual the layer reads (plus `y`, the previous
  // layer's per-slot expert outputs), `x_next` the one it writes.
  struct DecodeRows {
    const StepView* st;
    int t0, M;
    bool one_token_per_seq, fused_router;
  };
  void decode_layers(const DecodeRows& r);
  void decode_persistent(const StepView& st, int t0, int M, bool one_token_per_seq);
  void qkv_rope_kv(const DecodeRows& r, int l, const float* x, const float* y, float* x_next);
  void attention(const DecodeRows& r, int l);
  void o_proj(const DecodeRows& r, int l, float* x_next);
  void router(const DecodeRows& r, int l, float* x_next);
  void experts(const DecodeRows& r, int l, float* x_next);
  double kv_bytes_read(const StepView& st, const std::vector<SeqRows>& seqs, int l) const;
  void final_logits(const StepView& st, const float* x, const float* y_slot, const int32_t* rows, int s0, int S);
  // Tensor parallelism (docs/tensor_parallel.md): the sum over ranks must hold the residual once. In a
  // prefill step a rank other than 0 zeroes the residual rows before it adds its partial outputs.
  bool tp() const { return opt_.tp && opt_.tp->size > 1; }
  void zero_unless_rank0(float* rows, size_t n);
  // Where the decode o-proj accumulates: the residual x, or on a rank other than 0 its zeroed partial rows
  // (tp_part), which the reduce sums into x and leaves zero again: no memset in the decode step.
  float* o_proj_rows(float* x) const { return tp() && opt_.tp->rank != 0 ? act_.tp_part : x; }
  // The reduce points: the residual after the o-proj (x = the sum over ranks of `rows`), the experts'
  // outputs (decode: the per-slot rows).
  void reduce_after_attention(float* rows, float* x, size_t n);
  void reduce_with_router(int l, float* rows, float* x);
  void reduce_after_experts(float* y, size_t n);
  // Layer l's expert weights offset so that a model expert id indexes them (expert parallelism: this GPU
  // holds experts [expert0, expert0 + held) only).
  struct ExpertWeights {
    const uint8_t *up_blocks, *up_scales, *down_blocks, *down_scales;
    const uint16_t *up_bias, *down_bias;
    const uint8_t *up_smax, *down_smax;
  };
  ExpertWeights expert_weights(int l) const;
  // The lm_head over this rank's vocabulary rows ([S, head_rows], returned), gathered into logits [S, V]
  // when `gather` (always on one GPU: they are the logits).
  float* lm_head(float* logits, int s0, int S, bool gather);
  void mark(const char* name, double bytes) { probe_.mark(name, bytes, stream_); }

  const DeviceModel& model_;
  const DeviceShape& shape_;
  const LayerSizes sizes_;  // the profile's byte counts
  const KvCache& kv_;
  const Activations& act_;
  ForwardOptions opt_;
  cudaStream_t stream_;
  Probe& probe_;
  cuda::GemmContext* gemm_ = nullptr;
  float concentration_ = 1.f;  // YaRN attention scaling
  bool mma_attention_ = false;  // full layers may run attention_decode_mma (this shape)
};

}  // namespace mx
