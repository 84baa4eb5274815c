// The log-probs of known tokens on the GPU: a prompt's own (completions' echo with logprobs, vLLM's
// prompt_logprobs), from rows of logits, so a prompt's 0.8 MB logit rows never go to the host.
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
  int top = 0;                      // 0..kTokenLogprobMaxTop
  float* out = nullptr;             // [rows, kTokenLogprobFloats]
};
void token_logprobs(const TokenLogprobParams& p, cudaStream_t s);

}  // namespace mx::cuda
