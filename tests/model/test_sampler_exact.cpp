// The sort-free sampler must return exactly what the straightforward sort-everything sampler
// returns: same token for the same (logits, params, seed, step), bit-identical logprobs and
// top_logprobs. reference_sample below is that straightforward sampler, kept verbatim.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "model/sampler.h"

namespace {

mx::SampleResult reference_sample(const float* logits, int vocab, const mx::SamplingParams& p, uint64_t rng_step) {
  mx::SampleResult r;
  float mx = -std::numeric_limits<float>::infinity();
  int argmax = 0;
  for (int i = 0; i < vocab; ++i)
    if (logits[i] > mx) {
      mx = logits[i];
      argmax = i;
    }
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  const float log_z = float(mx + std::log(sum));
  auto better = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (p.temperature <= 0.0f) {
    r.token = argmax;
  } else {
    std::vector<int> idx(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    int keep = vocab;
    if (p.top_k > 0 && p.top_k < vocab) {
      keep = p.top_k;
      std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), better);
    } else {
      std::sort(idx.begin(), idx.end(), better);
    }
    std::vector<float> w(keep);
    for (int j = 0; j < keep; ++j) w[j] = float(std::exp(double(logits[idx[j]] - mx) / p.temperature));
    int n = keep;
    if (p.min_p > 0.0f) {
      float thr = p.min_p * w[0];
      while (n > 1 && w[n - 1] < thr) --n;
    }
    if (p.top_p < 1.0f) {
      double cum = 0, total = 0;
      for (int j = 0; j < n; ++j) total += w[j];
      int m = 0;
      while (m < n) {
        cum += w[m++];
        if (cum >= p.top_p * total) break;
      }
      n = std::max(m, 1);
    }
    double total = 0;
    for (int j = 0; j < n; ++j) total += w[j];
    double u = mx::sample_uniform(p.seed, rng_step) * total, cum = 0;
    r.token = idx[n - 1];
    for (int j = 0; j < n; ++j) {
      cum += w[j];
      if (u < cum) {
        r.token = idx[j];
        break;
      }
    }
  }
  r.logprob = logits[r.token] - log_z;
  if (p.top_logprobs > 0) {
    int k = std::min(p.top_logprobs, vocab);
    std::vector<int> idx(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
    for (int j = 0; j < k; ++j) r.top.emplace_back(idx[j], logits[idx[j]] - log_z);
  }
  return r;
}

// Logit shapes that stress different parts: spread, many exact ties, a dominant token, masked
// (-inf) ids, a large common offset (float subtraction rounds), and weights straddling 2^-53.
std::vector<float> make_logits(std::mt19937_64& g, int vocab, int shape) {
  std::vector<float> l(vocab);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(0, 4);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int i = 0; i < vocab; ++i) {
    switch (shape) {
      case 0: l[i] = 3.0f * normal(g); break;
      case 1: l[i] = float(small(g)); break;                              // ties everywhere
      case 2: l[i] = 0.5f * normal(g); break;                             // nearly flat
      case 3: l[i] = 2.0f * normal(g) + (i == vocab / 3 ? 25.0f : 0.0f); break;  // peaked
      case 4: l[i] = unit(g) < 0.3f ? -std::numeric_limits<float>::infinity() : normal(g); break;
      case 5: l[i] = 1000.0f + 8.0f * normal(g); break;
      case 6: l[i] = i == 0 ? 0.0f : -36.0f - 1.5f * unit(g); break;      // weights near 2^-53
      default: l[i] = float(small(g)) * 0.25f + (unit(g) < 0.5f ? 0.0f : 10.0f * normal(g)); break;
    }
  }
  if (shape == 4 && vocab > 0) l[g() % vocab] = 1.0f;  // at least one finite logit
  return l;
}

void expect_same(const std::vector<float>& l, const mx::SamplingParams& p, uint64_t step, std::vector<float>& scratch) {
  const int vocab = int(l.size());
  mx::SampleResult want = reference_sample(l.data(), vocab, p, step);
  mx::SampleResult got = mx::sample_token(l.data(), vocab, p, step, scratch);
  ASSERT_EQ(got.token, want.token) << "T " << p.temperature << " top_p " << p.top_p << " top_k " << p.top_k << " min_p "
                                   << p.min_p << " seed " << p.seed << " step " << step << " vocab " << vocab;
  ASSERT_EQ(got.logprob, want.logprob);
  ASSERT_EQ(got.top, want.top);
}

