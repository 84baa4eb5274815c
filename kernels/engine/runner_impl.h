// The CUDA runner's state, shared by its three translation units:
//   cuda_runner.cpp     memory plan, weight upload / dummy fill, step() and CUDA graphs
//   forward_decode.cpp  the decode forward (M <= 8 tokens): one persistent kernel, or six per layer
//   forward_prefill.cpp the prefill forward (many tokens): cuBLASLt GEMMs, grouped MoE, flash attention
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/parallel.h"
#include "kernels/decode/decode_step.h"
#include "kernels/engine/cuda_runner.h"
#include "kernels/gemm/gemm_bf16.h"
#include "model/sampler.h"

namespace mx {

struct DevLayer {
  uint16_t *attn_norm, *qkv_w, *qkv_b, *o_w, *o_b, *sinks, *mlp_norm, *router_w, *router_b;
  uint8_t *up_blocks, *up_scales, *down_blocks, *down_scales;
  uint16_t *up_bias, *down_bias;
  uint16_t *k_cache, *v_cache;
};

// Byte sizes of every tensor of one layer, in arena order.
struct LayerSizes {
  size_t attn_norm, qkv_w, qkv_b, o_w, o_b, sinks, mlp_norm, router_w, router_b, up_blocks, up_scales, up_bias,
      down_blocks, down_scales, down_bias;
  explicit LayerSizes(const ModelConfig& c);
  size_t total() const;
  size_t expert_bytes() const;  // all experts, fc1 + fc2 (blocks, scales, bias)
};

// Distinct experts M tokens touch on average with uniform routing (bytes-read estimates).
double expected_distinct_experts(const ModelConfig& c, int M);

// Step metadata in one pinned host block and its device mirror (one H2D copy per step).
struct StepMeta {
  int32_t *tok, *pos, *slot, *bt_off, *srow, *srow_local, *decode_rows, *bt;
  // The sliding-window layers' cache rows and block-table offsets (equal to slot / bt_off when the
  // model has no sliding layers).
  int32_t *slot_sw, *bt_off_sw;
  uint64_t* sample_key;  // [S] random stream of each sampled row (GPU sampling)
  float* inv_temp;       // [S] 1 / temperature for GPU sampling, 0 = greedy (or sampled on the host)
  float *top_p, *min_p;  // [S] filters of GPU sampling (1 / 0 = off)
  int32_t* top_k;        // [S] 0 = off
};

// One step as step() enqueued it: what collect_step needs once its event has fired.
struct StepPlan {
  int M = 0, S = 0, nbt = 0, n_decode = 0;
  int parity = 0;            // its host metadata, result slots, event and graphs (double-buffered)
  bool filters = false;      // GPU top-k / top-p / min-p after the pick
  bool need_logits = false;  // logits copied to the host (host sampling or keep_logits)
  bool graph = false;        // ran as a captured decode graph
  bool attn_long = false;    // a context past the tensor-core attention's one pass (CudaRunner::attn_long_)
  std::vector<int> sample_seq;  // the sequence index of each sampled row
  // Per sequence: first token row, token count, block-table offsets of the full and sliding layers.
  std::vector<std::array<int, 4>> layout;
};

// Decode ahead (CudaEngineOptions::decode_ahead): after a graph step whose sequences all expect a next
// token, step() enqueues that next step (positions + 1, the tokens the GPU picks) before it waits for
// the current one, so the GPU does not idle through the host's turn. The next step() call uses it if it
// asks for exactly that step, and otherwise leaves its results unread (step.cpp).
struct DecodeAhead {
  bool active = false;
  int parity = 0;
  std::vector<SeqStep> steps;                  // the step enqueued (tokens: the device's picks)
  std::vector<std::vector<int32_t>> full, sliding;  // their block tables (copies)
  std::vector<int32_t> fed;                    // the tokens it was fed, once the step before is collected
  uint64_t launched = 0, used = 0;
};

class CudaRunner final : public CudaRunnerBase {
 public:
  explicit CudaRunner(const CudaEngineOptions& opt);
  ~CudaRunner() override;

