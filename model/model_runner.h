// The contract between the engine loop (runtime/, server/) and a model implementation
// (the CPU reference or the CUDA engine). The runner owns the weights and the paged KV cache;
// the runtime owns the block allocator and decides which tokens each sequence computes.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "model/config.h"

namespace mx {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax, lowest id on ties)
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0 = off
  float min_p = 0.0f;        // [0, 1]
  uint64_t seed = 0;         // per-request; with rng_step makes sampling reproducible
  int top_logprobs = 0;      // how many alternatives to return (0..20)
  bool logprobs = false;     // return the chosen token's logprob
  // vLLM's penalties (OpenAI's two and repetition_penalty), applied after logit_bias and the bans:
  // repetition_penalty divides the positive and multiplies the negative logits of the tokens in the
  // prompt or the output; then frequency_penalty x each output token's count and presence_penalty
  // (once) are subtracted from the output's tokens.
  float presence_penalty = 0.0f;    // [-2, 2]
  float frequency_penalty = 0.0f;   // [-2, 2]
  float repetition_penalty = 1.0f;  // > 0
  bool penalized() const { return presence_penalty != 0.f || frequency_penalty != 0.f || repetition_penalty != 1.f; }
};

// OpenAI's logit_bias: `bias` (in [-100, 100]) added to token `id`'s logit before sampling.
struct LogitBias {
  int32_t id = 0;
  float bias = 0.f;
};

// One sequence's work in a step: compute KV for `tokens` at positions
// [start_pos, start_pos + tokens.size()), and if `sample`, sample the token after the last one.
struct SeqStep {
  int64_t seq_id = 0;
  std::span<const int32_t> tokens;
  int32_t start_pos = 0;
  // KV block ids covering positions [0, start_pos + tokens.size()); block b holds positions
  // [b*block_size, (b+1)*block_size). Blocks below start_pos already hold valid KV.
  std::span<const int32_t> block_table;
  // The sliding-window layers' blocks, indexed like block_table (required when
  // kv_shape().sliding_window > 0). Only blocks from sliding_first_block(shape, start_pos) on are
  // read or written; entries before it may be -1, so a sequence holds about window + chunk
  // positions of those layers instead of all of them. Full and sliding blocks come from one pool
  // (a block id is a page of the full layers or of the sliding ones, never both at once).
  std::span<const int32_t> sliding_table;
  bool sample = false;
  SamplingParams sampling;
  uint64_t rng_step = 0;     // index of the token being sampled within the request
  // The caller expects to ask for this sequence's next token in the next step (a sampled sequence that
  // is not at its length limit). A runner may start that step early (CudaEngineOptions::decode_ahead).
  bool expect_next = false;
  // Token ids the sampler must not pick for this token (their logits set to -inf first, so the reported
  // log-probs are the masked row's): a request's stop tokens until it has min_tokens tokens.
  std::span<const int32_t> banned{};
  // Added to the logits before the bans and the sampler (one entry an id), so the log-probs are the
  // biased row's too.
  std::span<const LogitBias> logit_bias{};
  // Penalized sampling only: the sequence's tokens so far (prompt, then output) and the prompt's length.
  std::span<const int32_t> history{};
  int32_t prompt_len = 0;
  // A constrained row (structured output): bit id of word id / 64 set for each id it may take, applied
  // after the adjustments above; empty = any. A runner samples such a row on the host.
  std::span<const uint64_t> allowed{};
  // Prompt log-probs (completions' echo with logprobs, vLLM's prompt_logprobs): rows [prompt_row0,
  // prompt_row0 + prompt_targets.size()) of `tokens` each report the log-prob of the prompt token after
  // them (prompt_targets[j]) under the raw logits, its rank and the prompt_top best ids, sampled or not.
  int32_t prompt_row0 = 0;
  std::span<const int32_t> prompt_targets{};
  int32_t prompt_top = 0;  // 0..kMaxPromptTop
};
constexpr int kMaxPromptTop = 20;

// One known token's log-prob (a prompt token after the row before it).
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;  // log-softmax of the raw logits (ids past the tokenizer excluded)
  int32_t rank = 0;      // 1 + the ids with a larger logit
  std::vector<std::pair<int32_t, float>> top;  // the prompt_top best ids, best first (lowest id on ties)
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;      // log-softmax of the raw (temperature-free) logits, as OpenAI reports
  std::vector<std::pair<int32_t, float>> top;  // top_logprobs alternatives, best first
  std::vector<TokenLogprob> prompt;  // one a SeqStep::prompt_targets entry, in order
};

struct KvCacheShape {
  int block_size = 16;       // tokens per block
  int num_blocks = 0;
  int sliding_window = 0;    // > 0: the model has sliding-window layers, which read SeqStep::sliding_table
};

// First block a step computing from position `start` reads or writes in the sliding layers: a
// query at q sees keys [q - window + 1, q].
inline int sliding_first_block(const KvCacheShape& s, int start) {
  if (s.sliding_window <= 0) return 0;
  const int k = start - s.sliding_window + 1;
  return k > 0 ? k / s.block_size : 0;
}

// The most tokens one sequence can hold when it has the whole cache to itself and computes up to
// `chunk` tokens per step: the sliding layers' window blocks come out of the same pool.
inline int max_sequence_tokens(const KvCacheShape& s, int chunk) {
  const int window_blocks =
      s.sliding_window > 0 ? (s.sliding_window - 1 + chunk + s.block_size - 1) / s.block_size + 1 : 0;
  return s.num_blocks > window_blocks ? (s.num_blocks - window_blocks) * s.block_size : 0;
}

// Block tables of one sequence for callers that lay out the cache themselves (bench, generate,
// tests): full layers use blocks [first, first + n), the sliding layers the n after them (none
// without sliding layers). Returns the blocks used.
struct KvTables {
  std::vector<int32_t> full, sliding;
};
inline int contiguous_kv_tables(const KvCacheShape& s, int first, int n, KvTables& t) {
  t.full.resize(size_t(n));
  t.sliding.resize(s.sliding_window > 0 ? size_t(n) : 0);
  for (int i = 0; i < n; ++i) t.full[size_t(i)] = first + i;
  for (size_t i = 0; i < t.sliding.size(); ++i) t.sliding[i] = first + n + int(i);
  return s.sliding_window > 0 ? 2 * n : n;
}

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const ModelConfig& config() const = 0;
  virtual KvCacheShape kv_shape() const = 0;
  // Runs one forward step over all sequences (mixed prefill chunks and decodes) and fills
  // out[i] for every seqs[i] with sample == true (others are left untouched).
  // out.size() == seqs.size(). Must not allocate device memory.
  virtual void step(std::span<const SeqStep> seqs, std::span<SampleResult> out) = 0;
  // Full-vocabulary fp32 logits of the last computed position of each sampled sequence of the
  // most recent step, for tests and `generate --dump-logits`; may be empty if not kept.
  virtual std::span<const float> last_logits(int index) const { (void)index; return {}; }
  // Seconds the device has spent running steps so far, from its own clock (the CUDA engine: from each
  // step's first kernel to its last); 0 where not measured. Against wall time: the device's idle share.
  virtual double device_busy_seconds() const { return 0.0; }
};

}  // namespace mx
