// ModelRunner on the CPU reference: maps the checkpoint, owns the fp32 paged KV cache, runs
// each sequence's tokens through CpuReference and samples on the host.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "model/checkpoint.h"
#include "model/cpu_reference.h"
#include "model/dense_quant.h"
#include "model/model_runner.h"
#include "model/sampler.h"
#include "model/weights.h"

namespace mx {

struct CpuRunnerOptions {
  std::string model_dir;
  int num_threads = 0;         // 0 = all cores
  int kv_block_size = 16;
  int kv_tokens = 16384;       // KV capacity in tokens (all sequences together)
  int vocab_limit = 0;         // ids >= this are never sampled (tokenizer size); 0 = model vocab
  bool kv_fp8 = false;         // --kv-cache-dtype fp8 (CpuKvCache::fp8)
  DenseQuant dense;            // --mxfp4-layers / --fp8-layers (model/dense_quant.h)
};

class CpuRunner : public ModelRunner {
 public:
  explicit CpuRunner(const CpuRunnerOptions& opt);  // throws mx::Error on a bad checkpoint
  const ModelConfig& config() const override { return cfg_; }
  KvCacheShape kv_shape() const override { return {kv_.block_size, kv_.num_blocks, sliding_window_}; }
  void step(std::span<const SeqStep> seqs, std::span<SampleResult> out) override;
  std::span<const float> last_logits(int index) const override;

 private:
  ModelConfig cfg_;
  Checkpoint ckpt_;
  ModelWeights weights_;
  std::vector<std::vector<uint16_t>> dense_copies_;  // the quantized dense tensors weights_ points at
  ThreadPool pool_;
  std::unique_ptr<CpuReference> ref_;
  CpuKvCache kv_;
  int vocab_limit_;
  int sliding_window_ = 0;  // kv_shape().sliding_window: 0 when no layer slides
  std::vector<std::vector<float>> logits_;  // per sampled sequence of the last step
  std::vector<float> prompt_logits_;         // a prompt log-prob row's logits
  std::vector<std::vector<float>> scratch_;  // sampler buffers, one per pool part
  std::vector<int32_t> penalty_scratch_;     // adjust_row_logits' sort buffer
  std::vector<SampleJob> jobs_;
};

}  // namespace mx
