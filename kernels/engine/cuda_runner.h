// The CUDA engine behind mx::ModelRunner. Include only when MXSERVE_HAVE_CUDA is defined;
// `mxserve generate --device cuda`, serve and bench build the runner through make_cuda_runner.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "model/model_runner.h"

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
  bool keep_logits = false;           // copy sampled rows' logits to host (last_logits)
  int vocab_limit = 0;                // ids >= this are never sampled (tokenizer size); 0 = model vocab
  uint64_t seed = 1;                  // dummy-weight seed
  // Steps with at least this many tokens run the tensor-core prefill path (cuBLASLt GEMMs, grouped
  // MoE, flash attention); smaller steps run the decode kernels (in chunks of 8 tokens).
  int prefill_min_tokens = 9;
  bool flash_prefill_attention = true;  // false: decode attention kernel for prompt tokens too (slow; a cross-check)
  // Decode steps of at least this many tokens (up to 8) run as one persistent kernel (decode_step.h),
  // smaller ones as six launches per layer, which are faster there (H100, 120b, tok/s at batch 1 / 4
  // / 6: 287 / 766 / 849 vs 250 / 672 / 768; at 7 / 8: 799 / 786 vs 898 / 882; docs/perf.md). 9: never.
  int decode_step_min_tokens = 7;
  // Enqueue the next one-token step of sequences that expect one (SeqStep::expect_next) before the
  // current step's results are read, fed by the GPU's picks: the GPU does not wait through the host's
  // turn. A next step() that asks for something else leaves that step's results unread (wasted work);
  // false: never (bench --no-decode-ahead, A/B).
  bool decode_ahead = true;
};

struct CudaLoadStats {
  double upload_seconds = 0, upload_gbps = 0;
  size_t weight_bytes = 0, kv_bytes = 0, activation_bytes = 0;
};

// Time and bytes of one kernel kind over the last profiled step (all layers summed).
struct KernelProfile {
  std::string name;
  double ms = 0, bytes = 0;
  int calls = 0;
};

// Kernel kinds of the decode step, for set_decode_skip (bench only).
enum DecodeKernelBit : uint32_t {
  kDecodeQkv = 1, kDecodeAttention = 2, kDecodeOProj = 4, kDecodeRouter = 8, kDecodeFc1 = 16, kDecodeFc2 = 32,
  kDecodeHead = 64,  // final norm, lm_head and the pick
};
inline constexpr const char* kDecodeKernelNames[] = {"qkv_rope_kv", "attention", "o_proj_residual", "router",
                                                     "moe_fc1_swiglu", "moe_fc2", "final_norm+lm_head+pick"};

class CudaRunnerBase : public ModelRunner {
 public:
  virtual CudaLoadStats load_stats() const = 0;
  // Profiled steps run eagerly with an event after every kernel (slower; for `bench --breakdown`).
  virtual void set_profiling(bool on) = 0;
  virtual std::vector<KernelProfile> last_profile() const = 0;
  virtual void set_use_graphs(bool on) = 0;
  // Bench only: decode steps leave out the kernel kinds whose DecodeKernelBit is set (their outputs
  // go stale, results are garbage), so graph replays time each kind's marginal cost.
  virtual void set_decode_skip(uint32_t mask) = 0;
  // Diagnostics (bench --step-trace): the persistent decode step records its per-item timeline
  // (DecodeStepParams::trace) in the following steps; last_step_trace() copies the last one.
  virtual void set_step_trace(bool on) = 0;
  virtual std::vector<uint64_t> last_step_trace() const = 0;
  // Layout of that trace: 0 = the persistent step's work items (4 words each), 2 = per-CTA records of
  // the per-op launches (cta_trace.h).
  virtual int last_step_trace_kind() const = 0;
  // Bytes of weights read by one decode step for M tokens (dense + expected distinct experts).
  virtual double decode_weight_bytes(int M) const = 0;
  // Bench only: replays the M-token decode graph n times back to back (the last step's metadata, no
  // host work between replays) and returns ms a replay: the step's GPU time without the host's turn.
  virtual double replay_decode_graph_ms(int M, int n) = 0;
  // Steps served by decode ahead (CudaEngineOptions::decode_ahead) so far, and those enqueued ahead.
  virtual uint64_t decode_ahead_used() const = 0;
  virtual uint64_t decode_ahead_launched() const = 0;
};

std::unique_ptr<CudaRunnerBase> make_cuda_runner(const CudaEngineOptions& opt);

}  // namespace mx

namespace mx {
// Device copy bandwidth: a big cudaMemcpy D2D, (bytes read + written) / time, in GB/s.
double measure_d2d_bandwidth_gbps(size_t bytes);
std::string cuda_device_name();
}  // namespace mx
