// Prefix caching: the pool's hash-chain index and the engine's reuse of cached blocks. The fake
// runner's logprobs carry a digest of the KV prefix each sample was computed from, so a wrongly
// reused block shows up as a logprob mismatch; the CPU-runner test checks real model outputs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>

#include "model/cpu_runner.h"
#include "model/fixture.h"
#include "model/sampler.h"
#include "runtime/block_pool.h"
#include "runtime/engine.h"
#include "tests/unit/runtime/fake_runner.h"

namespace mx::runtime {
namespace {

using fake::FakeRunner;
using fake::seq;
using fake::Output;

uint64_t constant_hash(uint64_t, std::span<const int32_t>) { return 42; }

// Runs each request to completion, one after the other, and returns their outputs.
std::vector<Output> run_each(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                             SamplingParams sp = {}) {
  std::vector<Output> outs;
  for (const auto& p : prompts) {
    auto ch = std::make_shared<Channel>();
    GenRequest g;
    g.prompt = p;
    g.max_tokens = max_tokens;
    g.sampling = sp;
    EXPECT_TRUE(e.submit(g, ch));
    for (int i = 0; i < 1000 && e.step(); ++i) {}
    outs.push_back(fake::drain_output(*ch));
  }
  return outs;
}

TEST(BlockPoolCache, MatchTakesRefsAndFreedBlocksStayCached) {
  BlockPool p(4, 2, /*enable_caching=*/true);
  std::vector<int32_t> toks = {1, 2, 3, 4, 5};
  int32_t a = p.allocate(), b = p.allocate();
  uint64_t ha = p.hash(kRootHash, {toks.data(), 2}), hb = p.hash(ha, {toks.data() + 2, 2});
  p.register_block(a, ha, -1, {toks.data(), 2});
  p.register_block(b, hb, a, {toks.data() + 2, 2});
  p.release(b);
  p.release(a);
  EXPECT_EQ(p.num_free(), 4);  // cached blocks with no references are allocatable
  EXPECT_EQ(p.num_cached(), 2);
  std::vector<uint64_t> hashes;
  EXPECT_EQ(p.match(toks, 2, hashes), (std::vector<int32_t>{a, b}));
  EXPECT_EQ(hashes, (std::vector<uint64_t>{ha, hb}));
  EXPECT_EQ(p.ref_count(a), 1);
  EXPECT_EQ(p.num_free(), 2);
  EXPECT_EQ(p.match(toks, 1, hashes).size(), 1u);  // max_blocks caps the chain
  EXPECT_EQ(p.ref_count(a), 2);
  std::vector<int32_t> other = {1, 2, 9, 9};
  EXPECT_EQ(p.match(other, 2, hashes).size(), 1u);  // diverges in the second block
  for (int32_t x : {a, a, a, b}) p.release(x);
  EXPECT_EQ(p.num_free(), 4);
}

TEST(BlockPoolCache, CollisionMissesAndEvictionUnindexes) {
  BlockPool p(3, 2, true, constant_hash);
  std::vector<int32_t> x = {1, 2, 3, 4}, y = {7, 8, 3, 4};
  int32_t a = p.allocate(), b = p.allocate();
  p.register_block(a, 42, -1, {x.data(), 2});
  p.release(a);
  std::vector<uint64_t> h;
  EXPECT_TRUE(p.match(y, 2, h).empty());  // same hash, other token ids: a miss
  p.release(b);                                  // never registered: plain free list
  EXPECT_EQ(p.allocate(), b);                    // plain free blocks go before cached ones
  BlockPool q(2, 2, true);
  int32_t qa = q.allocate(), qb = q.allocate();
  uint64_t h0 = q.hash(kRootHash, {x.data(), 2}), h1 = q.hash(h0, {x.data() + 2, 2});
  q.register_block(qa, h0, -1, {x.data(), 2});
  q.register_block(qb, h1, qa, {x.data() + 2, 2});
  q.release(qb);
  q.release(qa);                                 // LRU: qb then qa
  int32_t r1 = q.allocate();                     // evicts qb (tail block first)
  EXPECT_EQ(r1, qb);
  EXPECT_EQ(q.match(x, 2, h).size(), 1u);        // qa still cached, qb gone from the index
  q.release(qa);
  q.release(r1);
}

TEST(BlockPoolCache, ReallocatedParentInvalidatesChild) {
  // The child's KV was computed on top of its parent's old contents: once the parent block is
  // reallocated (even if recomputed with the same tokens), the child must not match.
  BlockPool q(2, 2, true);
  std::vector<int32_t> x = {1, 2, 3, 4};
  int32_t pa = q.allocate(), ch = q.allocate();
  uint64_t h0 = q.hash(kRootHash, {x.data(), 2}), h1 = q.hash(h0, {x.data() + 2, 2});
  q.register_block(pa, h0, -1, {x.data(), 2});
  q.register_block(ch, h1, pa, {x.data() + 2, 2});
  q.release(pa);             // the parent goes first, so it is evicted first
  int32_t again = q.allocate();
  EXPECT_EQ(again, pa);
  q.register_block(again, h0, -1, {x.data(), 2});  // recomputed: same contents, new generation
  q.release(ch);
  std::vector<uint64_t> h;
  EXPECT_EQ(q.match(x, 2, h).size(), 1u);  // the child was computed on the old generation
  q.release(again);
  q.release(again);
}

TEST(PrefixCache, HitAfterFinishedRequestSkipsComputeAndMatches) {
  FakeRunner r(64, 4);
  Engine e(r, {.max_num_seqs = 4, .max_num_batched_tokens = 64});
  auto p = seq(10, 10);
  auto outs = run_each(e, {p, p}, 3);
  EXPECT_EQ(outs[0].cached_tokens, 0);
  EXPECT_EQ(outs[1].cached_tokens, 8);  // two full blocks of 4; the partial third is recomputed
  EXPECT_EQ(outs[1].tokens, outs[0].tokens);
  EXPECT_EQ(outs[1].logprobs, outs[0].logprobs);
  // First request: 10 prompt tokens + 2 decodes; second: only the 2 uncached tokens + 2 decodes.
  EXPECT_EQ(r.step_tokens, (std::vector<int>{10, 1, 1, 2, 1, 1}));
  EngineStats st = e.stats();
  EXPECT_EQ(st.prefix_cache_queries, 20u);
  EXPECT_EQ(st.prefix_cache_hits, 8u);
  EXPECT_EQ(st.kv_usage, 0.0);
  EXPECT_GT(st.cached_blocks, 0);
}

TEST(PrefixCache, NeverReusesTheWholePrompt) {
  FakeRunner r(64, 4);
  Engine e(r, {});
  auto p = seq(10, 8);  // exactly two blocks: the last token must still be computed
  auto outs = run_each(e, {p, p}, 2);
  EXPECT_EQ(outs[1].cached_tokens, 4);
  EXPECT_EQ(outs[1].logprobs, outs[0].logprobs);
}

TEST(PrefixCache, PartialBlockPrefixReusesOnlyFullBlocks) {
  FakeRunner r(64, 4);
  Engine e(r, {});
  auto a = seq(10, 10);
  auto b = a;
  b[6] = 500;  // shares 6 tokens: one full block and half of the second
  b[7] = 501;
  auto outs = run_each(e, {a, b}, 2);
  EXPECT_EQ(outs[1].cached_tokens, 4);
  FakeRunner cold(64, 4);
  Engine ce(cold, {.enable_prefix_caching = false});
  auto ref = run_each(ce, {b}, 2);
  EXPECT_EQ(ref[0].cached_tokens, 0);
  EXPECT_EQ(outs[1].tokens, ref[0].tokens);
  EXPECT_EQ(outs[1].logprobs, ref[0].logprobs);
}

TEST(PrefixCache, GeneratedTokensAreCachedForTheNextTurn) {
  FakeRunner r(64, 4);
  Engine e(r, {});
  auto p = seq(10, 6);
  auto first = run_each(e, {p}, 6);  // computes 6 + 5 tokens: two full blocks
  auto turn2 = p;
  turn2.insert(turn2.end(), first[0].tokens.begin(), first[0].tokens.end());
  turn2.push_back(900);
  auto outs = run_each(e, {turn2}, 2);
  EXPECT_EQ(outs[0].cached_tokens, 8);
}

TEST(PrefixCache, EvictionUnderMemoryPressure) {
  FakeRunner r(6, 4);  // 24 tokens of KV
  Engine e(r, {.max_num_seqs = 4, .max_num_batched_tokens = 64});
  auto a = seq(10, 12), b = seq(300, 20);
  auto outs = run_each(e, {a}, 2);
  EXPECT_EQ(e.stats().cached_blocks, 3);
  outs.push_back(run_each(e, {b}, 2)[0]);  // needs all 6 blocks: evicts a's
  outs.push_back(run_each(e, {a}, 2)[0]);
  EXPECT_EQ(outs[1].finish, FinishReason::kLength);
  EXPECT_EQ(outs[2].cached_tokens, 0);      // a's blocks were evicted and unindexed
  EXPECT_EQ(outs[2].logprobs, outs[0].logprobs);
  EXPECT_EQ(outs[2].tokens, outs[0].tokens);
  auto again = run_each(e, {a}, 2);         // cached again now
  EXPECT_EQ(again[0].cached_tokens, 8);
  EXPECT_EQ(again[0].logprobs, outs[0].logprobs);
  EXPECT_EQ(e.stats().kv_usage, 0.0);
}

TEST(PrefixCache, HashCollisionsNeverProduceWrongOutput) {
  FakeRunner r(64, 4);
  Engine e(r, {.block_hash = constant_hash});  // every block collides with every other
  auto a = seq(10, 12), b = seq(600, 12);
  auto outs = run_each(e, {a, b, a}, 3);
  EXPECT_EQ(outs[1].cached_tokens, 0);
  FakeRunner cold(64, 4);
  Engine ce(cold, {.enable_prefix_caching = false});
  auto ref = run_each(ce, {a, b}, 3);
  EXPECT_EQ(outs[1].logprobs, ref[1].logprobs);
  EXPECT_EQ(outs[2].logprobs, ref[0].logprobs);
  EXPECT_EQ(outs[2].cached_tokens, 4);  // only a's first block is findable under the one hash
}

TEST(PrefixCache, RefCountsReturnToZeroWithPreemptionAndAbort) {
  FakeRunner r(10, 4);  // tight: forces preemption with shared blocks in flight
  Engine e(r, {.max_num_seqs = 8, .max_num_batched_tokens = 16});
  auto base = seq(10, 9);
  std::vector<std::shared_ptr<Channel>> chs;
  std::vector<int64_t> ids;
  for (int i = 0; i < 6; ++i) {
    auto p = base;
    p.push_back(700 + i);
    GenRequest g;
    g.prompt = p;
    g.max_tokens = 12;
    chs.push_back(std::make_shared<Channel>());
    auto id = e.submit(g, chs.back());
    ASSERT_TRUE(id);
    ids.push_back(*id);
    if (i == 0)
      for (int k = 0; k < 3; ++k) e.step();  // let the first one populate the cache
  }
  for (int k = 0; k < 4; ++k) e.step();
  e.abort(ids[2]);
  for (int k = 0; k < 2000 && e.step(); ++k) {}
  FakeRunner cold(64, 4);
  Engine ce(cold, {.enable_prefix_caching = false});
  for (int i = 0; i < 6; ++i) {
    Output o = fake::drain_output(*chs[size_t(i)]);
    if (i == 2) {
      EXPECT_EQ(o.finish, FinishReason::kAbort);
      continue;
    }
    auto p = base;
    p.push_back(700 + i);
    auto ref = run_each(ce, {p}, 12);
    EXPECT_EQ(o.tokens, ref[0].tokens) << i;
    EXPECT_EQ(o.logprobs, ref[0].logprobs) << i;
  }
  EngineStats st = e.stats();
  EXPECT_GE(st.preemptions, 1u);
  EXPECT_GT(st.prefix_cache_hits, 0u);
  EXPECT_EQ(st.kv_usage, 0.0);  // every block is free or cached with no reference: no leak
  EXPECT_EQ(st.running, 0);
}

// The real model (tiny fixture: sliding window 4, so sliding layers attend across reused blocks):
// outputs with the prefix cache are bit-identical to outputs without it.
class CpuPrefixCache : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (std::filesystem::temp_directory_path() / ("mxserve-prefix-" + std::to_string(::getpid()))).string();
    FixtureOptions o;
    o.preset = "tiny";
    o.out_dir = dir_;
    write_fixture(o);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  static std::unique_ptr<CpuRunner> runner() {
    CpuRunnerOptions ro;
    ro.model_dir = dir_;
    ro.num_threads = 1;
    ro.kv_block_size = 4;
    ro.kv_tokens = 256;
    return std::make_unique<CpuRunner>(ro);
  }
  static inline std::string dir_;
};

TEST_F(CpuPrefixCache, OutputsIdenticalWithAndWithoutCachingPastTheWindow) {
  auto p1 = seq(1000, 15);
  auto p2 = p1;
  p2[13] = 4242;  // shares 13 tokens (3 full blocks, > the window of 4)
  auto p3 = seq(2000, 7);
  std::vector<std::vector<int32_t>> prompts = {p1, p1, p2, p3, p2};
  for (float temp : {0.0f, 1.0f}) {
    SamplingParams sp;
    sp.temperature = temp;
    sp.seed = 7;
    sp.logprobs = true;
    auto cached_runner = runner(), cold_runner = runner();
    Engine on(*cached_runner, {});
    Engine off(*cold_runner, {.enable_prefix_caching = false});
    auto a = run_each(on, prompts, 5, sp), b = run_each(off, prompts, 5, sp);
    std::vector<int> hits;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(a[i].tokens, b[i].tokens) << i;
      EXPECT_EQ(a[i].logprobs, b[i].logprobs) << i;
      EXPECT_EQ(b[i].cached_tokens, 0);
      hits.push_back(a[i].cached_tokens);
    }
    EXPECT_EQ(hits, (std::vector<int>{0, 12, 12, 0, 12})) << "temperature " << temp;
    EXPECT_EQ(on.stats().kv_usage, 0.0);
  }
}

