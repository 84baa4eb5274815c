// Host sampler: exact expectations on hand-made logits (greedy ties, logprobs, which ids each
// filter can return) and a statistical check of the sampled distribution with fixed seeds.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "core/parallel.h"
#include "model/sampler.h"

namespace {

mx::SamplingParams params(float temperature) {
  mx::SamplingParams p;
  p.temperature = temperature;
  p.seed = 42;
  return p;
}

// log of a normalized distribution: softmax(logits) == probs exactly up to rounding.
std::vector<float> log_probs(std::vector<double> probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

std::set<int> support(const std::vector<float>& logits, const mx::SamplingParams& p, int draws = 2000) {
  std::set<int> seen;
  std::vector<float> scratch;
  for (int s = 0; s < draws; ++s) seen.insert(mx::sample_token(logits.data(), int(logits.size()), p, s, scratch).token);
  return seen;
}

TEST(Sampler, GreedyTakesLowestIdOnTiesAndReportsRawLogprob) {
  std::vector<float> l = {1, 3, 3, 2};
  std::vector<float> scratch;
  mx::SamplingParams p = params(0.0f);
  p.top_logprobs = 3;
  mx::SampleResult r = mx::sample_token(l.data(), 4, p, 0, scratch);
  EXPECT_EQ(r.token, 1);
  const double lz = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0));
  EXPECT_NEAR(r.logprob, 3 - lz, 1e-6);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].first, 1);
  EXPECT_EQ(r.top[1].first, 2);
  EXPECT_EQ(r.top[2].first, 3);
  EXPECT_NEAR(r.top[2].second, 2 - lz, 1e-6);
}

// Banned ids (min_tokens) are never picked: greedy takes the best allowed id, sampling never draws one.
TEST(Sampler, BannedTokensAreNeverPicked) {
  std::vector<float> l = {0.5f, 3.0f, 2.0f, 2.5f};
  const std::vector<int32_t> ban = {1, 3, 99, -1};  // ids outside the vocabulary are ignored
  mx::ban_tokens(l.data(), 4, ban);
  std::vector<float> scratch;
  EXPECT_EQ(mx::sample_token(l.data(), 4, params(0.0f), 0, scratch).token, 2);
  for (uint64_t s = 0; s < 200; ++s) {
    const int t = mx::sample_token(l.data(), 4, params(1.0f), s, scratch).token;
    EXPECT_TRUE(t == 0 || t == 2) << t;
  }
}

// A constrained row (SeqStep::allowed): every id outside the bits gets -inf after the bans; when the bans
// leave no allowed id, the row stays as the bans left it (never all -inf).
TEST(Sampler, AllowedIdsMaskTheRest) {
  const std::vector<uint64_t> bits = {(1ull << 2) | (1ull << 70 % 64), 1ull << (70 % 64)};  // ids 2, 6, 70
  std::vector<int32_t> scratch;
  mx::SeqStep q;
  q.allowed = bits;
  std::vector<float> l(100, 1.f);
  l[2] = -3.f;
  mx::adjust_row_logits(l.data(), 100, q, scratch);
  for (int id = 0; id < 100; ++id) EXPECT_EQ(std::isinf(l[size_t(id)]), id != 2 && id != 6 && id != 70) << id;
  const std::vector<int32_t> ban = {2, 6, 70};
  q.banned = ban;
  std::vector<float> m(100, 1.f);
  mx::adjust_row_logits(m.data(), 100, q, scratch);
  for (int id = 0; id < 100; ++id) EXPECT_EQ(std::isinf(m[size_t(id)]), id == 2 || id == 6 || id == 70) << id;
}

TEST(Sampler, LogitBiasIsAddedToItsIds) {
  std::vector<float> l = {0.5f, 3.0f, 2.0f, 2.5f};
  const std::vector<mx::LogitBias> bias = {{0, 4.0f}, {1, -100.f}, {7, 50.f}, {-2, 1.f}};  // out of range: ignored
  mx::bias_tokens(l.data(), 4, bias);
  EXPECT_EQ(l, (std::vector<float>{4.5f, -97.0f, 2.0f, 2.5f}));
  std::vector<float> scratch;
  EXPECT_EQ(mx::sample_token(l.data(), 4, params(0.0f), 0, scratch).token, 0);
  const std::vector<int32_t> ban = {0};  // a ban wins over any bias
  mx::ban_tokens(l.data(), 4, ban);
  EXPECT_EQ(mx::sample_token(l.data(), 4, params(0.0f), 0, scratch).token, 3);
}

