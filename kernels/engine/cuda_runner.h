// The CUDA engine behind mx::ModelRunner. Include only when MXSERVE_HAVE_CUDA is defined;
// `mxserve generate --device cuda`, serve and bench build the runner through make_cuda_runner.
// How one step runs, file by file: docs/engine.md.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "model/dense_quant.h"
#include "model/model_runner.h"
#include "model/tensor_parallel.h"

namespace mx {

struct CudaEngineOptions {
  std::string model_dir;              // checkpoint directory (ignored with dummy_weights)
  bool dummy_weights = false;         // random weights generated on the GPU at `preset` shapes
  std::string preset = "120b";        // 120b | 20b | tiny (dummy weights only)
  float gpu_memory_utilization = 0.9f;
  int max_model_len = 8192;           // longest sequence the KV cache must hold
  int max_num_seqs = 64;              // decode batch bound
  int max_tokens_per_step = 2048;     // activation arena bound (prefill chunk)
  int block_size = 16;
  int num_kv_blocks = 0;              // 0 = from gpu_memory_utilization
  bool kv_fp8 = false;                // --kv-cache-dtype fp8: E4M3 K and V (kv_cache.h); needs sm_89+
  DenseQuant dense;                   // --mxfp4-layers / --fp8-layers: quantized at load (dense_weight.h)
  bool keep_logits = false;           // copy sampled rows' logits to host (last_logits)
  int vocab_limit = 0;                // ids >= this are never sampled (tokenizer size); 0 = model vocab
  uint64_t seed = 1;                  // dummy-weight seed
  // Steps with at least this many tokens run the tensor-core prefill path (cuBLASLt GEMMs, grouped
  // MoE, flash attention); smaller steps run the decode kernels (in chunks of 8 tokens). 0: the GPU's
  // (5 where the FP8 MoE runs, sm_90: distinct rows from 5 a step are faster there; else 9; docs/perf.md).
  int prefill_min_tokens = 0;
  bool flash_prefill_attention = true;  // false: decode attention kernel for prompt tokens too (slow; a cross-check)
  // Decode steps of at least this many tokens (up to 8) run as one persistent kernel (decode_step.h),
  // smaller ones as six launches per layer: on distinct rows the launches win up to 5 tokens and fall
  // behind from 6 (docs/perf.md). 9: never.
  int decode_step_min_tokens = 6;
  // Enqueue the next one-token step of sequences that expect one (SeqStep::expect_next) before the
  // current step's results are read, fed by the GPU's picks: the GPU does not wait through the host's
  // turn. A next step() that asks for something else leaves that step's results unread (wasted work).
  bool decode_ahead = true;
  bool use_graphs = true;  // decode steps replay captured CUDA graphs (wide ones once their shape repeats)
  // --tensor-parallel-size and the rest (model/tensor_parallel.h): one GPU a rank, tp_runner.h.
  TensorParallel tp;
  double tp_step_timeout_s = 600;  // a rank whose step takes longer is taken for hung: the process exits
  bool tp_peer_allreduce = true;   // decode-size sums over peer memory when every pair of GPUs has access (tests: false)
};

struct CudaLoadStats {
  double upload_seconds = 0, upload_gbps = 0;
  size_t weight_bytes = 0, kv_bytes = 0, activation_bytes = 0;
};

// Steps enqueued by decode ahead, and those a later step() used.
struct DecodeAheadStats {
  uint64_t launched = 0, used = 0;
};

class CudaRunnerBase : public ModelRunner {
 public:
  virtual CudaLoadStats load_stats() const = 0;
  virtual DecodeAheadStats decode_ahead_stats() const = 0;
};

// One GPU, or with opt.tp.size > 1 this node's ranks of a tensor-parallel group on its first GPUs.
std::unique_ptr<CudaRunnerBase> make_cuda_runner(const CudaEngineOptions& opt);
// On a node other than 0 of a group across hosts (--node-rank > 0): runs the steps node 0 sends, until
// node 0 ends the group.
void run_remote_steps(CudaRunnerBase& runner);

// Device copy bandwidth: a big cudaMemcpy D2D, (bytes read + written) / time, in GB/s.
double measure_d2d_bandwidth_gbps(size_t bytes);
std::string cuda_device_name();

}  // namespace mx