// Prompt log-probs on the real model, chunked by the engine: prompt token p's entry is what the logits
// after the prompt's first p tokens give it (each prefix run alone, its last row's logits), exactly.
TEST_F(CpuPrefixCache, PromptLogprobsEqualEachPrefixsLogits) {
  const auto prompt = seq(4000, 10);
  auto r = runner();
  Engine e(*r, {.max_num_batched_tokens = 4});  // chunks 4, 4, 2: the last one samples too
  auto ch = std::make_shared<Channel>();
  GenRequest g;
  g.prompt = prompt;
  g.max_tokens = 1;
  g.prompt_logprobs = 3;
  ASSERT_TRUE(e.submit(g, ch));
  for (int i = 0; i < 100 && e.step(); ++i) {}
  std::vector<TokenLogprob> got;
  for (auto& ev : ch->pop(std::chrono::milliseconds(0)))
    if (!ev.prompt_logprobs.empty()) got = ev.prompt_logprobs;
  ASSERT_EQ(got.size(), prompt.size() - 1);
  auto alone = runner();
  std::vector<int32_t> blocks(8);
  std::iota(blocks.begin(), blocks.end(), 0);
  KvTables t;
  contiguous_kv_tables(alone->kv_shape(), 0, 8, t);
  for (size_t p = 1; p < prompt.size(); ++p) {
    SeqStep q;
    q.tokens = std::span<const int32_t>(prompt).first(p);
    q.block_table = t.full;
    q.sliding_table = t.sliding;
    q.sample = true;
    q.sampling.temperature = 0.f;
    std::vector<SampleResult> out(1);
    alone->step({&q, 1}, out);
    const auto logits = alone->last_logits(0);
    const TokenLogprob want = token_logprob(logits.data(), int(logits.size()), prompt[p], 3);
    EXPECT_EQ(got[p - 1].token, prompt[p]);
    EXPECT_EQ(got[p - 1].logprob, want.logprob) << p;
    EXPECT_EQ(got[p - 1].rank, want.rank) << p;
    EXPECT_EQ(got[p - 1].top, want.top) << p;
    EXPECT_GE(got[p - 1].rank, 1);
    ASSERT_EQ(got[p - 1].top.size(), 3u);
    EXPECT_LE(got[p - 1].logprob, got[p - 1].top[0].second);
  }
  EXPECT_EQ(e.stats().kv_usage, 0.0);
}

