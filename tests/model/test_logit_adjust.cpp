// The step's logit-adjustment list (model/logit_adjust.h) against the host's adjust_row_logits: the
// entries applied as the device kernel applies them give the same logits bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/parallel.h"
#include "model/logit_adjust.h"
#include "model/sampler.h"

namespace {

struct Case {
  std::vector<int32_t> banned, history;
  std::vector<mx::LogitBias> bias;
  mx::SeqStep q;
};

// A row with every kind of adjustment on ids that overlap: biases (some on banned ids), duplicate bans,
// ids outside the vocabulary, a history with repeats in both the prompt and the output.
Case random_case(std::mt19937& rng, int vocab, const mx::SamplingParams& p) {
  Case c;
  std::uniform_int_distribution<int> id(0, vocab - 1), pick(0, 9);
  std::uniform_real_distribution<float> b(-100.f, 100.f);
  for (int i = 0; i < 300; ++i) c.history.push_back(pick(rng) < 3 ? id(rng) % 40 : id(rng));
  c.history.push_back(vocab + 3);
  c.history.push_back(-1);
  for (int i = 0; i < 20; ++i) c.banned.push_back(pick(rng) < 5 ? c.history[size_t(id(rng)) % 300] : id(rng));
  c.banned.push_back(c.banned[0]);
  c.banned.push_back(vocab);
  std::vector<char> used(size_t(vocab), 0);
  for (int i = 0; i < 50; ++i) {
    const int32_t x = pick(rng) < 5 ? c.history[size_t(id(rng)) % 300] : id(rng);
    if (!used[size_t(x)]) c.bias.push_back({x, b(rng)});
    used[size_t(x)] = 1;
  }
  c.bias.push_back({vocab + 1, 5.f});
  c.q.sampling = p;
  c.q.banned = c.banned;
  c.q.logit_bias = c.bias;
  c.q.history = c.history;
  c.q.prompt_len = 120;
  return c;
}

TEST(LogitAdjust, EntriesGiveTheHostsLogitsExactly) {
  const int V = 1000, R = 5;
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0, 4);
  std::vector<mx::SamplingParams> ps(R);
  ps[0].repetition_penalty = 1.3f;
  ps[1].presence_penalty = 0.5f;
  ps[1].frequency_penalty = -0.7f;
  ps[2].repetition_penalty = 0.8f;
  ps[2].presence_penalty = -1.5f;
  ps[2].frequency_penalty = 2.f;
  ps[3].frequency_penalty = 0.3f;  // ps[4]: biases and bans only
  std::vector<Case> cases;
  for (int r = 0; r < R; ++r) cases.push_back(random_case(rng, V, ps[size_t(r)]));
  std::vector<float> lg(size_t(R) * V);
  for (float& x : lg) x = n(rng);
  lg[5] = 0.f;
  lg[6] = -0.f;
  std::vector<float> want = lg;
  std::vector<int32_t> scratch;
  for (int r = 0; r < R; ++r) mx::adjust_row_logits(want.data() + size_t(r) * V, V, cases[size_t(r)].q, scratch);

  mx::LogitAdjustBuilder builder(V);
  std::vector<mx::LogitAdjustEntry> entries(size_t(R) * V);
  int count = 0;
  for (int r = 0; r < R; ++r) ASSERT_TRUE(builder.add_row(r, cases[size_t(r)].q, entries.data(), count, int(entries.size())));
  entries.resize(size_t(count));
  std::vector<char> seen(size_t(R) * V, 0);
  for (const mx::LogitAdjustEntry& e : entries) {  // one entry an (row, id), every id inside the vocabulary
    ASSERT_TRUE(e.row >= 0 && e.row < R && e.id >= 0 && e.id < V);
    EXPECT_FALSE(seen[size_t(e.row) * V + size_t(e.id)]);
    seen[size_t(e.row) * V + size_t(e.id)] = 1;
  }
  std::vector<float> got = lg;
  mx::apply_logit_adjustments(got.data(), V, 0, V, entries, 0, R);
  for (int r = 0; r < R; ++r)
    EXPECT_EQ(std::memcmp(got.data() + size_t(r) * V, want.data() + size_t(r) * V, size_t(V) * 4), 0) << "row " << r;

  // A vocabulary slice and a window of rows (a tensor-parallel rank): only those logits change.
  const int id0 = 300, nid = 400, s0 = 1, S = 3;
  std::vector<float> part = lg;
  mx::apply_logit_adjustments(part.data() + size_t(s0) * V + id0, V, id0, nid, entries, s0, S);
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < V; ++i) {
      const bool in = r >= s0 && r < s0 + S && i >= id0 && i < id0 + nid;
      const float x = part[size_t(r) * V + i], y = (in ? want : lg)[size_t(r) * V + i];
      ASSERT_EQ(std::memcmp(&x, &y, 4), 0) << "row " << r << " id " << i;
    }
}

