// Filtered sampling on the GPU (kernels/sampling/sample_filtered.h) against its CPU reference: the same
// token for every row (same kept set, same stream), the rows it must leave alone untouched, and the
// draws' distribution over the kept set.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/sampling/sample_filtered.h"
#include "model/sampler.h"
#include "tests/kernels/gpu_test_util.h"

namespace mx::test {
namespace {

struct Rows {
  std::vector<float> logits, inv_temp, top_p, min_p;
  std::vector<int32_t> top_k;
  std::vector<uint64_t> keys;
};

std::vector<int32_t> run(const Rows& r, int S, int stride, int V, std::vector<float>* lp = nullptr,
                         bool one_cta = false) {
  DevBuf<float> dl(r.logits), dit(r.inv_temp), dtp(r.top_p), dmp(r.min_p);
  DevBuf<float> dlp{size_t(S)};
  DevBuf<int32_t> dtk(r.top_k), dtok(std::vector<int32_t>(S, -7));
  DevBuf<uint64_t> dk(r.keys);
  cuda::SampleFilterParams p;
  p.logits = dl.p; p.stride = stride; p.V = V; p.S = S; p.inv_temp = dit.p; p.keys = dk.p; p.top_k = dtk.p;
  p.top_p = dtp.p; p.min_p = dmp.p; p.tok = dtok.p; p.logprob = dlp.p; p.one_cta_per_row = one_cta;
  cuda::sample_filtered(p, 0);
  if (lp) *lp = dlp.get();
  return dtok.get();
}

double log_softmax_at(const float* row, int V, int id) {
  double mx = -INFINITY, z = 0;
  for (int i = 0; i < V; ++i) mx = std::max(mx, double(row[i]));
  for (int i = 0; i < V; ++i) z += std::exp(double(row[i]) - mx);
  return row[id] - mx - std::log(z);
}

class SampleFilteredPaths : public ::testing::TestWithParam<bool> {};  // cluster per row / one CTA per row

TEST_P(SampleFilteredPaths, MatchesReferenceOnEveryRow) {
  // Odd vocabulary, a vocab limit below the row length (the ids past it carry the largest logits),
  // rows with exact ties (logits in steps of 0.25), every filter alone and combined.
  const int stride = 50021, V = 50000, S = 120;
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.f, 2.5f);
  Rows r;
  r.logits.resize(size_t(S) * stride);
  const int ks[] = {0, 1, 7, 50, 1000};
  const float ps[] = {1.f, 0.95f, 0.6f, 0.05f}, mps[] = {0.f, 0.02f, 0.3f}, temps[] = {0.7f, 1.f, 1.6f};
  for (int s = 0; s < S; ++s) {
    float* row = &r.logits[size_t(s) * stride];
    for (int i = 0; i < stride; ++i) row[i] = nd(rng);
    if (s % 3 == 1)
      for (int i = 0; i < stride; ++i) row[i] = std::round(row[i] * 4.f) / 4.f;  // many exact ties
    for (int i = V; i < stride; ++i) row[i] = 60.f;                              // past the limit
    if (s % 17 == 3) row[5] = row[9] = -INFINITY;
    if (s % 19 == 4) row[11] = NAN;
    r.top_k.push_back(ks[s % 5]);
    r.top_p.push_back(ps[(s / 5) % 4]);
    r.min_p.push_back(mps[(s / 20) % 3]);
    r.inv_temp.push_back(1.f / temps[(s / 60) % 2 + (s % 2)]);
    r.keys.push_back(sample_stream_key(1234 + s, s));
  }
  r.inv_temp[0] = 0.f;  // greedy: left alone
  std::vector<float> lp;
  const auto tok = run(r, S, stride, V, &lp, GetParam());
  int filtered = 0;
  for (int s = 0; s < S; ++s) {
    const float* row = &r.logits[size_t(s) * stride];
    const bool filter = r.inv_temp[s] > 0.f && (r.top_k[s] > 0 || r.top_p[s] < 1.f || r.min_p[s] > 0.f);
    if (!filter) {
      EXPECT_EQ(tok[s], -7) << "row " << s << " has no filter and must keep the earlier pick";
      continue;
    }
    ++filtered;
    const int want = cuda::sample_filtered_ref(row, V, r.inv_temp[s], r.keys[s], r.top_k[s], r.top_p[s], r.min_p[s]);
    ASSERT_EQ(tok[s], want) << "row " << s << " top_k " << r.top_k[s] << " top_p " << r.top_p[s] << " min_p "
                            << r.min_p[s] << " inv_temp " << r.inv_temp[s];
    std::vector<float> finite(row, row + V);
    for (float& x : finite) x = x > -INFINITY ? x : -INFINITY;
    EXPECT_NEAR(lp[s], log_softmax_at(finite.data(), V, want), 1e-4) << "row " << s;
  }
  EXPECT_GT(filtered, 80);
}
INSTANTIATE_TEST_SUITE_P(SampleFiltered, SampleFilteredPaths, ::testing::Values(false, true));

TEST(SampleFiltered, TopKOneIsTheGreedyPickWithTies) {
  const int V = 3001, S = 4;
  Rows r;
  r.logits.assign(size_t(S) * V, 0.f);
  for (int s = 0; s < S; ++s) {
    r.logits[size_t(s) * V + 2000] = 3.f;
    r.logits[size_t(s) * V + 17 + s] = 3.f;  // the tie: the lower id wins
    r.top_k.push_back(1);
    r.top_p.push_back(1.f);
    r.min_p.push_back(0.f);
    r.inv_temp.push_back(1.f);
    r.keys.push_back(sample_stream_key(7, s));
  }
  const auto tok = run(r, S, V, V);
  for (int s = 0; s < S; ++s) EXPECT_EQ(tok[s], 17 + s);
}

TEST(SampleFiltered, AllMaskedRowIsLeftAlone) {
  Rows r;
  r.logits.assign(1000, -INFINITY);
  r.logits[3] = NAN;
  r.top_k = {5};
  r.top_p = {0.5f};
  r.min_p = {0.f};
  r.inv_temp = {1.f};
  r.keys = {1};
  EXPECT_EQ(run(r, 1, 1000, 1000)[0], -7);
}

TEST(SampleFiltered, DrawsFollowTheKeptWeights) {
  // One logit row shared by all draws (stride 0); top_p 0.7 of a spread distribution keeps a few dozen
  // tokens. Every draw must be in the kept set and each token's frequency within 5 sigma.
  const int V = 2000, S = 16384;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.5f);
  Rows r;
  r.logits.resize(V);
  for (float& x : r.logits) x = nd(rng);
  const float top_p = 0.7f, it = 1.f / 0.9f;
  for (int s = 0; s < S; ++s) {
    r.top_k.push_back(0);
    r.top_p.push_back(top_p);
    r.min_p.push_back(0.f);
    r.inv_temp.push_back(it);
    r.keys.push_back(sample_stream_key(99, s));
  }
  const auto tok = run(r, S, 0, V);
  // The kept set and its weights, in double, by sorting.
  std::vector<int> idx(V);
  for (int i = 0; i < V; ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](int a, int b) { return r.logits[a] > r.logits[b]; });
  const float mx = r.logits[idx[0]];
  std::vector<double> w(V);
  double total = 0;
  for (int i = 0; i < V; ++i) total += w[i] = std::exp(double((r.logits[i] - mx) * it));
  double cum = 0;
  size_t n = 0;
  while (n < idx.size() && cum < top_p * total) cum += w[idx[n++]];
  std::vector<int> count(V, 0);
  for (int t : tok) ++count[t];
  std::vector<bool> kept(V, false);
  for (size_t j = 0; j < n; ++j) kept[idx[j]] = true;
  for (int i = 0; i < V; ++i) {
    if (!kept[i]) {
      ASSERT_EQ(count[i], 0) << "token " << i << " is outside the top_p set";
      continue;
    }
    const double p = w[i] / cum, sd = std::sqrt(S * p * (1 - p));
    EXPECT_NEAR(count[i], S * p, 5 * sd + 1) << "token " << i;
  }
  EXPECT_GT(n, 10u);
}

}  // namespace
}  // namespace mx::test