  const ModelConfig& config() const override { return cfg_; }
  KvCacheShape kv_shape() const override { return {opt_.block_size, num_blocks_, sliding_window_}; }
  CudaLoadStats load_stats() const override { return stats_; }
  double decode_weight_bytes(int M) const override;
  std::span<const float> last_logits(int index) const override;
  void step(std::span<const SeqStep> seqs, std::span<SampleResult> out) override;
  void set_profiling(bool on) override { profiling_ = on; ahead_.active = false; }
  std::vector<KernelProfile> last_profile() const override { return profile_; }
  void set_use_graphs(bool on) override { use_graphs_ = on; ahead_.active = false; }
  void set_decode_skip(uint32_t mask) override;
  double replay_decode_graph_ms(int M, int n) override;
  uint64_t decode_ahead_used() const override { return ahead_.used; }
  uint64_t decode_ahead_launched() const override { return ahead_.launched; }
  void set_step_trace(bool on) override;
  std::vector<uint64_t> last_step_trace() const override;
  int last_step_trace_kind() const override { return step_trace_kind_; }

 private:
  void plan_memory();
  void fill_dummy();
  void upload(const struct ModelWeights& w);
  void check_scales();
  bool prefill_path_supported() const;

  // Decode forward over tokens [t0, t0 + M) of the step (M <= 8); samples the S rows listed in
  // meta srow_local[s0 .. s0 + S) into logits / results slot s0. one_token_per_seq: no two of the
  // M tokens belong to the same sequence.
  void forward_decode(int t0, int M, int s0, int S, bool one_token_per_seq = false);
  // The same step as one persistent kernel (decode_step.h); forward_decode calls it unless profiling
  // or leaving kernels out, which need the per-op launches.
  void forward_decode_step(int t0, int M, int s0, int S, bool one_token_per_seq);
  // Prefill forward over all M tokens of the step with the sequences' layout.
  void forward_prefill(int M, int S, const std::vector<std::array<int, 4>>& seqs, int n_decode);
  bool sliding(int layer) const { return sliding_window_ > 0 && cfg_.layer_is_sliding[size_t(layer)]; }
  void final_logits(const float* x, const float* y_slot, const int32_t* rows, int s0, int S);
  // int32 words of the step metadata before the block tables: 9 token arrays, then (at an even
  // offset) the 64-bit sample keys, the inverse temperatures, top_p, min_p and top_k of the sampled rows.
  int meta_key_off() const { return (9 * T_ + 1) & ~1; }  // even: the 64-bit keys stay 8-byte aligned
  int meta_tail() const { return meta_key_off() + 6 * S_; }
  void run_decode_graph(int M);
  // step() in parts (step.cpp): the metadata into host buffer `parity` (checked; device_tokens: a
  // negative token is the previous step's pick of the same row), its launch, and its results.
  StepPlan& plan_step(std::span<const SeqStep> seqs, int parity, bool device_tokens);
  void enqueue_step(const StepPlan& pl);
  void collect_step(const StepPlan& pl, std::span<const SeqStep> seqs, std::span<SampleResult> out);
  bool ahead_matches(std::span<const SeqStep> seqs) const;
  void launch_ahead(std::span<const SeqStep> seqs, const StepPlan& pl);

  // Kernel timing for `bench --breakdown` (eager steps only).
  void mark(const char* name, double bytes);

