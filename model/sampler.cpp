#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace mx {
namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

double sample_uniform(uint64_t seed, uint64_t step) {
  return double(splitmix64(splitmix64(seed) ^ (step * 0xd1b54a32d192ed03ull)) >> 11) * (1.0 / 9007199254740992.0);
}

SampleResult sample_token(const float* logits, int vocab, const SamplingParams& p, uint64_t rng_step,
                          std::vector<float>& scratch) {
  SampleResult r;
  // Log-softmax of the raw logits: what OpenAI's logprobs report, independent of temperature.
  float mx = -std::numeric_limits<float>::infinity();
  int argmax = 0;
  for (int i = 0; i < vocab; ++i)
    if (logits[i] > mx) {  // strict: lowest id wins ties
      mx = logits[i];
      argmax = i;
    }
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  const float log_z = float(mx + std::log(sum));

  if (p.temperature <= 0.0f) {
    r.token = argmax;
  } else {
    // Candidates sorted by logit (desc), id (asc); filters keep a prefix of this order.
    std::vector<int> idx(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    auto better = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    int keep = vocab;
    if (p.top_k > 0 && p.top_k < vocab) {
      keep = p.top_k;
      std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), better);
    } else {
      std::sort(idx.begin(), idx.end(), better);
    }
    scratch.resize(keep);
    double z = 0;
    for (int j = 0; j < keep; ++j) {
      scratch[j] = float(std::exp(double(logits[idx[j]] - mx) / p.temperature));
      z += scratch[j];
    }
    int n = keep;
    if (p.min_p > 0.0f) {  // keep p_i >= min_p * p_max; p_max is scratch[0] / z
      float thr = p.min_p * scratch[0];
      while (n > 1 && scratch[n - 1] < thr) --n;
    }
    if (p.top_p < 1.0f) {
      double cum = 0, total = 0;
      for (int j = 0; j < n; ++j) total += scratch[j];
      int m = 0;
      while (m < n) {
        cum += scratch[m++];
        if (cum >= p.top_p * total) break;
      }
      n = std::max(m, 1);
    }
    double total = 0;
    for (int j = 0; j < n; ++j) total += scratch[j];
    double u = sample_uniform(p.seed, rng_step) * total, cum = 0;
    r.token = idx[n - 1];
    for (int j = 0; j < n; ++j) {
      cum += scratch[j];
      if (u < cum) {
        r.token = idx[j];
        break;
      }
    }
    (void)z;
  }
  r.logprob = logits[r.token] - log_z;
  if (p.top_logprobs > 0) {
    int k = std::min(p.top_logprobs, vocab);
    std::vector<int> idx(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (int j = 0; j < k; ++j) r.top.emplace_back(idx[j], logits[idx[j]] - log_z);
  }
  return r;
}

}  // namespace mx