// A row that does not fit what is left of the list appends nothing and leaves the builder clean for the
// next row; a row without adjustments has no entries.
TEST(LogitAdjust, RowPastTheCapAppendsNothing) {
  const int V = 500;
  mx::LogitAdjustBuilder builder(V);
  std::vector<int32_t> hist = {1, 2, 3, 2, 4, 5, 6, 7, 8, 9};
  mx::SeqStep q;
  q.sampling.repetition_penalty = 1.5f;
  q.history = hist;
  q.prompt_len = 4;
  std::vector<mx::LogitAdjustEntry> out(16);
  int n = 0;
  EXPECT_TRUE(builder.add_row(0, q, out.data(), n, 16));
  EXPECT_EQ(n, 9);  // the distinct ids
  EXPECT_FALSE(builder.add_row(1, q, out.data(), n, 16));
  EXPECT_EQ(n, 9);
  mx::SeqStep plain;
  EXPECT_FALSE(mx::LogitAdjustBuilder::needed(plain));
  EXPECT_TRUE(builder.add_row(1, plain, out.data(), n, 16));
  EXPECT_EQ(n, 9);
  mx::SeqStep pres;  // presence only: the output's ids, once each, and nothing for the prompt's
  pres.sampling.presence_penalty = 1.f;
  pres.history = hist;
  pres.prompt_len = 4;
  EXPECT_TRUE(builder.add_row(2, pres, out.data(), n, 16));
  EXPECT_EQ(n, 9 + 6);
  for (int i = 9; i < n; ++i) {
    EXPECT_EQ(out[size_t(i)].row, 2);
    EXPECT_EQ(out[size_t(i)].rep, 1.f);
    EXPECT_EQ(out[size_t(i)].sub, 1.f);
  }
}

// A step's list over several steps, penalized rows kept per sequence: each step's entries are the ones the
// builder makes row by row from the whole history (in another order): histories that grow by one token,
// by many (counted again), one replaced under the same sequence id, biases and bans that change, rows
// built on a pool's threads. Every row fits a list of their bounds; in a shorter one a row past what is
// left samples on the host and leaves no entry.
TEST(LogitAdjust, ListKeepsSequencesAcrossSteps) {
  const int V = 20000, R = 40, P = 300;
  std::mt19937 rng(5);
  std::vector<Case> cases;
  mx::SamplingParams p;
  p.repetition_penalty = 1.2f;
  p.frequency_penalty = 0.4f;
  mx::SamplingParams pres;
  pres.presence_penalty = -0.5f;
  for (int r = 0; r < R; ++r) {
    cases.push_back(random_case(rng, V, r % 4 == 3 ? mx::SamplingParams{} : r % 4 == 1 ? pres : p));
    std::uniform_int_distribution<int> id(0, V - 1);
    while (cases.back().history.size() < 800) cases.back().history.push_back(id(rng) % (r % 5 == 0 ? 50 : V));
    cases.back().q.seq_id = 100 + r;
  }
  auto key = [](const mx::LogitAdjustEntry& e) { return std::pair(e.row, e.id); };
  auto by_key = [&](std::vector<mx::LogitAdjustEntry> v) {
    std::sort(v.begin(), v.end(), [&](auto& a, auto& b) { return key(a) < key(b); });
    return v;
  };
  mx::ThreadPool pool(4);
  mx::LogitAdjustList list(V, pool);
  mx::LogitAdjustBuilder one(V);
  int len = P + 2;
  for (int step = 0; step < 8; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    len += step == 4 ? 150 : 1;  // step 4: many tokens at once
    if (step == 5) {             // row 6's history replaced, the same sequence id
      std::shuffle(cases[6].history.begin(), cases[6].history.end(), rng);
    }
    std::vector<mx::LogitAdjustEntry> want(size_t(R) * 2000);
    int nwant = 0, bounds = 0;
    for (int r = 0; r < R; ++r) {
      mx::SeqStep& q = cases[size_t(r)].q;
      q.history = std::span<const int32_t>(cases[size_t(r)].history).first(size_t(len));
      q.prompt_len = P;
      q.banned = std::span<const int32_t>(cases[size_t(r)].banned).first(size_t(step % 3) * 5);
      q.logit_bias = std::span<const mx::LogitBias>(cases[size_t(r)].bias).first(size_t(step % 2) * 20);
      one.add_row(r, q, want.data(), nwant, int(want.size()));
      bounds += len + int(q.logit_bias.size() + q.banned.size());
    }
    want.resize(size_t(nwant));
    const int cap = step == 6 ? nwant - 300 : bounds;
    std::vector<mx::LogitAdjustEntry> got(size_t(cap) + 10);
    list.begin(got.data(), cap);
    std::vector<char> fit(R);
    for (int r = 0; r < R; ++r) fit[size_t(r)] = list.add(r, cases[size_t(r)].q);
    const int n = list.finish();
    ASSERT_LE(n, cap);
    got.resize(size_t(n));
    std::vector<mx::LogitAdjustEntry> expect;
    for (const auto& e : want)
      if (fit[size_t(e.row)]) expect.push_back(e);
    got = by_key(got);
    expect = by_key(expect);
    ASSERT_EQ(got.size(), expect.size());
    EXPECT_EQ(std::memcmp(got.data(), expect.data(), got.size() * sizeof(mx::LogitAdjustEntry)), 0);
    const int missing = int(std::count(fit.begin(), fit.end(), 0));
    EXPECT_EQ(missing > 0, step == 6);
  }
  EXPECT_EQ(list.sequences_kept(), size_t(R - R / 4));  // the penalized ones
  std::vector<mx::LogitAdjustEntry> none(4);
  for (int step = 0; step < mx::LogitAdjustList::kForgetSteps * 2; ++step) {  // steps without them
    list.begin(none.data(), 4);
    list.finish();
  }
  EXPECT_EQ(list.sequences_kept(), 0u);
}

}  // namespace
