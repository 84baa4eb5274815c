// Engine/scheduler tests with the deterministic fake runner (fake_runner.h).
#include <gtest/gtest.h>

#include <numeric>
#include <thread>

#include "core/error.h"
#include "runtime/block_pool.h"
#include "runtime/engine.h"
#include "tests/unit/runtime/fake_runner.h"

namespace mx::runtime {
namespace {

using fake::FakeRunner;

std::vector<int32_t> drain(Channel& ch, FinishReason* fin) {
  std::vector<int32_t> toks;
  for (auto& ev : ch.pop(std::chrono::milliseconds(0))) {
    if (ev.token >= 0) toks.push_back(ev.token);
    if (ev.finish != FinishReason::kNone) *fin = ev.finish;
  }
  return toks;
}

TEST(BlockPool, RefCountAndFreeList) {
  BlockPool p(3);
  int a = p.allocate(), b = p.allocate(), c = p.allocate();
  EXPECT_EQ(p.allocate(), -1);
  p.add_ref(a);
  p.release(a);
  EXPECT_EQ(p.num_free(), 0);
  p.release(a);
  p.release(b);
  p.release(c);
  EXPECT_EQ(p.num_free(), 3);
  EXPECT_THROW(p.release(a), Error);
}

// A step's events go out quietly and their readers are woken by the Waker's thread: a reader waiting on
// its channel gets the event long before its own timeout, and the waker's destructor wakes what is left.
TEST(Channel, QuietPushReachesAWaitingReaderThroughTheWaker) {
  auto ch = std::make_shared<Channel>();
  std::vector<TokenEvent> got;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread reader([&] { got = ch->pop(std::chrono::seconds(20)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the reader is (most likely) waiting now
  TokenEvent ev;
  ev.token = 7;
  ch->push_quiet(ev);
  {
    Waker w;
    std::vector<std::shared_ptr<Channel>> chs{ch};
    w.post(chs);
    EXPECT_TRUE(chs.empty());
  }
  reader.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].token, 7);
}

TEST(Engine, GeneratesMaxTokensAndFreesBlocks) {
  FakeRunner r(64);
  Engine e(r, {.max_num_seqs = 4, .max_num_batched_tokens = 8});
  auto ch = std::make_shared<Channel>();
  GenRequest g;
  g.prompt = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  g.max_tokens = 3;
  ASSERT_TRUE(e.submit(g, ch));
  for (int i = 0; i < 10 && e.step(); ++i) {}
  FinishReason fin = FinishReason::kNone;
  auto toks = drain(*ch, &fin);
  EXPECT_EQ(toks, (std::vector<int32_t>{21, 22, 23}));
  EXPECT_EQ(fin, FinishReason::kLength);
  // 11 prompt tokens in chunks of 8: 8, then 3 (+sample), then two decodes.
  EXPECT_EQ(r.step_tokens, (std::vector<int>{8, 3, 1, 1}));
  // The runner may start a next step early (decode ahead) only where one follows: not for the partial
  // prompt chunk (nothing sampled) nor for the last token max_tokens allows.
  EXPECT_EQ(r.expect_next, (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(e.stats().kv_usage, 0.0);
}

// A decoding row that goes on holds its next position's block (and sliding block) in the step's tables, so
// the runner can enqueue its next step before reading this one's (decode ahead); nothing is left held
// at the end.
TEST(Engine, DecodingRowsHoldTheirNextBlock) {
  for (int window : {0, 8}) {
    SCOPED_TRACE("window " + std::to_string(window));
    FakeRunner r(64, 4, window);
    Engine e(r, {.max_num_seqs = 4, .max_num_batched_tokens = 16});
    std::vector<std::shared_ptr<Channel>> chs;
    for (int i = 0; i < 3; ++i) {
      GenRequest g;
      g.prompt = {10 * i + 1, 10 * i + 2, 10 * i + 3, 10 * i + 4, 10 * i + 5};
      g.max_tokens = 14 + i;
      chs.push_back(std::make_shared<Channel>());
      ASSERT_TRUE(e.submit(g, chs.back()));
    }
    for (int i = 0; i < 100 && e.step(); ++i) {}
    ASSERT_GT(r.next_block_held.size(), 30u);
    for (size_t i = 0; i < r.next_block_held.size(); ++i) EXPECT_TRUE(r.next_block_held[i]) << "decode " << i;
    for (auto& ch : chs) EXPECT_EQ(fake::drain_output(*ch).finish, FinishReason::kLength);
    EXPECT_EQ(e.stats().kv_usage, 0.0);
    EXPECT_EQ(r.sliding_mismatches, 0);
  }
}

// A request waiting with a seat free joins the next step, so the runner is not asked to start it early
// (SeqStep::expect_next); once nothing waits, it is again.
TEST(Engine, NoStepAheadWhileARequestWaitsToJoin) {
  FakeRunner r(64);
  Engine e(r, {.max_num_seqs = 2, .max_num_batched_tokens = 1});
  auto a = std::make_shared<Channel>(), b = std::make_shared<Channel>();
  GenRequest ga;
  ga.prompt = {5};
  ga.max_tokens = 4;
  ASSERT_TRUE(e.submit(ga, a));
  ASSERT_TRUE(e.step());  // a's prompt and first token; nothing waits
  GenRequest gb = ga;
  ASSERT_TRUE(e.submit(gb, b));
  for (int i = 0; i < 20 && e.step(); ++i) {}  // a's decodes use the budget: b waits until a ends
  EXPECT_EQ(fake::drain_output(*a).tokens.size(), 4u);
  EXPECT_EQ(fake::drain_output(*b).tokens.size(), 4u);
  // a: ahead, then not while b waits, then its last; b alone: ahead twice, then its last.
  EXPECT_EQ(r.expect_next, (std::vector<bool>{true, false, false, false, true, true, true, false}));
}

// A waiting request that the pool cannot take yet does not join the next step: the running one is still
// asked to run ahead.
TEST(Engine, AWaitingRequestWithoutBlocksLeavesStepsAhead) {
  FakeRunner r(6);  // 6 blocks of 4 tokens
  Engine e(r, {.max_num_seqs = 2, .max_num_batched_tokens = 64});
  auto a = std::make_shared<Channel>(), b = std::make_shared<Channel>();
  GenRequest ga;
  ga.prompt = {1, 2, 3, 4};
  ga.max_tokens = 8;
  ASSERT_TRUE(e.submit(ga, a));
  ASSERT_TRUE(e.step());
  GenRequest gb;
  for (int i = 0; i < 22; ++i) gb.prompt.push_back(100 + i);  // 6 blocks: only once a is gone
  gb.max_tokens = 2;
  ASSERT_TRUE(e.submit(gb, b));
  for (int i = 0; i < 40 && e.step(); ++i) {}
  EXPECT_EQ(fake::drain_output(*a).tokens.size(), 8u);
  EXPECT_EQ(fake::drain_output(*b).tokens.size(), 2u);
  EXPECT_EQ(r.expect_next, (std::vector<bool>{true, true, true, true, true, true, true, false, true, false}));
}

TEST(Engine, StopTokenAndBudgetAcrossRequests) {
  FakeRunner r(64);
  Engine e(r, {.max_num_seqs = 8, .max_num_batched_tokens = 6});
  std::vector<std::shared_ptr<Channel>> chs;
  for (int i = 0; i < 3; ++i) {
    chs.push_back(std::make_shared<Channel>());
    GenRequest g;
    g.prompt = {100 * i, 100 * i + 1, 100 * i + 2, 100 * i + 3};
    g.max_tokens = 50;
    g.stop_token_ids = {100 * i + 6};
    ASSERT_TRUE(e.submit(g, chs.back()));
  }
  for (int i = 0; i < 50 && e.step(); ++i) {}
  for (int t : r.step_tokens) EXPECT_LE(t, 6);
  for (int i = 0; i < 3; ++i) {
    FinishReason fin = FinishReason::kNone;
    EXPECT_EQ(drain(*chs[i], &fin), (std::vector<int32_t>{100 * i + 4, 100 * i + 5, 100 * i + 6}));
    EXPECT_EQ(fin, FinishReason::kStop);
  }
  EXPECT_EQ(e.stats().running, 0);
}

// min_tokens: the request's stop tokens are banned (SeqStep::banned) until it has that many tokens, then
// one ends it as usual.
TEST(Engine, MinTokensBansStopTokensUntilReached) {
  FakeRunner r(64);
  Engine e(r, {});
  auto ch = std::make_shared<Channel>();
  GenRequest g;
  g.prompt = {0, 1, 2, 3};
  g.max_tokens = 50;
  g.min_tokens = 4;
  g.stop_token_ids = {6, 9};
  ASSERT_TRUE(e.submit(g, ch));
  for (int i = 0; i < 60 && e.step(); ++i) {}
  FinishReason fin = FinishReason::kNone;
  EXPECT_EQ(drain(*ch, &fin), (std::vector<int32_t>{4, 5, 7, 8, 9}));  // 6 banned at the third token
  EXPECT_EQ(fin, FinishReason::kStop);
  EXPECT_EQ(r.banned_sizes, (std::vector<int>{2, 2, 2, 2, 0}));
  EXPECT_EQ(e.stats().running, 0);
}

// A request's TokenConstraint: its allowed ids reach the runner before each sampled token (here: ids
// that are multiples of 3 once three tokens were accepted), and each generated token is accepted in order.
TEST(Engine, ConstraintMasksEachSampledToken) {
  struct Threes : TokenConstraint {
    std::vector<uint64_t> bits = std::vector<uint64_t>(16, 0);
    std::vector<int32_t> seen;
    Threes() {
      for (int id = 0; id < 1000; id += 3) bits[size_t(id) / 64] |= uint64_t(1) << (id % 64);
    }
    std::span<const uint64_t> allowed() override {
      return seen.size() < 3 ? std::span<const uint64_t>{} : std::span<const uint64_t>(bits);
    }
    void accept(int32_t t) override { seen.push_back(t); }
  };
  FakeRunner r(64);
  Engine e(r, {});
  auto ch = std::make_shared<Channel>();
  auto c = std::make_shared<Threes>();
  GenRequest g;
  g.prompt = {0, 1, 2, 3};
  g.max_tokens = 6;
  g.constraint = c;
  ASSERT_TRUE(e.submit(g, ch));
  for (int i = 0; i < 20 && e.step(); ++i) {}
  const std::vector<int32_t> want = {4, 5, 6, 9, 12, 15};  // free three, then the next multiple of 3
  FinishReason fin = FinishReason::kNone;
  EXPECT_EQ(drain(*ch, &fin), want);
  EXPECT_EQ(c->seen, want);
}

// Several constrained rows in one step (their masks made side by side on the engine's pool): each row's
// tokens follow its own constraint.
TEST(Engine, ConstrainedRowsOfOneStepEachFollowTheirOwn) {
  struct Multiples : TokenConstraint {
    std::vector<uint64_t> bits = std::vector<uint64_t>(16, 0);
    explicit Multiples(int m) {
      for (int id = m; id < 1000; id += m) bits[size_t(id) / 64] |= uint64_t(1) << (id % 64);
    }
    std::span<const uint64_t> allowed() override { return bits; }
    void accept(int32_t) override {}
  };
  FakeRunner r(64);
  Engine e(r, {});
  std::vector<std::shared_ptr<Channel>> chs;
  const std::vector<int> mods = {3, 5, 7, 11, 13};
  for (int m : mods) {
    chs.push_back(std::make_shared<Channel>());
    GenRequest g;
    g.prompt = {m, m + 1};
    g.max_tokens = 5;
    g.constraint = std::make_shared<Multiples>(m);
    ASSERT_TRUE(e.submit(g, chs.back()));
  }
  for (int i = 0; i < 40 && e.step(); ++i) {}
  for (size_t k = 0; k < mods.size(); ++k) {
    FinishReason fin = FinishReason::kNone;
    const auto got = drain(*chs[k], &fin);
    EXPECT_EQ(fin, FinishReason::kLength);
    ASSERT_EQ(got.size(), 5u);
    for (int32_t t : got) EXPECT_EQ(t % mods[k], 0) << "row " << k << " token " << t;
  }
}

// While streams decode, a step takes at most max_prefill_tokens_with_decodes prompt tokens; with
// nothing decoding it takes the whole budget.
TEST(Engine, PrefillChunksAreShortWhileDecoding) {
  FakeRunner r(128);
  Engine e(r, {.max_num_seqs = 8, .max_num_batched_tokens = 64, .max_prefill_tokens_with_decodes = 16});
  std::vector<std::shared_ptr<Channel>> chs;
  auto submit = [&](int first, int len, int max_tokens) {
    chs.push_back(std::make_shared<Channel>());
    GenRequest g;
    for (int i = 0; i < len; ++i) g.prompt.push_back(first + i);
    g.max_tokens = max_tokens;
    ASSERT_TRUE(e.submit(g, chs.back()));
  };
  for (int i = 0; i < 3; ++i) submit(100 * i, 2, 10);
  ASSERT_TRUE(e.step());  // three prompts, nothing decoding yet
  submit(500, 40, 2);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(e.step());
  // 6 prompt tokens; then 3 decodes with 16, 16 and the last 8 prompt tokens, then 4 decodes.
  EXPECT_EQ(r.step_tokens, (std::vector<int>{6, 19, 19, 11, 4}));
  for (int i = 0; i < 20 && e.step(); ++i) {}
  FinishReason fin = FinishReason::kNone;
  EXPECT_EQ(drain(*chs[3], &fin), (std::vector<int32_t>{540, 541}));
  EXPECT_EQ(e.stats().kv_usage, 0.0);
  // Nothing decoding: a long prompt takes the whole budget.
  r.step_tokens.clear();
  submit(700, 100, 1);
  ASSERT_TRUE(e.step());
  EXPECT_EQ(r.step_tokens, (std::vector<int>{64}));
}

TEST(Engine, PreemptionByRecomputeKeepsOutputCorrect) {
  FakeRunner r(6, 4);  // 24 tokens of KV for two requests that need 2 * 16
  Engine e(r, {.max_num_seqs = 4, .max_num_batched_tokens = 64});
  std::shared_ptr<Channel> a = std::make_shared<Channel>(), b = std::make_shared<Channel>();
  GenRequest g;
  g.prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  g.max_tokens = 8;
  ASSERT_TRUE(e.submit(g, a));
  g.prompt = {501, 502, 503, 504, 505, 506, 507, 508};
  ASSERT_TRUE(e.submit(g, b));
  for (int i = 0; i < 100 && e.step(); ++i) {}
  FinishReason fa = FinishReason::kNone, fb = FinishReason::kNone;
  auto ta = drain(*a, &fa), tb = drain(*b, &fb);
  std::vector<int32_t> ea(8), eb(8);
  std::iota(ea.begin(), ea.end(), 9);
  std::iota(eb.begin(), eb.end(), 509);
  EXPECT_EQ(ta, ea);
  EXPECT_EQ(tb, eb);
  EXPECT_EQ(fa, FinishReason::kLength);
  EXPECT_GE(e.stats().preemptions, 1u);
  EXPECT_EQ(e.stats().kv_usage, 0.0);
}

// Prompt log-probs (echo, prompt_logprobs) go out with the first token: one entry a prompt token after the
// first, each from its position's row, whatever the chunks; never again later.
std::vector<TokenLogprob> first_prompt_logprobs(Channel& ch, int* events_with) {
  std::vector<TokenLogprob> got;
  *events_with = 0;
  for (auto& ev : ch.pop(std::chrono::milliseconds(0)))
    if (!ev.prompt_logprobs.empty()) {
      ++*events_with;
      got = ev.prompt_logprobs;
    }
  return got;
}
void expect_prompt_logprobs(const std::vector<TokenLogprob>& got, const std::vector<int32_t>& prompt, int top) {
  ASSERT_EQ(got.size(), prompt.size() - 1);
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    EXPECT_EQ(got[p].token, prompt[p + 1]) << p;
    EXPECT_EQ(got[p].logprob, -float(p)) << p;  // the fake's: row p
    EXPECT_EQ(got[p].rank, int(p) + 1);
    EXPECT_EQ(int(got[p].top.size()), top);
  }
}

TEST(Engine, PromptLogprobsCoverEachPromptTokenOnceAcrossChunks) {
  FakeRunner r(64);
  Engine e(r, {.max_num_seqs = 4, .max_num_batched_tokens = 4});
  auto ch = std::make_shared<Channel>();
  GenRequest g;
  g.prompt = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  g.max_tokens = 3;
  g.prompt_logprobs = 2;
  ASSERT_TRUE(e.submit(g, ch));
  for (int i = 0; i < 20 && e.step(); ++i) {}
  int with = 0;
  expect_prompt_logprobs(first_prompt_logprobs(*ch, &with), g.prompt, 2);
  EXPECT_EQ(with, 1);
  // A one-token prompt has none; a bad count is refused.
  g.prompt = {7};
  ASSERT_TRUE(e.submit(g, ch));
  for (int i = 0; i < 20 && e.step(); ++i) {}
  EXPECT_TRUE(first_prompt_logprobs(*ch, &with).empty());
  g.prompt_logprobs = kMaxPromptTop + 1;
  EXPECT_THROW(e.submit(g, ch), Error);
  EXPECT_EQ(e.stats().kv_usage, 0.0);
}

TEST(Engine, PromptLogprobsComputeACachedPrefixAgain) {
  FakeRunner r(64);
  Engine e(r, {.max_num_seqs = 4, .max_num_batched_tokens = 64});
  auto ch = std::make_shared<Channel>();
  GenRequest g;
  g.prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  g.max_tokens = 2;
  ASSERT_TRUE(e.submit(g, ch));
  for (int i = 0; i < 20 && e.step(); ++i) {}
  FinishReason fin = FinishReason::kNone;
  drain(*ch, &fin);
  g.prompt_logprobs = 0;
  ASSERT_TRUE(e.submit(g, ch));
  r.step_tokens.clear();
  for (int i = 0; i < 20 && e.step(); ++i) {}
  int with = 0;
  expect_prompt_logprobs(first_prompt_logprobs(*ch, &with), g.prompt, 0);
  EXPECT_EQ(r.step_tokens, (std::vector<int>{13, 1}));  // the whole prompt again, not its 12 cached tokens
  EXPECT_EQ(e.stats().prefix_cache_hits, 0u);
}

TEST(Engine, PromptLogprobsSurvivePreemptionMidPrompt) {
  FakeRunner r(5, 4);  // 20 tokens of KV
  Engine e(r, {.max_num_seqs = 4, .max_num_batched_tokens = 8});
  std::shared_ptr<Channel> a = std::make_shared<Channel>(), b = std::make_shared<Channel>();
  GenRequest g;
  g.prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  g.max_tokens = 6;
  ASSERT_TRUE(e.submit(g, a));
  g.prompt = {501, 502, 503, 504, 505, 506, 507, 508, 509, 510, 511, 512};
  g.prompt_logprobs = 1;
  ASSERT_TRUE(e.submit(g, b));
  for (int i = 0; i < 100 && e.step(); ++i) {}
  EXPECT_GE(e.stats().preemptions, 1u);
  int with = 0;
  expect_prompt_logprobs(first_prompt_logprobs(*b, &with), g.prompt, 1);
  EXPECT_EQ(with, 1);
  EXPECT_EQ(e.stats().kv_usage, 0.0);
}

TEST(Engine, AbortFreesBlocksByNextStep) {
  FakeRunner r(64);
  Engine e(r, {});
  auto ch = std::make_shared<Channel>();
  GenRequest g;
  g.prompt = {1, 2, 3};
  g.max_tokens = 1000;
  auto id = e.submit(g, ch);
  ASSERT_TRUE(id);
  e.step();
  EXPECT_GT(e.stats().kv_usage, 0.0);
  e.abort(*id);
  e.step();
  EXPECT_EQ(e.stats().kv_usage, 0.0);
  EXPECT_EQ(e.stats().running, 0);
  FinishReason fin = FinishReason::kNone;
  drain(*ch, &fin);
  EXPECT_EQ(fin, FinishReason::kAbort);
}

TEST(Engine, BoundedQueueAndDrain) {
  FakeRunner r(64);
  Engine e(r, {.max_num_seqs = 1, .max_waiting = 2});
  GenRequest g;
  g.prompt = {1};
  g.max_tokens = 2;
  auto ch = std::make_shared<Channel>();
  EXPECT_TRUE(e.submit(g, ch));   // the free seat
  EXPECT_TRUE(e.submit(g, ch));   // the queue
  EXPECT_TRUE(e.submit(g, ch));
  EXPECT_FALSE(e.submit(g, ch));  // full: the server answers 429
  e.start();
  e.drain_and_stop(std::chrono::milliseconds(2000));
  EXPECT_FALSE(e.submit(g, ch));
  EXPECT_EQ(e.stats().running, 0);
}

}  // namespace
}  // namespace mx::runtime
