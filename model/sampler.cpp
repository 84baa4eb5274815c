#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/parallel.h"
#include "model/sampler_detail.h"

namespace mx {
namespace {
using sampler_detail::better;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Below this a sorted top_k prefix is cheaper than the sort-free path, and it is the reference.
constexpr int kSortedTopK = 1024;
// Above this the bounded insertion in top_ids degrades; partial_sort is O(n log k) regardless.
constexpr int kInsertTopK = 64;

struct Max {
  int id = 0;
  float value = -std::numeric_limits<float>::infinity();
};

// What a serial `if (logit > max)` scan finds (the first id of the largest non-NaN logit; id 0 and
// -inf when there is none), via independent partial maxima: the serial scan is one long chain.
Max max_logit(const float* logits, int vocab) {
  constexpr int kLanes = 8;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float lane[kLanes];
  std::fill(lane, lane + kLanes, kNegInf);
  int i = 0;
  for (; i + kLanes <= vocab; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] = logits[i + k] > lane[k] ? logits[i + k] : lane[k];
  float best = kNegInf;
  for (float v : lane) best = v > best ? v : best;
  for (; i < vocab; ++i) best = logits[i] > best ? logits[i] : best;
  if (best == kNegInf) return {};
  int a = 0;
  while (!(logits[a] == best)) ++a;  // == also equates -0 and +0, as the serial > did
  return {a, logits[a]};
}

// The k best ids by `better`, best first: one pass with a small sorted buffer instead of
// materialising and partially sorting all vocab ids.
std::vector<int> top_ids(const float* logits, int vocab, int k) {
  std::vector<int> best;
  if (k > kInsertTopK) {
    std::vector<int> idx(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) { return better(logits, a, b); });
    best.assign(idx.begin(), idx.begin() + k);
    return best;
  }
  best.reserve(k + 1);
  for (int i = 0; i < vocab; ++i) {
    // i exceeds every id already kept, so on equal logits the kept id wins: a strict > suffices.
    if (int(best.size()) == k && !(logits[i] > logits[best.back()])) continue;
    auto at = std::upper_bound(best.begin(), best.end(), i, [&](int a, int b) { return better(logits, a, b); });
    best.insert(at, i);
    if (int(best.size()) > k) best.pop_back();
  }
  return best;
}
}  // namespace

uint64_t sample_stream_key(uint64_t seed, uint64_t step) {
  return splitmix64(splitmix64(seed) ^ (step * 0xd1b54a32d192ed03ull));
}

double sample_uniform(uint64_t seed, uint64_t step) {
  return double(sample_stream_key(seed, step) >> 11) * (1.0 / 9007199254740992.0);
}

namespace sampler_detail {
int sample_sorted(const float* logits, int vocab, float mx, const SamplingParams& p, uint64_t rng_step,
                  std::vector<float>& scratch) {
  // Candidates sorted by logit (desc), id (asc); filters keep a prefix of this order.
  std::vector<int> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  auto cmp = [&](int a, int b) { return better(logits, a, b); };
  int keep = vocab;
  if (p.top_k > 0 && p.top_k < vocab) {
    keep = p.top_k;
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), cmp);
  } else {
    std::sort(idx.begin(), idx.end(), cmp);
  }
  scratch.resize(keep);
  for (int j = 0; j < keep; ++j) scratch[j] = float(std::exp(double(logits[idx[j]] - mx) / p.temperature));
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
  for (int j = 0; j < n; ++j) {
    cum += scratch[j];
    if (u < cum) return idx[j];
  }
  return idx[n - 1];
}
}  // namespace sampler_detail