// vLLM's order: repetition over the prompt and the output's ids (once each), then frequency x count and
// presence once over the output's.
TEST(Sampler, PenaltiesFollowVllm) {
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
  const std::vector<int32_t> history = {0, 4, 1, 1, 3, 9};  // prompt {0, 4}, output {1, 1, 3, 9 (out of range)}
  mx::SamplingParams p = params(0.0f);
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.repetition_penalty = 2.0f;
  std::vector<int32_t> scratch;
  mx::penalize_tokens(l.data(), 5, p, history, 2, scratch);
  EXPECT_EQ(l, (std::vector<float>{1.0f, -3.0f, 0.5f, 0.75f, 0.5f}));
  std::vector<float> m = {2.0f, -1.0f};
  mx::penalize_tokens(m.data(), 2, params(0.0f), history, 2, scratch);  // no penalty: untouched
  EXPECT_EQ(m, (std::vector<float>{2.0f, -1.0f}));
}

TEST(Sampler, LogprobIgnoresTemperature) {
  std::vector<float> l = log_probs({0.5, 0.3, 0.2});
  std::vector<float> scratch;
  for (uint64_t s = 0; s < 50; ++s) {
    mx::SampleResult r = mx::sample_token(l.data(), 3, params(0.3f), s, scratch);
    const double want[3] = {0.5, 0.3, 0.2};
    EXPECT_NEAR(r.logprob, std::log(want[r.token]), 1e-6);
  }
}

TEST(Sampler, FiltersKeepTheRightIds) {
  std::vector<float> l = log_probs({0.3, 0.5, 0.05, 0.15});  // sorted: 1, 0, 3, 2
  mx::SamplingParams p = params(1.0f);
  EXPECT_EQ(support(l, p), (std::set<int>{0, 1, 2, 3}));
  p.top_k = 1;
  EXPECT_EQ(support(l, p), (std::set<int>{1}));
  p.top_k = 2;
  EXPECT_EQ(support(l, p), (std::set<int>{0, 1}));
  p = params(1.0f);
  p.top_p = 0.45f;  // 0.5 alone covers it
  EXPECT_EQ(support(l, p), (std::set<int>{1}));
  p.top_p = 0.55f;
  EXPECT_EQ(support(l, p), (std::set<int>{0, 1}));
  p.top_p = 0.9f;  // 0.5 + 0.3 + 0.15 = 0.95
  EXPECT_EQ(support(l, p), (std::set<int>{0, 1, 3}));
  p = params(1.0f);
  p.min_p = 0.35f;  // keep p >= 0.175
  EXPECT_EQ(support(l, p), (std::set<int>{0, 1}));
  p.min_p = 0.25f;  // keep p >= 0.125
  EXPECT_EQ(support(l, p), (std::set<int>{0, 1, 3}));
  p.min_p = 1.0f;
  EXPECT_EQ(support(l, p), (std::set<int>{1}));
  // Ids beyond `vocab` are never returned, even when they are the best.
  std::vector<float> big = {0.0f, 0.0f, 50.0f};
  std::vector<float> scratch;
  EXPECT_NE(mx::sample_token(big.data(), 2, params(0.0f), 0, scratch).token, 2);
  for (uint64_t s = 0; s < 200; ++s) EXPECT_LT(mx::sample_token(big.data(), 2, params(1.0f), s, scratch).token, 2);
}

TEST(Sampler, ReproducibleFromSeedAndStep) {
  std::vector<float> l = log_probs({0.25, 0.25, 0.25, 0.25});
  std::vector<float> scratch;
  mx::SamplingParams p = params(1.0f);
  std::vector<int> a, b;
  for (uint64_t s = 0; s < 64; ++s) a.push_back(mx::sample_token(l.data(), 4, p, s, scratch).token);
  // Interleave another request's draws: this request's tokens must not change.
  mx::SamplingParams q = params(1.0f);
  q.seed = 7;
  for (uint64_t s = 0; s < 64; ++s) {
    (void)mx::sample_token(l.data(), 4, q, s, scratch);
    b.push_back(mx::sample_token(l.data(), 4, p, s, scratch).token);
  }
  EXPECT_EQ(a, b);
  EXPECT_EQ(std::set<int>(a.begin(), a.end()).size(), 4u);
  EXPECT_EQ(mx::sample_uniform(1, 2), mx::sample_uniform(1, 2));
  EXPECT_NE(mx::sample_uniform(1, 2), mx::sample_uniform(2, 2));
}