// min_tokens on the real model (the CPU runner masks the banned logits): a stop token that greedy would
// pick first ends the request at once without it, and cannot come before the minimum with it.
TEST_F(CpuPrefixCache, MinTokensBansTheStopTokensOfTheRealModel) {
  auto r = runner();
  Engine e(*r, {});
  const auto prompt = seq(3000, 6);
  const auto free_run = run_each(e, {prompt}, 6);
  ASSERT_EQ(free_run[0].tokens.size(), 6u);
  const int32_t first = free_run[0].tokens[0];
  auto run = [&](int min_tokens) {
    auto ch = std::make_shared<Channel>();
    GenRequest g;
    g.prompt = prompt;
    g.max_tokens = 6;
    g.min_tokens = min_tokens;
    g.stop_token_ids = {first};
    EXPECT_TRUE(e.submit(g, ch));
    for (int i = 0; i < 100 && e.step(); ++i) {}
    return fake::drain_output(*ch);
  };
  const Output stopped = run(0);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>{first});
  EXPECT_EQ(stopped.finish, FinishReason::kStop);
  const Output held = run(3);
  ASSERT_GE(held.tokens.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(held.tokens[i], first) << i;
  EXPECT_EQ(held.finish == FinishReason::kStop, held.tokens.back() == first);
  EXPECT_EQ(e.stats().kv_usage, 0.0);
}

