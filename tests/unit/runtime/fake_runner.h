// A deterministic fake ModelRunner for engine tests: the sampled token is (last token + 1) % 1000,
// and every step's work is recorded to check budgets and block tables. It also keeps a fake KV
// cache: each slot holds a digest of the whole prefix up to its position, read back through the
// block table, and the sampled token's logprob carries the digest of the sequence's prefix. So
// reusing a wrong or stale KV block (a prefix-cache bug) changes the logprobs.
#pragma once
#include <gtest/gtest.h>

#include <vector>

#include "runtime/engine.h"

namespace mx::runtime::fake {

class FakeRunner : public ModelRunner {
 public:
  explicit FakeRunner(int blocks, int block_size = 4)
      : shape_{block_size, blocks}, kv_(size_t(blocks) * size_t(block_size), 0) {
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
      uint64_t d = s.start_pos == 0 ? 0 : kv_[slot(s, s.start_pos - 1)];
      for (size_t t = 0; t < s.tokens.size(); ++t) {
        d = (d ^ uint64_t(s.tokens[t] + 1)) * 0x100000001b3ull;
        kv_[slot(s, s.start_pos + int(t))] = d;
      }
      if (s.sample) {
        out[i].token = (s.tokens.back() + 1) % 1000;
        out[i].logprob = -float(d % 100003);
      }
    }
    step_tokens.push_back(total);
  }
  std::vector<int> step_tokens;

 private:
  size_t slot(const SeqStep& s, int pos) const {
    return size_t(s.block_table[size_t(pos / shape_.block_size)]) * size_t(shape_.block_size) + size_t(pos % shape_.block_size);
  }
  ModelConfig cfg_;
  KvCacheShape shape_;
  std::vector<uint64_t> kv_;
};

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