SampleResult sample_token(const float* logits, int vocab, const SamplingParams& p, uint64_t rng_step,
                          std::vector<float>& scratch) {
  SampleResult r;
  // Log-softmax of the raw logits: what OpenAI's logprobs report, independent of temperature.
  const auto [argmax, mx] = max_logit(logits, vocab);  // lowest id wins ties
  const bool sorted = p.temperature > 0.0f && p.top_k > 0 && p.top_k < vocab && p.top_k <= kSortedTopK;
  const bool fast = p.temperature > 0.0f && !sorted;
  // At temperature 1 the fast path derives its weights from these terms instead of exp() again.
  thread_local std::vector<double> terms;
  double* keep_terms = fast && p.temperature == 1.0f ? (terms.resize(vocab), terms.data()) : nullptr;
  double sum = 0;
  if (keep_terms)
    for (int i = 0; i < vocab; ++i) sum += keep_terms[i] = std::exp(double(logits[i]) - mx);
  else
    for (int i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  const float log_z = float(mx + std::log(sum));

  if (p.temperature <= 0.0f) {
    r.token = argmax;
  } else {
    r.token = fast ? sampler_detail::sample_fast(logits, vocab, mx, keep_terms, p, rng_step, scratch) : -1;
    if (r.token < 0) r.token = sampler_detail::sample_sorted(logits, vocab, mx, p, rng_step, scratch);
  }
  r.logprob = logits[r.token] - log_z;
  if (p.top_logprobs > 0)
    for (int id : top_ids(logits, vocab, std::min(p.top_logprobs, vocab))) r.top.emplace_back(id, logits[id] - log_z);
  return r;
}

TokenLogprob token_logprob(const float* logits, int vocab, int32_t target, int top) {
  TokenLogprob r;
  r.token = target;
  const float mx = max_logit(logits, vocab).value;
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  const float log_z = float(mx + std::log(sum));
  const float t = target >= 0 && target < vocab ? logits[target] : -std::numeric_limits<float>::infinity();
  r.logprob = t - log_z;
  r.rank = 1;
  for (int i = 0; i < vocab; ++i) r.rank += logits[i] > t;
  if (top > 0)
    for (int id : top_ids(logits, vocab, std::min(top, vocab))) r.top.emplace_back(id, logits[id] - log_z);
  return r;
}

void ban_tokens(float* logits, int vocab, std::span<const int32_t> banned) {
  for (int32_t id : banned)
    if (id >= 0 && id < vocab) logits[id] = -std::numeric_limits<float>::infinity();
}

void bias_tokens(float* logits, int vocab, std::span<const LogitBias> bias) {
  for (const LogitBias& b : bias)
    if (b.id >= 0 && b.id < vocab) logits[b.id] += b.bias;
}

void penalize_tokens(float* logits, int vocab, const SamplingParams& p, std::span<const int32_t> history,
                     int prompt_len, std::vector<int32_t>& scratch) {
  if (!p.penalized()) return;
  prompt_len = std::clamp(prompt_len, 0, int(history.size()));
  if (p.repetition_penalty != 1.f) {  // every id of the prompt or the output, once
    scratch.assign(history.begin(), history.end());
    std::sort(scratch.begin(), scratch.end());
    scratch.erase(std::unique(scratch.begin(), scratch.end()), scratch.end());
    for (int32_t id : scratch)
      if (id >= 0 && id < vocab) {
        float& x = logits[id];
        x = x > 0.f ? x / p.repetition_penalty : x * p.repetition_penalty;
      }
  }
  if (p.presence_penalty == 0.f && p.frequency_penalty == 0.f) return;
  scratch.assign(history.begin() + prompt_len, history.end());  // the output's ids, counted in runs
  std::sort(scratch.begin(), scratch.end());
  for (size_t i = 0, j = 0; i < scratch.size(); i = j) {
    while (j < scratch.size() && scratch[j] == scratch[i]) ++j;
    if (scratch[i] >= 0 && scratch[i] < vocab)
      logits[scratch[i]] -= p.frequency_penalty * float(j - i) + p.presence_penalty;
  }
}

void adjust_row_logits(float* logits, int vocab, const SeqStep& q, std::vector<int32_t>& scratch) {
  bias_tokens(logits, vocab, q.logit_bias);
  ban_tokens(logits, vocab, q.banned);
  penalize_tokens(logits, vocab, q.sampling, q.history, q.prompt_len, scratch);
  if (q.allowed.empty()) return;
  auto ok = [&](int id) { return size_t(id) / 64 < q.allowed.size() && (q.allowed[size_t(id) / 64] >> (id % 64) & 1); };
  bool any = false;  // (an allowed id the bans left: else the row stays unconstrained rather than all -inf)
  for (int id = 0; id < vocab && !any; ++id) any = ok(id) && logits[id] > -std::numeric_limits<float>::infinity();
  if (any)
    for (int id = 0; id < vocab; ++id)
      if (!ok(id)) logits[id] = -std::numeric_limits<float>::infinity();
}

void sample_tokens(std::span<const SampleJob> jobs, int vocab, ThreadPool& pool,
                   std::vector<std::vector<float>>& scratch) {
  const int64_t n = int64_t(jobs.size());
  const int parts = int(std::min<int64_t>(n, pool.size()));
  if (parts == 0) return;
  if (scratch.size() < size_t(parts)) scratch.resize(parts);
  auto run = [&](int64_t part) {
    for (int64_t i = n * part / parts; i < n * (part + 1) / parts; ++i) {  // (the runner's prompt log-probs stay)
      SampleResult r = sample_token(jobs[i].logits, vocab, *jobs[i].params, jobs[i].rng_step, scratch[part]);
      jobs[i].out->token = r.token;
      jobs[i].out->logprob = r.logprob;
      jobs[i].out->top = std::move(r.top);
    }
  };
  if (parts == 1) return run(0);
  pool.parallel_for(parts, [&](int64_t b, int64_t e) {
    for (int64_t part = b; part < e; ++part) run(part);
  });
}

}  // namespace mx
