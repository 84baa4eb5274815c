// Token sampling on the host (CPU path and tests): greedy, temperature, top-k, top-p, min-p.
// Reproducible: the draw for a request's n-th token depends only on (seed, n).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/model_runner.h"

namespace mx {

// logits[vocab] (raw, fp32). Ids >= vocab are never returned. scratch is reused across calls.
SampleResult sample_token(const float* logits, int vocab, const SamplingParams& p, uint64_t rng_step,
                          std::vector<float>& scratch);

// The log-prob of `target` under the raw logits[vocab] (ids >= vocab excluded), its rank (1 + the ids
// with a larger logit) and the `top` best ids: a prompt token's entry (SeqStep::prompt_targets).
TokenLogprob token_logprob(const float* logits, int vocab, int32_t target, int top);

// Sets the logits of `banned` ids (those in [0, vocab)) to -inf: tokens a row may not pick (min_tokens).
void ban_tokens(float* logits, int vocab, std::span<const int32_t> banned);
// Adds each bias to its id's logit (ids in [0, vocab)): OpenAI's logit_bias.
void bias_tokens(float* logits, int vocab, std::span<const LogitBias> bias);
// The penalties of p (SamplingParams) over history[0, prompt_len) (prompt) and the rest (output);
// scratch is reused across calls.
void penalize_tokens(float* logits, int vocab, const SamplingParams& p, std::span<const int32_t> history,
                     int prompt_len, std::vector<int32_t>& scratch);
// A sampled row's logits before the sampler, in vLLM's order: q's logit_bias, then its bans, then its
// penalties, then its allowed ids (structured output). The one place the host applies them (the CPU
// runner, the CUDA engine's host-sampled rows).
void adjust_row_logits(float* logits, int vocab, const SeqStep& q, std::vector<int32_t>& scratch);

class ThreadPool;

// One row to sample: raw logits [vocab], its parameters and the index of the token being sampled.
struct SampleJob {
  const float* logits = nullptr;
  const SamplingParams* params = nullptr;
  uint64_t rng_step = 0;
  SampleResult* out = nullptr;
};
// sample_token for every job, spread over the pool's threads. Each draw depends only on its own row,
// seed and step, so the results equal a sequential loop. scratch: one buffer per part, kept by the
// caller so that warm calls allocate nothing.
void sample_tokens(std::span<const SampleJob> jobs, int vocab, ThreadPool& pool,
                   std::vector<std::vector<float>>& scratch);

// Uniform [0, 1) from (seed, step): splitmix64-based, identical on every machine.
double sample_uniform(uint64_t seed, uint64_t step);
// The 64-bit random stream key of (seed, step) behind sample_uniform; the CUDA engine's on-GPU
// sampler derives one uniform per vocabulary id from it.
uint64_t sample_stream_key(uint64_t seed, uint64_t step);

}  // namespace mx
