// Known tokens' log-probs on the GPU (kernels/sampling/token_logprobs.h) against the host's token_logprob
// (model/sampler.h): odd vocabularies, ids past V left out, ties in the top ids, masked (-inf) logits, a
// target past V. Tolerance: log-probs within 2e-5 (the host sums in double, the GPU in float over
// rescaled partial sums); ranks and top ids exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/sampling/token_logprobs.h"
#include "model/sampler.h"
#include "tests/kernels/gpu_test_util.h"

namespace mx::test {
namespace {

// With `subset`, the launch reads every other row from the last back (row_index) and writes them in order.
void check(int rows, int stride, int V, int top, uint32_t seed, bool ties, bool subset = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> logits(size_t(rows) * stride);
  for (auto& x : logits) x = ties ? std::round(nd(rng)) : nd(rng);  // rounded: many equal logits
  for (int r = 0; r < rows; r += 3) logits[size_t(r) * stride + size_t(r % V)] = -INFINITY;  // a masked id
  std::vector<int32_t> targets(rows);
  for (int r = 0; r < rows; ++r) targets[size_t(r)] = int32_t(rng() % uint32_t(stride));  // some past V
  std::vector<int32_t> index;
  for (int r = rows - 1; r >= 0; r -= subset ? 2 : 1) index.push_back(r);
  if (!subset) index.clear();
  const int launched = subset ? int(index.size()) : rows;
  DevBuf<float> dl(logits), dout{size_t(rows) * cuda::kTokenLogprobFloats};
  DevBuf<int32_t> dt(targets), di(index);
  cuda::TokenLogprobParams p;
  p.logits = dl.p; p.stride = stride; p.V = V; p.rows = launched; p.targets = dt.p; p.top = top; p.out = dout.p;
  p.row_index = subset ? di.p : nullptr;
  cuda::token_logprobs(p, 0);
  const std::vector<float> out = dout.get();
  for (int i = 0; i < launched; ++i) {
    const int r = subset ? index[size_t(i)] : i;
    const float* row = logits.data() + size_t(r) * stride;
    const TokenLogprob want = token_logprob(row, V, targets[size_t(r)], top);
    const float* o = out.data() + size_t(i) * cuda::kTokenLogprobFloats;
    int32_t rank = 0;
    std::memcpy(&rank, o + 1, 4);
    if (std::isinf(want.logprob)) EXPECT_TRUE(std::isinf(o[0]) && o[0] < 0) << r;
    else EXPECT_NEAR(o[0], want.logprob, 2e-5) << "row " << r;
    EXPECT_EQ(rank, want.rank) << "row " << r;
    ASSERT_EQ(int(want.top.size()), top);
    for (int k = 0; k < top; ++k) {
      int32_t id = 0;
      std::memcpy(&id, o + 2 + 2 * k, 4);
      EXPECT_EQ(id, want.top[size_t(k)].first) << "row " << r << " top " << k;
      EXPECT_NEAR(o[3 + 2 * k], want.top[size_t(k)].second, 2e-5) << "row " << r << " top " << k;
    }
  }
}

TEST(TokenLogprobs, MatchHostOnOddVocabularies) {
  check(5, 1037, 1037, 3, 1, false);
  check(7, 1037, 1000, 20, 2, false);   // ids past V never counted or picked
  check(3, 201088, 200019, 5, 3, false);  // gpt-oss's vocabulary, the tokenizer's size
}

TEST(TokenLogprobs, TiesTakeTheLowestIdAndRankCountsOnlyLarger) {
  check(9, 777, 770, 20, 4, true);
  check(2, 40, 33, 20, 5, true);  // fewer distinct values than picks
}

TEST(TokenLogprobs, ASubsetOfRowsByIndex) { check(9, 1037, 1000, 5, 7, false, true); }

TEST(TokenLogprobs, NoAlternativesAndOutOfRangeTop) {
  check(4, 513, 513, 0, 6, false);
  cuda::TokenLogprobParams p;
  p.top = cuda::kTokenLogprobMaxTop + 1;
  EXPECT_ANY_THROW(cuda::token_logprobs(p, 0));
}

}  // namespace
}  // namespace mx::test