TEST(SamplerExact, MatchesReferenceOnRandomInputs) {
  std::mt19937_64 g(12345);
  const float temps[] = {0.0f, 0.05f, 0.3f, 0.7f, 1.0f, 1.0f, 1.5f, 3.0f};
  const float top_ps[] = {1.0f, 1.0f, 0.99f, 0.9f, 0.5f, 0.05f};
  const float min_ps[] = {0.0f, 0.0f, 0.001f, 0.05f, 0.3f, 1.0f};
  const int vocabs[] = {1, 2, 3, 7, 64, 1000, 5000};
  std::vector<float> scratch;
  for (int trial = 0; trial < 3000; ++trial) {
    const int vocab = vocabs[g() % std::size(vocabs)];
    std::vector<float> l = make_logits(g, vocab, int(g() % 8));
    mx::SamplingParams p;
    p.temperature = temps[g() % std::size(temps)];
    p.top_p = top_ps[g() % std::size(top_ps)];
    p.min_p = min_ps[g() % std::size(min_ps)];
    const int top_ks[] = {0, 0, 0, 1, 3, 40, 2000, vocab - 1, vocab, vocab + 3};
    p.top_k = std::max(0, top_ks[g() % std::size(top_ks)]);
    const int top_lps[] = {0, 0, 1, 5, 20};
    p.top_logprobs = top_lps[g() % std::size(top_lps)];
    p.seed = g();
    for (int s = 0; s < 4; ++s) ASSERT_NO_FATAL_FAILURE(expect_same(l, p, g() % 1000, scratch));
  }
}

// The production vocabulary: equality, plus the time per sampled token (printed, not asserted).
TEST(SamplerExact, FullVocabularyMatchesAndTiming) {
  const int vocab = 201088;
  std::mt19937_64 g(7);
  std::vector<float> scratch;
  struct Case {
    const char* name;
    float temperature, top_p, min_p;
    int top_k, top_logprobs;
  };
  const Case cases[] = {{"T=1 top_p=1", 1.0f, 1.0f, 0.0f, 0, 0},      {"T=1 top_p=0.9", 1.0f, 0.9f, 0.0f, 0, 0},
                        {"T=0.7 top_p=0.9", 0.7f, 0.9f, 0.0f, 0, 0},  {"T=1 min_p=0.05", 1.0f, 1.0f, 0.05f, 0, 0},
                        {"T=1 top_k=50", 1.0f, 1.0f, 0.0f, 50, 0},    {"greedy top_logprobs=20", 0.0f, 1.0f, 0.0f, 0, 20}};
  for (int shape : {0, 3, 5}) {
    std::vector<float> l = make_logits(g, vocab, shape);
    for (const Case& c : cases) {
      mx::SamplingParams p{.temperature = c.temperature, .top_p = c.top_p, .top_k = c.top_k, .min_p = c.min_p,
                           .seed = g(), .top_logprobs = c.top_logprobs};
      using clock = std::chrono::steady_clock;
      const int reps = 10;
      double fast_ms = 1e9, ref_ms = 1e9;
      for (int s = 0; s < reps; ++s) {
        auto t0 = clock::now();
        mx::SampleResult got = mx::sample_token(l.data(), vocab, p, s, scratch);
        auto t1 = clock::now();
        mx::SampleResult want = reference_sample(l.data(), vocab, p, s);
        auto t2 = clock::now();
        fast_ms = std::min(fast_ms, std::chrono::duration<double, std::milli>(t1 - t0).count());
        ref_ms = std::min(ref_ms, std::chrono::duration<double, std::milli>(t2 - t1).count());
        ASSERT_EQ(got.token, want.token) << c.name << " shape " << shape << " step " << s;
        ASSERT_EQ(got.logprob, want.logprob);
        ASSERT_EQ(got.top, want.top);
      }
      std::printf("[ timing ] vocab %d shape %d %-24s sample_token %.3f ms, reference %.3f ms (best of %d)\n", vocab,
                  shape, c.name, fast_ms, ref_ms, reps);
    }
  }
}

}  // namespace
