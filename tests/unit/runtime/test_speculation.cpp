// N-gram speculation (EngineOptions::spec_tokens): drafts checked in one step give exactly the tokens of plain
// greedy decoding, in fewer steps, within max_tokens and the stop tokens; on the fake runner (its model:
// next = last + 1) and on the CPU reference with the tiny model.
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <unistd.h>

#include "core/error.h"
#include "model/cpu_runner.h"
#include "model/fixture.h"
#include "runtime/engine.h"
#include "runtime/ngram_proposer.h"
#include "runtime/speculative_config.h"
#include "tests/unit/runtime/fake_runner.h"

namespace mx::runtime {
namespace {

using fake::FakeRunner;
using fake::seq;
using fake::Output;

Output run(Engine& e, std::vector<int32_t> prompt, int max_tokens, std::vector<int32_t> stop = {}) {
  auto ch = std::make_shared<Channel>();
  GenRequest g;
  g.prompt = std::move(prompt);
  g.max_tokens = max_tokens;
  g.sampling.temperature = 0.f;
  g.stop_token_ids = std::move(stop);
  EXPECT_TRUE(e.submit(g, ch));
  for (int i = 0; i < 1000 && e.step(); ++i) {}
  return fake::drain_output(*ch);
}

TEST(NgramProposer, LatestLongestMatch) {
  std::vector<int32_t> out;
  // The last 2 tokens (5, 6) occur at 4 and at 10: the latest (10) is followed by 9 9 5 6.
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 5, 6, 9, 9, 5, 6};
  EXPECT_EQ(propose_ngram(t, 4, 2, 4, out), 4);
  EXPECT_EQ(out, (std::vector<int32_t>{9, 9, 5, 6}));
  out.clear();
  EXPECT_EQ(propose_ngram(t, 8, 2, 4, out), 4);  // no further than the sequence's end
  out.clear();
  // n = 3 (4, 5, 6) occurs only at 3, so it wins over the later 2-gram.
  const std::vector<int32_t> u = {1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 5, 6, 9, 4, 5, 6};
  EXPECT_EQ(propose_ngram(u, 3, 2, 4, out), 3);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 8, 0}));
  out.clear();
  EXPECT_EQ(propose_ngram(seq(0, 20), 4, 1, 4, out), 0);  // nothing recurs
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{7}, 4, 1, 4, out), 0);
  const std::vector<int32_t> rep = {3, 3, 3, 3};  // overlapping occurrences: 3 3 | 3 -> 3
  EXPECT_EQ(propose_ngram(rep, 4, 2, 2, out), 1);
  EXPECT_EQ(out, (std::vector<int32_t>{3}));
}

// The prompt 1..10, 1..5 makes the drafts 7..10 after its first token 6: all right, then the step's own
// token 11; nothing recurs after that.
TEST(EngineSpeculation, SameTokensInFewerSteps) {
  std::vector<int32_t> prompt = seq(1, 10);
  for (int v = 1; v <= 5; ++v) prompt.push_back(v);
  for (int max_tokens : {1, 2, 6, 7, 20}) {
    FakeRunner plain_r(64), spec_r(64);
    Engine plain(plain_r, {.max_num_seqs = 4, .max_num_batched_tokens = 32});
    Engine spec(spec_r, {.max_num_seqs = 4, .max_num_batched_tokens = 32, .spec_tokens = 4});
    const Output a = run(plain, prompt, max_tokens), b = run(spec, prompt, max_tokens);
    EXPECT_EQ(b.tokens, a.tokens) << max_tokens;
    EXPECT_EQ(int(b.tokens.size()), max_tokens);
    EXPECT_EQ(b.finish, FinishReason::kLength);
    EXPECT_EQ(spec.stats().kv_usage, 0.0);
    EXPECT_EQ(spec.stats().generation_tokens, uint64_t(max_tokens));
    if (max_tokens >= 6) {
      EXPECT_LT(spec_r.step_tokens.size(), plain_r.step_tokens.size()) << max_tokens;
      EXPECT_EQ(spec.stats().spec_accepted_tokens, 4u);
      EXPECT_EQ(spec.stats().spec_draft_tokens, 4u);
    }
  }
}

// Prompt 1 2 3 9 1 2: after its token 3 the drafts are 9 1 2 3, wrong at once (the model's 4).
TEST(EngineSpeculation, WrongDraftsGiveTheModelsToken) {
  FakeRunner plain_r(64), spec_r(64);
  Engine plain(plain_r, {.max_num_seqs = 4, .max_num_batched_tokens = 32});
  Engine spec(spec_r, {.max_num_seqs = 4, .max_num_batched_tokens = 32, .spec_tokens = 4});
  const Output a = run(plain, {1, 2, 3, 9, 1, 2}, 8), b = run(spec, {1, 2, 3, 9, 1, 2}, 8);
  EXPECT_EQ(b.tokens, a.tokens);
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_GE(spec.stats().spec_draft_tokens, 4u);
  EXPECT_EQ(spec.stats().kv_usage, 0.0);
}

TEST(EngineSpeculation, StopsAtAStopTokenAmongTheDrafts) {
  std::vector<int32_t> prompt = seq(1, 10);
  for (int v = 1; v <= 5; ++v) prompt.push_back(v);
  FakeRunner r(64);
  Engine e(r, {.max_num_seqs = 4, .max_num_batched_tokens = 32, .spec_tokens = 4});
  const Output o = run(e, prompt, 20, {8});
  EXPECT_EQ(o.tokens, (std::vector<int32_t>{6, 7, 8}));
  EXPECT_EQ(o.finish, FinishReason::kStop);
  EXPECT_EQ(e.stats().kv_usage, 0.0);
}

