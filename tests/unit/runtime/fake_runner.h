// A deterministic fake ModelRunner for engine tests: the sampled token is (last token + 1) % 1000,
// and every step's work is recorded to check budgets and block tables. It also keeps a fake KV
// cache: each slot holds a digest of the whole prefix up to its position, read back through the
// block table, and the sampled token's logprob carries the digest of the sequence's prefix. So
// reusing a wrong or stale KV block (a prefix-cache bug) changes the logprobs. With a sliding
// window, the sliding layers' table gets the digests too (tagged, in the same slot array, so a block
// in both tables at once is caught), the prefix digest is read through it, and every position of the
// window must read back the full layers' digest.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <span>
#include <vector>

#include "runtime/engine.h"

namespace mx::runtime::fake {

class FakeRunner : public ModelRunner {
 public:
  explicit FakeRunner(int blocks, int block_size = 4, int window = 0)
      : shape_{block_size, blocks, window}, kv_(size_t(blocks) * size_t(block_size) + 1, 0) {
    cfg_.max_position_embeddings = 4096;
  }
  const ModelConfig& config() const override { return cfg_; }
  KvCacheShape kv_shape() const override { return shape_; }
  void step(std::span<const SeqStep> seqs, std::span<SampleResult> out) override {
    int total = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const SeqStep& s = seqs[i];
      total += int(s.tokens.size());
      int need = (s.start_pos + int(s.tokens.size()) + shape_.block_size - 1) / shape_.block_size;
      EXPECT_GE(int(s.block_table.size()), need);
      for (int b = 0; b < need; ++b)
        EXPECT_TRUE(s.block_table[size_t(b)] >= 0 && s.block_table[size_t(b)] < shape_.num_blocks);
      uint64_t d = s.start_pos == 0 ? 0 : kv_[slot(s.block_table, s.start_pos - 1)];
      if (shape_.sliding_window > 0) {
        EXPECT_GE(int(s.sliding_table.size()), need);
        const int first = sliding_first_block(shape_, s.start_pos);
        for (int b = first; b < need && b < int(s.sliding_table.size()); ++b)
          EXPECT_TRUE(s.sliding_table[size_t(b)] >= 0 && s.sliding_table[size_t(b)] < shape_.num_blocks) << "block " << b;
        for (int p = std::max(0, s.start_pos - shape_.sliding_window + 1); p < s.start_pos; ++p) {
          sliding_mismatches += kv_[slot(s.sliding_table, p)] != (kv_[slot(s.block_table, p)] ^ kSlidingTag);
        }
        if (s.start_pos > 0) d = kv_[slot(s.sliding_table, s.start_pos - 1)] ^ kSlidingTag;
      }
      for (size_t t = 0; t < s.tokens.size(); ++t) {
        d = (d ^ uint64_t(s.tokens[t] + 1)) * 0x100000001b3ull;
        kv_[slot(s.block_table, s.start_pos + int(t))] = d;
        if (shape_.sliding_window > 0) kv_[slot(s.sliding_table, s.start_pos + int(t))] = d ^ kSlidingTag;
      }
      // Prompt log-probs: the target and its position (as -logprob, and rank position + 1); the first of
      // the top ids is the row's greedy pick (its token + 1), as a draft check reads it.
      out[i].prompt.clear();
      for (size_t j = 0; j < s.prompt_targets.size(); ++j) {
        const int pos = s.start_pos + s.prompt_row0 + int(j);
        EXPECT_LT(s.prompt_row0 + int(j), int(s.tokens.size()));
        TokenLogprob t;
        t.token = s.prompt_targets[j];
        t.logprob = -float(pos);
        t.rank = pos + 1;
        for (int k = 0; k < s.prompt_top; ++k)
          t.top.emplace_back(k == 0 ? (s.tokens[size_t(s.prompt_row0) + j] + 1) % 1000 : k, -float(k));
        out[i].prompt.push_back(std::move(t));
      }
      expect_next.push_back(s.expect_next);
      if (s.expect_next && s.tokens.size() == 1) {  // a decode that goes on: is its next position's block there?
        const size_t b = size_t(s.start_pos + 1) / size_t(shape_.block_size);
        auto has = [&](std::span<const int32_t> t) { return b < t.size() && t[b] >= 0 && t[b] < shape_.num_blocks; };
        next_block_held.push_back(has(s.block_table) && (shape_.sliding_window == 0 || has(s.sliding_table)));
      }
      EXPECT_TRUE(s.sample || !s.expect_next) << "a step that samples nothing expects no next token";
      if (s.sample) {
        int32_t tok = (s.tokens.back() + 1) % 1000;
        auto allowed = [&](int32_t t) { return s.allowed.empty() || (s.allowed[size_t(t) / 64] >> (t % 64) & 1); };
        for (int tries = 0; std::find(s.banned.begin(), s.banned.end(), tok) != s.banned.end() || !allowed(tok); ++tries) {
          tok = (tok + 1) % 1000;  // as masked
          if (tries == 1000) {  // nothing allowed below 1000: the first allowed id
            tok = 0;
            while (size_t(tok) / 64 < s.allowed.size() && !allowed(tok)) ++tok;
            break;
          }
        }
        banned_sizes.push_back(int(s.banned.size()));
        out[i].token = tok;
        out[i].logprob = -float(d % 100003);
      }
    }
    step_tokens.push_back(total);
  }
  std::vector<int> step_tokens;
  std::vector<int> banned_sizes;  // per sampled row, in step order: SeqStep::banned's size
  std::vector<bool> expect_next;  // SeqStep::expect_next of every sequence step, in order
  std::vector<bool> next_block_held;  // per decode with expect_next, in order: its next position's blocks given
  int sliding_mismatches = 0;  // window positions whose sliding digest differs from the full one

 private:
  static constexpr uint64_t kSlidingTag = 0x5a5a5a5a5a5a5a5aull;
  // A missing or bad block (already reported) maps to the spare last slot instead of out of bounds.
  size_t slot(std::span<const int32_t> table, int pos) const {
    const size_t i = size_t(pos / shape_.block_size);
    if (i >= table.size() || table[i] < 0 || table[i] >= shape_.num_blocks) return kv_.size() - 1;
    return size_t(table[i]) * size_t(shape_.block_size) + size_t(pos % shape_.block_size);
  }
  ModelConfig cfg_;
  KvCacheShape shape_;
  std::vector<uint64_t> kv_;
};

// The ids from, from + 1, ..., n of them (prompts).
inline std::vector<int32_t> seq(int from, int n) {
  std::vector<int32_t> v(size_t(n), 0);
  std::iota(v.begin(), v.end(), from);
  return v;
}

// Everything a request produced so far.
struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason finish = FinishReason::kNone;
  int cached_tokens = 0;
};

inline Output drain_output(Channel& ch) {
  Output o;
  for (auto& ev : ch.pop(std::chrono::milliseconds(0))) {
    if (ev.token >= 0) {
      o.tokens.push_back(ev.token);
      o.logprobs.push_back(ev.logprob);
      o.cached_tokens = ev.cached_tokens;
    }
    if (ev.finish != FinishReason::kNone) o.finish = ev.finish;
  }
  return o;
}

}  // namespace mx::runtime::fake
