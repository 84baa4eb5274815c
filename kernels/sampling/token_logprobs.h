// The log-probs of known tokens on the GPU: a prompt's own (completions' echo with logprobs, vLLM's
// prompt_logprobs) and a sampled token's with its alternatives (top_logprobs), from rows of logits, so
// no 0.8 MB logit row goes to the host for them.
// Per row: the log-softmax of the target id over ids [0, V), its rank (1 + the ids with a larger
// logit) and the `top` best ids in the host sampler's order (logit descending, then id ascending).
// model/sampler.h's token_logprob is the reference.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace mx::cuda {

constexpr int kTokenLogprobMaxTop = 20;
// A row's results: the target's log-prob, its rank (int32 bits), then `top` (id as int32 bits, log-prob)
// pairs; the stride is fixed so rows of several launches share one array.
constexpr int kTokenLogprobFloats = 2 + 2 * kTokenLogprobMaxTop;

struct TokenLogprobParams {
  const float* logits = nullptr;    // fp32 [rows, stride]
  int stride = 0;                   // the model vocabulary
  int V = 0;                        // ids >= V are never counted (the tokenizer's size)
  int rows = 0;
  const int32_t* targets = nullptr; // [rows] (device-readable, mapped host memory too)
  // Optional: launch row i reads logits row and target index row_index[i] (a subset of the rows, e.g. the
  // sampled rows that ask for alternatives); its results still go to out row i.
  const int32_t* row_index = nullptr;
  int top = 0;                      // 0..kTokenLogprobMaxTop
  float* out = nullptr;             // [rows, kTokenLogprobFloats]
};
void token_logprobs(const TokenLogprobParams& p, cudaStream_t s);

}  // namespace mx::cuda