// logit_bias through the engine on the real tiny model: +100 on one id makes every greedy pick that id,
// -100 on the free run's first pick moves the first pick elsewhere.
TEST_F(CpuPrefixCache, LogitBiasSteersTheRealModel) {
  auto r = runner();
  Engine e(*r, {});
  const auto prompt = seq(3000, 6);
  const auto free_run = run_each(e, {prompt}, 4, SamplingParams{0.f});
  ASSERT_EQ(free_run[0].tokens.size(), 4u);
  auto run = [&](std::vector<LogitBias> bias) {
    auto ch = std::make_shared<Channel>();
    GenRequest g;
    g.prompt = prompt;
    g.max_tokens = 4;
    g.sampling.temperature = 0.f;
    g.logit_bias = std::move(bias);
    EXPECT_TRUE(e.submit(g, ch));
    for (int i = 0; i < 100 && e.step(); ++i) {}
    return fake::drain_output(*ch);
  };
  const int32_t forced = 1234 == free_run[0].tokens[0] ? 1235 : 1234;
  EXPECT_EQ(run({{forced, 100.f}}).tokens, std::vector<int32_t>(4, forced));
  const Output away = run({{free_run[0].tokens[0], -100.f}});
  ASSERT_EQ(away.tokens.size(), 4u);
  EXPECT_NE(away.tokens[0], free_run[0].tokens[0]);
  EXPECT_EQ(e.stats().kv_usage, 0.0);
}

