#include "model/cpu_runner.h"

#include <limits>

#include "core/error.h"
#include "model/sampler.h"

namespace mx {

CpuRunner::CpuRunner(const CpuRunnerOptions& opt)
    : cfg_(load_model_config(opt.model_dir)),
      ckpt_(Checkpoint::open(opt.model_dir)),
      weights_(bind_weights(ckpt_, cfg_)),
      pool_(opt.num_threads) {
  if (opt.kv_block_size < 1 || opt.kv_tokens < opt.kv_block_size)
    fail("KV cache of {} tokens in blocks of {} is too small", opt.kv_tokens, opt.kv_block_size);
  apply_dense_quant(opt.dense, cfg_, weights_, dense_copies_);
  ref_ = std::make_unique<CpuReference>(cfg_, weights_, &pool_);
  kv_.allocate(cfg_, opt.kv_block_size, opt.kv_tokens / opt.kv_block_size);
  kv_.fp8 = opt.kv_fp8;
  for (uint8_t sl : cfg_.layer_is_sliding)
    if (sl) sliding_window_ = cfg_.sliding_window;
  vocab_limit_ = opt.vocab_limit > 0 && opt.vocab_limit < cfg_.vocab_size ? opt.vocab_limit : cfg_.vocab_size;
}

void CpuRunner::step(std::span<const SeqStep> seqs, std::span<SampleResult> out) {
  logits_.resize(seqs.size());
  jobs_.clear();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqStep& s = seqs[i];
    const int n = int(s.tokens.size());
    const int end = s.start_pos + n;
    MX_CHECK(int64_t(s.block_table.size()) * kv_.block_size >= end, "sequence {}: block table covers {} positions, needs {}",
             s.seq_id, s.block_table.size() * kv_.block_size, end);
    const int need = (end + kv_.block_size - 1) / kv_.block_size;
    for (int b = 0; b < need; ++b)
      MX_CHECK(s.block_table[b] >= 0 && s.block_table[b] < kv_.num_blocks, "sequence {}: KV block {} out of range",
               s.seq_id, s.block_table[b]);
    if (sliding_window_ > 0) {
      MX_CHECK(int64_t(s.sliding_table.size()) >= need, "sequence {}: sliding block table covers {} blocks, needs {}",
               s.seq_id, s.sliding_table.size(), need);
      for (int b = sliding_first_block(kv_shape(), s.start_pos); b < need; ++b)
        MX_CHECK(s.sliding_table[b] >= 0 && s.sliding_table[b] < kv_.num_blocks,
                 "sequence {}: sliding KV block {} out of range", s.seq_id, s.sliding_table[b]);
    }
    if (s.sample) logits_[i].resize(cfg_.vocab_size);
    const int p0 = s.prompt_row0, np = int(s.prompt_targets.size());
    MX_CHECK(np == 0 || (p0 >= 0 && p0 + np <= n && s.prompt_top >= 0 && s.prompt_top <= kMaxPromptTop),
             "sequence {}: prompt log-prob rows [{}, {}) of {} tokens, top {}", s.seq_id, p0, p0 + np, n, s.prompt_top);
    out[i].prompt.clear();
    if (np > 0) prompt_logits_.resize(cfg_.vocab_size);
    for (int t = 0; t < n; ++t) {
      const bool last = (t == n - 1) && s.sample;
      const bool prompt = t >= p0 && t < p0 + np;
      float* row = last ? logits_[i].data() : prompt ? prompt_logits_.data() : nullptr;
      ref_->forward_token(s.tokens[t], s.start_pos + t, s.block_table.data(),
                          sliding_window_ > 0 ? s.sliding_table.data() : nullptr, kv_, row);
      if (prompt) out[i].prompt.push_back(token_logprob(row, vocab_limit_, s.prompt_targets[t - p0], s.prompt_top));
    }
    if (s.sample) {
      for (int v = vocab_limit_; v < cfg_.vocab_size; ++v) logits_[i][v] = -std::numeric_limits<float>::infinity();
      adjust_row_logits(logits_[i].data(), cfg_.vocab_size, s, penalty_scratch_);
      jobs_.push_back({logits_[i].data(), &s.sampling, s.rng_step, &out[i]});
    }
  }
  sample_tokens(jobs_, vocab_limit_, pool_, scratch_);
}

std::span<const float> CpuRunner::last_logits(int index) const {
  if (index < 0 || size_t(index) >= logits_.size()) return {};
  return logits_[index];
}

}  // namespace mx
