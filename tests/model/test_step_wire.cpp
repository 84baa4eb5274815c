// Steps as bytes for the other nodes of a tensor-parallel group (model/step_wire.h): every field back
// as it was, and bad bytes refused with one line.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/step_wire.h"

namespace {
using namespace mx;

TEST(StepWire, RoundTripKeepsEveryField) {
  const std::vector<int32_t> t0{5, 6, 7}, b0{3, 1}, s0{-1, 9}, t1{42}, b1{8}, ban1{200002, 200012};
  const std::vector<LogitBias> bias0{{7, -100.f}, {200001, 2.5f}};
  const std::vector<int32_t> hist1{1, 2, 3, 42};
  const std::vector<uint64_t> allow1{0x5ull, ~0ull, 1ull << 63};
  std::vector<SeqStep> in(3);
  in[0].seq_id = 11;
  in[0].tokens = t0;
  in[0].block_table = b0;
  in[0].sliding_table = s0;
  in[0].sample = true;
  in[0].sampling = SamplingParams{0.7f, 0.9f, 40, 0.05f, 1ull << 60, 3, true};
  in[0].rng_step = 17;
  in[0].expect_next = true;
  in[0].logit_bias = bias0;
  const std::vector<int32_t> ptgt0{9, 8};  // rows 1 and 2's next prompt tokens
  in[0].prompt_targets = ptgt0;
  in[0].prompt_row0 = 1;
  in[0].prompt_top = 4;
  in[1].seq_id = -2;
  in[1].tokens = t1;
  in[1].start_pos = 123;
  in[1].block_table = b1;
  in[1].banned = ban1;
  in[1].history = hist1;
  in[1].prompt_len = 3;
  in[1].allowed = allow1;
  in[1].sampling.presence_penalty = 0.5f;
  in[1].sampling.frequency_penalty = -1.25f;
  in[1].sampling.repetition_penalty = 1.3f;
  in[2].seq_id = 5;  // no tokens, no tables
  std::string bytes;
  encode_step(in, 2, bytes);
  WireStep out;
  out.seqs.resize(7);  // a step before with more sequences: reused
  decode_step(bytes, out);
  ASSERT_EQ(out.seqs.size(), 3u);
  EXPECT_EQ(out.num_results, 2u);
  for (size_t i = 0; i < 3; ++i) {
    const SeqStep &a = in[i], &b = out.seqs[i];
    EXPECT_EQ(a.seq_id, b.seq_id);
    EXPECT_EQ(a.start_pos, b.start_pos);
    EXPECT_EQ(std::vector<int32_t>(a.tokens.begin(), a.tokens.end()), std::vector<int32_t>(b.tokens.begin(), b.tokens.end()));
    EXPECT_EQ(std::vector<int32_t>(a.block_table.begin(), a.block_table.end()),
              std::vector<int32_t>(b.block_table.begin(), b.block_table.end()));
    EXPECT_EQ(std::vector<int32_t>(a.sliding_table.begin(), a.sliding_table.end()),
              std::vector<int32_t>(b.sliding_table.begin(), b.sliding_table.end()));
    EXPECT_EQ(std::vector<int32_t>(a.banned.begin(), a.banned.end()), std::vector<int32_t>(b.banned.begin(), b.banned.end()));
    EXPECT_EQ(std::vector<int32_t>(a.history.begin(), a.history.end()), std::vector<int32_t>(b.history.begin(), b.history.end()));
    EXPECT_EQ(a.prompt_len, b.prompt_len);
    EXPECT_EQ(std::vector<int32_t>(a.prompt_targets.begin(), a.prompt_targets.end()),
              std::vector<int32_t>(b.prompt_targets.begin(), b.prompt_targets.end()));
    EXPECT_EQ(a.prompt_row0, b.prompt_row0);
    EXPECT_EQ(a.prompt_top, b.prompt_top);
    EXPECT_EQ(std::vector<uint64_t>(a.allowed.begin(), a.allowed.end()), std::vector<uint64_t>(b.allowed.begin(), b.allowed.end()));
    EXPECT_EQ(a.sampling.presence_penalty, b.sampling.presence_penalty);
    EXPECT_EQ(a.sampling.frequency_penalty, b.sampling.frequency_penalty);
    EXPECT_EQ(a.sampling.repetition_penalty, b.sampling.repetition_penalty);
    ASSERT_EQ(a.logit_bias.size(), b.logit_bias.size());
    for (size_t j = 0; j < a.logit_bias.size(); ++j) {
      EXPECT_EQ(a.logit_bias[j].id, b.logit_bias[j].id);
      EXPECT_EQ(a.logit_bias[j].bias, b.logit_bias[j].bias);
    }
    EXPECT_EQ(a.sample, b.sample);
    EXPECT_EQ(a.expect_next, b.expect_next);
    EXPECT_EQ(a.rng_step, b.rng_step);
    EXPECT_EQ(a.sampling.temperature, b.sampling.temperature);
    EXPECT_EQ(a.sampling.top_p, b.sampling.top_p);
    EXPECT_EQ(a.sampling.top_k, b.sampling.top_k);
    EXPECT_EQ(a.sampling.min_p, b.sampling.min_p);
    EXPECT_EQ(a.sampling.seed, b.sampling.seed);
    EXPECT_EQ(a.sampling.top_logprobs, b.sampling.top_logprobs);
    EXPECT_EQ(a.sampling.logprobs, b.sampling.logprobs);
  }
}

TEST(StepWire, BadBytesAreRefused) {
  const std::vector<int32_t> t{1, 2, 3}, b{0};
  SeqStep s;
  s.seq_id = 1;
  s.tokens = t;
  s.block_table = b;
  std::string bytes;
  encode_step({&s, 1}, 1, bytes);
  WireStep out;
  for (size_t cut : {size_t(0), size_t(3), size_t(16), bytes.size() - 1}) {
    EXPECT_THROW(decode_step(bytes.substr(0, cut), out), Error) << cut;
  }
  EXPECT_THROW(decode_step(bytes + "x", out), Error);
  std::string bad = bytes;
  bad[0] ^= 1;
  EXPECT_THROW(decode_step(bad, out), Error);
  bad = bytes;
  bad[4] = char(0x7f);  // a sequence count the bytes cannot hold
  EXPECT_THROW(decode_step(bad, out), Error);
}

}  // namespace