// Penalties through the engine on the real tiny model: the runner sees the prompt and the output so far.
// Biases make a prompt token (+50) and a new one (+40) the greedy picks; a repetition penalty of 1e6 then
// takes every seen id's logit to about zero: the new token once, then neither again, nor any other repeat.
TEST_F(CpuPrefixCache, RepetitionPenaltySeesThePromptAndTheOutput) {
  auto r = runner();
  Engine e(*r, {});
  const auto prompt = seq(3000, 6);
  const int32_t q = 4321;
  auto run = [&](float repetition) {
    auto ch = std::make_shared<Channel>();
    GenRequest g;
    g.prompt = prompt;
    g.max_tokens = 8;
    g.sampling.temperature = 0.f;
    g.sampling.repetition_penalty = repetition;
    g.logit_bias = {{prompt[0], 50.f}, {q, 40.f}};
    EXPECT_TRUE(e.submit(g, ch));
    for (int i = 0; i < 100 && e.step(); ++i) {}
    return fake::drain_output(*ch).tokens;
  };
  EXPECT_EQ(run(1.f), std::vector<int32_t>(8, prompt[0]));
  const std::vector<int32_t> out = run(1e6f);
  ASSERT_EQ(out.size(), 8u);
  EXPECT_EQ(out[0], q);
  std::vector<int32_t> seen = prompt;
  for (int32_t t : out) {
    EXPECT_EQ(std::count(seen.begin(), seen.end(), t), 0) << t;
    seen.push_back(t);
  }
  EXPECT_EQ(e.stats().kv_usage, 0.0);
}

}  // namespace
}  // namespace mx::runtime
