// Sliding-window layers' own block tables: a sequence holds their blocks only from the window of its
// next computed position on, gives older ones back, and the prefix cache reuses them exactly. The
// fake runner reads its prefix digest through the sliding table and checks every window position
// against the full table, so a missing, stale or shared sliding block changes the outputs or counts
// a mismatch.
#include <gtest/gtest.h>

#include <numeric>

#include "runtime/block_pool.h"
#include "runtime/engine.h"
#include "tests/unit/runtime/fake_runner.h"

namespace mx::runtime {
namespace {

using fake::FakeRunner;
using fake::seq;
using fake::Output;

// Submits all prompts at once and steps until everything finished.
std::vector<Output> run_together(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  std::vector<std::shared_ptr<Channel>> chs;
  for (const auto& p : prompts) {
    GenRequest g;
    g.prompt = p;
    g.max_tokens = max_tokens;
    chs.push_back(std::make_shared<Channel>());
    EXPECT_TRUE(e.submit(g, chs.back()));
  }
  for (int i = 0; i < 5000 && e.step(); ++i) {}
  std::vector<Output> outs;
  for (auto& ch : chs) outs.push_back(fake::drain_output(*ch));
  return outs;
}

std::vector<Output> run_each(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  std::vector<Output> outs;
  for (const auto& p : prompts) outs.push_back(run_together(e, {p}, max_tokens)[0]);
  return outs;
}

TEST(SlidingBlockPool, KindsDoNotMatchEachOther) {
  BlockPool pool(4, 2, true);
  const std::vector<int32_t> t = {1, 2};
  const int32_t full = pool.allocate(), sliding = pool.allocate();
  pool.register_block(full, 7, -1, t);
  pool.register_block(sliding, 8, -1, t, true);
  EXPECT_EQ(pool.match_block(8, -1, t), -1);        // a sliding block never answers a full lookup
  EXPECT_EQ(pool.match_block(7, -1, t, true), -1);  // nor the other way round
  EXPECT_EQ(pool.match_block(8, -1, t, true), sliding);
  pool.release(sliding);
  pool.release(sliding);
  pool.release(full);
  EXPECT_EQ(pool.num_free(), 4);
}

TEST(SlidingBlocks, LongRequestHoldsOnlyTheWindow) {
  // 50 positions need 13 full blocks; keeping the sliding layers' blocks for all of them would need
  // 26 of the 18. The window (5) plus an 8-token chunk spans at most 4 blocks.
  FakeRunner r(18, 4, 5);
  Engine e(r, {.max_num_seqs = 2, .max_num_batched_tokens = 8, .enable_prefix_caching = false});
  auto outs = run_together(e, {seq(10, 30)}, 20);
  FakeRunner plain(64, 4);
  Engine pe(plain, {.max_num_seqs = 2, .max_num_batched_tokens = 8, .enable_prefix_caching = false});
  auto ref = run_together(pe, {seq(10, 30)}, 20);
  EXPECT_EQ(outs[0].finish, FinishReason::kLength);
  EXPECT_EQ(outs[0].tokens, ref[0].tokens);
  EXPECT_EQ(outs[0].logprobs, ref[0].logprobs);
  EXPECT_EQ(e.stats().preemptions, 0u);
  EXPECT_EQ(r.sliding_mismatches, 0);
  EXPECT_EQ(e.stats().kv_usage, 0.0);
}

TEST(SlidingBlocks, PreemptionAndPrefixCachingStayExact) {
  const auto base = seq(10, 13);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    auto p = base;
    p.push_back(700 + i);
    prompts.push_back(p);
  }
  FakeRunner plain(256, 4);
  Engine pe(plain, {.enable_prefix_caching = false});
  auto ref = run_each(pe, prompts, 12);
  for (int blocks : {14, 40}) {  // tight (preemption) and roomy
    FakeRunner r(blocks, 4, 5);
    Engine e(r, {.max_num_seqs = 8, .max_num_batched_tokens = 16});
    auto first = run_each(e, {prompts[0]}, 12);  // populates the cache
    auto outs = run_together(e, prompts, 12);
    EXPECT_EQ(first[0].tokens, ref[0].tokens);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(outs[i].tokens, ref[i].tokens) << blocks << " " << i;
      EXPECT_EQ(outs[i].logprobs, ref[i].logprobs) << blocks << " " << i;
    }
    EXPECT_EQ(r.sliding_mismatches, 0) << blocks;
    EXPECT_GT(e.stats().prefix_cache_hits, 0u) << blocks;
    EXPECT_EQ(e.stats().kv_usage, 0.0) << blocks;
    if (blocks == 14) {
      EXPECT_GE(e.stats().preemptions, 1u);
    }
  }
}

TEST(SlidingBlocks, CachedPrefixNeedsItsWindowsSlidingBlocks) {
  const auto a = seq(10, 21), b = seq(400, 30);
  FakeRunner plain(64, 4);
  Engine pe(plain, {.enable_prefix_caching = false});
  auto ref = run_each(pe, {a, b}, 2);
  // Roomy: the second run of `a` reuses all 5 full blocks and the window's sliding blocks.
  {
    FakeRunner r(64, 4, 5);
    Engine e(r, {});
    auto outs = run_each(e, {a, a}, 2);
    EXPECT_EQ(outs[1].cached_tokens, 20);
    EXPECT_EQ(outs[1].logprobs, ref[0].logprobs);
    EXPECT_EQ(r.sliding_mismatches, 0);
  }
  // Tight, in chunks of 4: `b` (8 full + at most 3 sliding blocks at a time) takes the free blocks,
  // then evicts the least recently freed cached ones, `a`'s sliding blocks first (released as its
  // window moved, and first at its finish). Without the sliding block of its window a cached prefix
  // is cut back, here to nothing, and `a` is recomputed, exactly.
  {
    FakeRunner r(16, 4, 5);
    Engine e(r, {.max_num_batched_tokens = 4});
    auto outs = run_each(e, {a, b}, 2);
    outs.push_back(run_each(e, {a}, 2)[0]);
    EXPECT_EQ(outs[1].logprobs, ref[1].logprobs);
    EXPECT_EQ(outs[2].logprobs, ref[0].logprobs);
    EXPECT_EQ(outs[2].cached_tokens, 0);
    EXPECT_EQ(r.sliding_mismatches, 0);
    EXPECT_EQ(e.stats().kv_usage, 0.0);
  }
}

}  // namespace
}  // namespace mx::runtime