  CudaEngineOptions opt_;
  ModelConfig cfg_;
  cudaStream_t stream_ = nullptr;
  CudaLoadStats stats_;
  int vocab_limit_ = 0;  // ids >= this (beyond the tokenizer) are never sampled
  int T_ = 0, S_ = 0, bt_cap_ = 0, num_blocks_ = 0, last_sampled_ = 0;
  int sliding_window_ = 0;  // kv_shape().sliding_window: 0 when no layer slides
  int sm_count_ = 0;
  int attn_rows_ = 0;  // rows the decode attention's split-K scratch holds
  uint8_t *weights_ = nullptr, *act_ = nullptr, *kv_ = nullptr;
  uint16_t *embed_ = nullptr, *lm_head_ = nullptr, *final_norm_ = nullptr;
  std::vector<DevLayer> layers_;
  // activations
  float *xa_, *xb_, *qkv_, *router_, *ew_, *ysl_, *logits_, *dres_, *inv_freq_, *attn_part_, *argmax_part_;
  uint16_t *xn_, *qbf_, *attn_, *act_bf_, *xs_;
  int32_t *eidx_, *tickets_;
  unsigned* step_counters_ = nullptr;               // ready counters of the persistent decode step
  cuda::DecodeStepLayer* step_layers_ = nullptr;    // its per-layer pointers (device)
  long long* route_acc_ = nullptr;                  // one-token router sums [layers][E] (OProjRouterParams)
  float* ss_part_ = nullptr;                        // and the sums of squares of the current layer
  unsigned long long* attn_mma_part_ = nullptr;     // attention_decode_mma's tagged partials (M <= 8)
  unsigned long long* step_trace_ = nullptr;        // diagnostics only: allocated by set_step_trace
  size_t step_trace_items_ = 0;
  size_t step_trace_words_ = 0;                     // its capacity
  int step_trace_kind_ = 0;                         // last_step_trace_kind()
  // The per-op decode path's CTA records (cta_trace.h) go to step_trace_, behind a cursor after it.
  cuda::CtaTrace op_trace(int layer) const;
  bool mma_attention_ = false;                      // full layers may run attention_decode_mma (this shape)
  // grouped-MoE routing scratch (prefill)
  int32_t *moe_counts_, *moe_offsets_, *moe_sorted_tok_, *moe_sorted_slot_, *moe_tile_expert_, *moe_tile_row0_,
      *moe_num_tiles_;
  float* moe_sorted_w_;
  int moe_max_tiles_ = 0;
  cuda::GemmContext* gemm_ = nullptr;
  // hmeta_ / dmeta_: the host and device buffers of the step being enqueued (parity). A step's
  // metadata is copied on copy_stream_, so a decode-ahead step's copy runs beside the step before it.
  StepMeta hmeta_{}, dmeta_{};
  StepMeta hmeta_buf_[2]{}, dmeta_buf_[2]{};
  cudaStream_t copy_stream_ = nullptr;
  StepPlan plans_[2];
  cudaEvent_t done_[2]{};       // after each parity's last enqueued step (its device metadata is free)
  cudaEvent_t copied_[2]{};     // after its metadata copy (copy_stream_: the host buffer may be rewritten)
  int parity_ = 0;              // of the step being enqueued: graphs_ and the result slots
  DecodeAhead ahead_;
  int32_t* dtok_ = nullptr;     // [S] the last step's picks on the device (decode ahead's input)
  float* res_cur_ = nullptr;    // the device view of the result slots of the step being enqueued
  size_t meta_bytes_ = 0;
  float concentration_ = 1.f;
  float* host_logits_ = nullptr;
  void* host_res_ = nullptr;  // two result slots of S tokens then S log-probs (parity)
  float* res_dev_ = nullptr;  // host_res_ as the device sees it (mapped)
  // Host sampling (top-k / top-p / min-p / top_logprobs rows): in parallel on a few threads.
  ThreadPool sample_pool_{std::min(8, int(std::max(1u, std::thread::hardware_concurrency())))};
  std::vector<std::vector<float>> scratch_;
  std::vector<SampleJob> jobs_;
  // CUDA graphs of the single-chunk decode step, one per token count 1..8, attention kernel and result
  // slot parity (graph_slot).
  bool use_graphs_ = true;
  uint32_t skip_ = 0;  // DecodeKernelBit mask (bench only)
  std::array<cudaGraphExec_t, 36> graphs_{};
  // Some sequence of the step has more keys than the tensor-core attention holds in one pass: the full
  // layers run the register kernel (attention_decode.h).
  bool attn_long_ = false;
  int graph_slot(int M) const { return M + (attn_long_ ? 9 : 0) + 18 * parity_; }
  // profiling
  bool profiling_ = false;
  std::vector<cudaEvent_t> events_;
  std::vector<std::pair<const char*, double>> marks_;
  std::vector<KernelProfile> profile_;
};

}  // namespace mx