// Frequencies over N draws within 5 standard deviations of the intended distribution.
void expect_distribution(const std::vector<float>& logits, const mx::SamplingParams& p, const std::vector<double>& want) {
  const int N = 40000;
  std::vector<int> count(logits.size(), 0);
  std::vector<float> scratch;
  for (int s = 0; s < N; ++s) ++count[mx::sample_token(logits.data(), int(logits.size()), p, s, scratch).token];
  for (size_t i = 0; i < want.size(); ++i) {
    const double f = double(count[i]) / N, sd = std::sqrt(want[i] * (1 - want[i]) / N);
    EXPECT_NEAR(f, want[i], 5 * sd + 1e-12) << "id " << i;
  }
}

TEST(Sampler, DistributionMatchesSoftmax) {
  const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  std::vector<float> l = log_probs(probs);
  expect_distribution(l, params(1.0f), probs);
  // Temperature 2: p^(1/2), renormalized.
  std::vector<double> t2;
  double z = 0;
  for (double p : probs) z += std::sqrt(p);
  for (double p : probs) t2.push_back(std::sqrt(p) / z);
  expect_distribution(l, params(2.0f), t2);
  // top-k 2 renormalizes over the kept ids.
  mx::SamplingParams k2 = params(1.0f);
  k2.top_k = 2;
  expect_distribution(l, k2, {0.625, 0.375, 0, 0});
}

TEST(Sampler, UniformIsInUnitIntervalAndFlat) {
  double sum = 0;
  int below_tenth = 0;
  const int N = 100000;
  for (int s = 0; s < N; ++s) {
    double u = mx::sample_uniform(123, s);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    below_tenth += u < 0.1;
  }
  EXPECT_NEAR(sum / N, 0.5, 5 * std::sqrt(1.0 / 12 / N));
  EXPECT_NEAR(double(below_tenth) / N, 0.1, 5 * std::sqrt(0.09 / N));
}

// Rows sampled on a pool give exactly what one sequential loop gives (each row its own stream),
// for every kind of request mixed in one step, and warm calls reuse the buffers.
TEST(Sampler, SampleTokensOnAPoolEqualsSequential) {
  const int V = 20000, R = 37;
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0, 3);
  std::vector<std::vector<float>> logits(R, std::vector<float>(V));
  for (auto& row : logits)
    for (auto& v : row) v = nd(rng);
  std::vector<mx::SamplingParams> ps(R);
  for (int i = 0; i < R; ++i) {
    ps[i] = params(i % 5 == 0 ? 0.0f : 0.5f + 0.1f * float(i % 7));
    ps[i].seed = 100 + i;
    if (i % 3 == 1) ps[i].top_p = 0.9f;
    if (i % 4 == 2) ps[i].top_k = 40;
    if (i % 6 == 3) ps[i].min_p = 0.05f;
    if (i % 8 == 5) ps[i].top_logprobs = 5;
  }
  std::vector<mx::SampleResult> want(R), got(R);
  std::vector<float> scratch;
  for (int i = 0; i < R; ++i) want[i] = mx::sample_token(logits[i].data(), V, ps[i], 7 + i, scratch);
  mx::ThreadPool pool(4);
  std::vector<std::vector<float>> scratches;
  std::vector<mx::SampleJob> jobs;
  for (int i = 0; i < R; ++i) jobs.push_back({logits[i].data(), &ps[i], uint64_t(7 + i), &got[i]});
  for (int round = 0; round < 2; ++round) {
    mx::sample_tokens(jobs, V, pool, scratches);
    EXPECT_EQ(scratches.size(), 4u);
    for (int i = 0; i < R; ++i) {
      EXPECT_EQ(got[i].token, want[i].token) << i;
      EXPECT_EQ(got[i].logprob, want[i].logprob) << i;
      EXPECT_EQ(got[i].top, want[i].top) << i;
    }
  }
  mx::sample_tokens({}, V, pool, scratches);  // no rows: nothing to do
}

}  // namespace
