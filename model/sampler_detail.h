// Internals of the host sampler, shared by sampler.cpp (reference draw) and sampler_fast.cpp
// (the same draw without sorting the vocabulary). Not part of the model API.
#pragma once
#include <cstdint>
#include <vector>

#include "model/model_runner.h"

namespace mx::sampler_detail {

// The one candidate order every filter and top_logprobs use: logit descending, then id ascending.
inline bool better(const float* logits, int a, int b) {
  return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

// The defining draw (temperature > 0): sort candidates by `better`, weight them by
// float(exp((logit - mx) / T)), cut by top_k, min_p, top_p, and walk the double prefix sums in
// that order. Slow (sorts the vocabulary) but obviously right; sample_fast must agree with it.
int sample_sorted(const float* logits, int vocab, float mx, const SamplingParams& p, uint64_t rng_step,
                  std::vector<float>& scratch);

// Exactly sample_sorted's token without a comparison sort; -1 when it cannot prove the answer
// (non-finite inputs, or the draw falls past the last weight that changes a double sum).
// terms: null, or (temperature 1 only) exp(double(logits[i]) - mx) as the log-softmax summed it.
int sample_fast(const float* logits, int vocab, float mx, const double* terms, const SamplingParams& p,
                uint64_t rng_step, std::vector<float>& scratch);

}  // namespace mx::sampler_detail