// Rows that sample (temperature > 0) or report log-probs never speculate, nor any row while more than
// spec_max_running sequences run.
TEST(EngineSpeculation, OnlyPlainGreedyRowsWithinTheRunningLimit) {
  std::vector<int32_t> prompt = seq(1, 10);
  for (int v = 1; v <= 5; ++v) prompt.push_back(v);
  auto drafted = [&](auto tweak, int running_limit, int streams) {
    FakeRunner r(256);
    Engine e(r, {.max_num_seqs = 8, .max_num_batched_tokens = 128, .spec_tokens = 4, .spec_max_running = running_limit});
    std::vector<std::shared_ptr<Channel>> chs;
    for (int i = 0; i < streams; ++i) {
      GenRequest g;
      g.prompt = prompt;
      g.max_tokens = 8;
      g.sampling.temperature = 0.f;
      tweak(g);
      chs.push_back(std::make_shared<Channel>());
      EXPECT_TRUE(e.submit(g, chs.back()));
    }
    for (int i = 0; i < 1000 && e.step(); ++i) {}
    for (auto& ch : chs) EXPECT_EQ(fake::drain_output(*ch).tokens.size(), 8u);
    return e.stats().spec_draft_tokens;
  };
  EXPECT_GT(drafted([](GenRequest&) {}, 8, 1), 0u);
  EXPECT_EQ(drafted([](GenRequest& g) { g.sampling.temperature = 0.7f; }, 8, 1), 0u);
  EXPECT_EQ(drafted([](GenRequest& g) { g.sampling.logprobs = true; }, 8, 1), 0u);
  EXPECT_EQ(drafted([](GenRequest& g) { g.logit_bias = {{5, 1.f}}; }, 8, 1), 0u);
  EXPECT_GT(drafted([](GenRequest&) {}, 2, 2), 0u);
  EXPECT_EQ(drafted([](GenRequest&) {}, 2, 3), 0u);
}

// The real model (CPU reference, tiny random weights): greedy tokens with drafts equal those without.
TEST(EngineSpeculation, CpuTinyModelSameGreedyTokens) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("mxserve-spec-" + std::to_string(::getpid()))).string();
  FixtureOptions fo;
  fo.preset = "tiny";
  fo.out_dir = dir;
  write_fixture(fo);
  auto make = [&] {
    CpuRunnerOptions ro;
    ro.model_dir = dir;
    ro.num_threads = 1;
    ro.kv_block_size = 4;
    ro.kv_tokens = 512;
    return std::make_unique<CpuRunner>(ro);
  };
  // The random model's own tokens never repeat, so the prompt carries a recurrence: its greedy output O
  // after P, then P again. The drafts after P + O + P are then O's first tokens (right or wrong).
  std::vector<int32_t> p;
  for (int r = 0; r < 3; ++r)
    for (int v : {300, 301, 302, 303, 304, 305}) p.push_back(v);
  auto plain_r = make(), spec_r = make();
  Engine plain(*plain_r, {});
  Engine spec(*spec_r, {.spec_tokens = 4, .spec_ngram_min = 1});
  std::vector<int32_t> prompt = p;
  const Output o = run(plain, p, 12);
  prompt.insert(prompt.end(), o.tokens.begin(), o.tokens.end());
  prompt.insert(prompt.end(), p.begin(), p.end());
  const Output a = run(plain, prompt, 24), b = run(spec, prompt, 24);
  EXPECT_EQ(b.tokens, a.tokens);
  EXPECT_EQ(b.tokens.size(), 24u);
  EXPECT_GT(spec.stats().spec_draft_tokens, 0u);
  EXPECT_EQ(spec.stats().kv_usage, 0.0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mx::runtime

namespace mx::runtime {
namespace {

TEST(SpeculativeConfig, ParsesVllmsNgramKeysAndNamesBadOnes) {
  EngineOptions o;
  parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3})", o);
  EXPECT_EQ(o.spec_tokens, 5);
  EXPECT_EQ(o.spec_ngram_max, 3);
  EXPECT_EQ(o.spec_ngram_min, 2);
  EXPECT_EQ(o.spec_max_running, 8);
  parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 1, "disable_by_batch_size": 4})", o);
  EXPECT_EQ(o.spec_ngram_min, 1);
  EXPECT_EQ(o.spec_max_running, 4);
  auto message = [](const char* json) {
    EngineOptions e;
    try {
      parse_speculative_config(json, e);
    } catch (const Error& err) {
      return std::string(err.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("{").find("not JSON"), std::string::npos);
  EXPECT_NE(message(R"({"method": "eagle3", "num_speculative_tokens": 3})").find("eagle3 is not offered"), std::string::npos);
  EXPECT_NE(message(R"({"method": "ngram"})").find("num_speculative_tokens is required"), std::string::npos);
  EXPECT_NE(message(R"({"method": "ngram", "num_speculative_tokens": 0})").find("num_speculative_tokens must be"), std::string::npos);
  EXPECT_NE(message(R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5})").find("prompt_lookup_min"),
            std::string::npos);
  EXPECT_NE(message(R"({"method": "ngram", "num_speculative_tokens": 3, "model": "x"})").find("unknown key model"), std::string::npos);
}

}  // namespace
}  // namespace mx::runtime
