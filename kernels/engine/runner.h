// The CUDA runner: owns the device memory (memory_plan.h), the weights (device_model.h), the KV cache
// and the forward (forward.h), and executes steps (step.cpp): each step's metadata is planned into a
// pinned host buffer, copied on a copy stream, the forward enqueued (decode steps as captured graphs:
// up to 8 sequences on the decode path, wider ones on the prefill path once their shape repeats), and
// the picks collected from mapped host memory. Decode ahead
// enqueues the next one-token step before the current one's results are read.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "core/parallel.h"
#include "kernels/decode/decode_gemv.h"
#include "kernels/engine/cuda_runner.h"
#include "kernels/engine/device_model.h"
#include "kernels/engine/forward.h"
#include "kernels/engine/memory_plan.h"
#include "kernels/engine/probe.h"
#include "kernels/engine/step_wait.h"
#include "model/logit_adjust.h"
#include "model/sampler.h"

namespace mx {

// One step as step() enqueued it: what collect_step needs once its event has fired.
struct StepPlan {
  int M = 0, S = 0, nbt = 0, n_decode = 0;
  int nadj = 0;              // logit adjustments made on the GPU (StepMeta::adj)
  int nmask = 0;             // constrained rows masked on the GPU (StepMeta::mask)
  bool adjusts() const { return nadj > 0 || nmask > 0; }
  int parity = 0;            // its host metadata, device metadata, result slots, event and graphs
  bool filters = false;      // GPU top-k / top-p / min-p after the pick
  bool need_logits = false;  // logits copied to the host (host sampling or keep_logits)
  bool graph = false;        // runs as a captured decode graph
  bool wide_graph = false;   // a wide decode step: replays a captured graph where WideGraphs has one
  bool attn_long = false;    // a context past the tensor-core attention's one pass
  std::vector<int> sample_seq;  // the sequence index of each sampled row
  std::vector<uint8_t> host_pick;  // per sampled row: sampled on the host from the copied logits
  std::vector<SeqRows> layout;  // per sequence
  // Prompt log-prob rows (SeqStep::prompt_targets): a sequence's rows [row, row + n) of the step, their
  // targets and results from entry `first` of the runner's prompt buffers on.
  struct PromptRows {
    int seq = 0, row = 0, n = 0, top = 0, first = 0;
  };
  std::vector<PromptRows> prompt;
  // Sampled rows picked on the GPU that report alternatives (top_logprobs): (sampled row, how many).
  std::vector<std::pair<int, int>> tops;
};

// Decode ahead (CudaEngineOptions::decode_ahead): after a graph step whose sequences all expect a next
// token, step() enqueues that next step (positions + 1, the tokens the GPU picks) before it waits for
// the current one. The next step() call uses it if it asks for exactly that step, and otherwise leaves
// its results unread.
struct DecodeAhead {
  bool active = false;
  int parity = 0;
  std::vector<SeqStep> steps;                       // the step enqueued (tokens: the device's picks)
  std::vector<int32_t> feed;                        // their tokens: -(j + 1), the step before's sampled row j
  std::vector<std::vector<int32_t>> full, sliding;  // their block tables (copies)
  std::vector<std::vector<int32_t>> banned;         // their banned tokens (copies)
  std::vector<std::vector<LogitBias>> bias;         // and logit biases (copies)
  std::vector<int32_t> fed;                         // the tokens it was fed, once the step before is collected
  std::vector<int32_t> place;                       // each row's index in the step that used it, -1: ended
  std::vector<int32_t> from;                        // each row's index in the step it was enqueued behind
  DecodeAheadStats stats;
};

// Captured decode steps, one per key: what changes the launches a graph records.
struct GraphKey {
  int tokens = 1;          // 1..8, one token per sequence (every token sampled)
  bool attn_long = false;  // full layers on the register attention kernel
  int parity = 0;          // the metadata buffer and result slot it reads and writes
  bool full_logits = false;  // tensor parallel: the logits gathered (StepView::full_logits)
  bool adjust = false;       // logit adjustments before the pick (StepView::adjust)
};
class DecodeGraphs {
 public:
  DecodeGraphs() = default;
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;
  ~DecodeGraphs() { clear(); }
  cudaGraphExec_t& at(const GraphKey& k) {
    return g_[size_t(k.tokens + (cuda::kDecodeMaxTokens + 1) *
                                    (int(k.attn_long) + 2 * k.parity + 4 * int(k.full_logits) + 8 * int(k.adjust)))];
  }
  void clear();  // after anything a graph captured changed (a diagnostic turned on or off)

 private:
  std::array<cudaGraphExec_t, (cuda::kDecodeMaxTokens + 1) * 16> g_{};
};

// Captured wide decode steps (single-token rows only, on the prefill forward, every row sampled), one
// per key: what changes their launches.
// A wide graph step of kWideGraphPadFrom rows or more is padded to a multiple of kWideGraphRows
// (CudaRunner::pad_wide_step). Below, padding rows (all routed alike) could add experts to the step.
constexpr int kWideGraphRows = 8, kWideGraphPadFrom = 32;
struct WideGraphKey {
  int tokens = 0;
  int parity = 0;
  bool attn_long = false, full_logits = false, adjust = false;
  Forward::DecodeRowSplits splits;
  bool operator==(const WideGraphKey&) const = default;
};
// A shape is captured when a wide step repeats the shape of the wide step before it (a load's steady
// phases; rows padded to kWideGraphRows, so a batch that moves by a few rows keeps its shape), so a shape
// seen once stays eager and costs no capture; the least recently used of more than kMax graphs is dropped.
class WideGraphs {
 public:
  static constexpr int kMax = 16;
  WideGraphs() = default;
  WideGraphs(const WideGraphs&) = delete;
  WideGraphs& operator=(const WideGraphs&) = delete;
  ~WideGraphs() { clear(); }
  cudaGraphExec_t find(const WideGraphKey& k);  // null where not captured
  bool repeats(const WideGraphKey& k);          // k's shape (parity aside) is the last one asked; remembers k
  void add(const WideGraphKey& k, cudaGraphExec_t g);
  void clear();

 private:
  struct Entry {
    WideGraphKey key;
    cudaGraphExec_t exec = nullptr;
    uint64_t used = 0;
  };
  std::vector<Entry> e_;
  uint64_t clock_ = 0;
  WideGraphKey last_;
};

class CudaRunner final : public CudaRunnerBase {
 public:
  // rank / tp: this GPU's place in a tensor-parallel group (tp_runner.h); rank 0 and null on one GPU.
  explicit CudaRunner(const CudaEngineOptions& opt, int rank = 0, const cuda::TpComm* tp = nullptr);
  ~CudaRunner() override;

  const ModelConfig& config() const override { return cfg_; }
  KvCacheShape kv_shape() const override { return {opt_.block_size, kv_.num_blocks, kv_.sliding_window}; }
  CudaLoadStats load_stats() const override { return stats_; }
  DecodeAheadStats decode_ahead_stats() const override { return ahead_.stats; }
  std::span<const float> last_logits(int index) const override;
  double device_busy_seconds() const override { return busy_s_; }
  void step(std::span<const SeqStep> seqs, std::span<SampleResult> out) override;

 private:
  friend class CudaBenchHooks;
  void allocate();
  // step() in parts (step.cpp): the metadata into host buffer `parity` (checked; device_tokens: a
  // negative token is the previous step's pick of the same row), its launch, and its results.
  StepPlan& plan_step(std::span<const SeqStep> seqs, int parity, bool device_tokens);
  void enqueue_step(const StepPlan& pl);
  // place (an ahead step used for fewer rows): each planned row's index in seqs, -1 for one not asked for.
  void collect_step(const StepPlan& pl, std::span<const SeqStep> seqs, std::span<SampleResult> out,
                    std::span<const int32_t> place = {});
  bool ahead_rows(std::span<const SeqStep> seqs);  // the step enqueued ahead runs seqs (sets ahead_.place)
  void launch_ahead(std::span<const SeqStep> seqs, const StepPlan& pl);
  StepView view(const StepPlan& pl) const;
  void run_decode_graph(const StepPlan& pl);
  // The key of a step to capture behind (capture_wide_step), if any.
  std::optional<WideGraphKey> run_wide_step(const StepPlan& pl, const StepView& st);
  void capture_wide_step(const StepPlan& pl, const WideGraphKey& k);
  WideGraphKey wide_key(const StepPlan& pl, const StepView& st) const;
  void pad_wide_step(StepPlan& pl);
  void mask_row(const StepMeta& h, int slot, int row, std::span<const uint64_t> allowed) const;
  // Steps of fewer tokens (or heads other than 64 wide) run the decode forward in chunks of 8.
  bool decode_path(int M) const { return M < opt_.prefill_min_tokens || cfg_.head_dim != 64; }
  // Tensor parallel: the step gathers the whole logits (filters or host reads), not the picks' partials.
  bool full_logits(const StepPlan& pl) const {
    return opt_.tp.size > 1 && (pl.filters || pl.need_logits || !pl.tops.empty());
  }
  GraphKey graph_key(const StepPlan& pl) const { return {pl.M, pl.attn_long, pl.parity, full_logits(pl), pl.adjusts()}; }
  void wait_step(const StepPlan& pl);  // until the step's last kernel is done
  // The prompt log-prob rows among step rows [t0, t0 + m), whose last layer's output is x (+ y_slot).
  void enqueue_prompt_logprobs(const StepPlan& pl, const float* x, const float* y_slot, int t0, int m);

  CudaEngineOptions opt_;
  ModelConfig cfg_;
  DeviceModel model_;
  MemoryPlan plan_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;  // the metadata copies, beside the step before
  CudaLoadStats stats_;
  uint8_t *weights_arena_ = nullptr, *act_arena_ = nullptr, *kv_arena_ = nullptr;
  Activations act_{};
  KvCache kv_;
  Probe probe_;
  std::unique_ptr<Forward> forward_;
  // Per parity: host (pinned) and device metadata buffers, the plan, and two events: after the step's
  // last kernel (its device metadata is free) and after its metadata copy (its host buffer is free).
  StepMeta hmeta_[2]{}, dmeta_[2]{};
  StepPlan plans_[2];
  cudaEvent_t done_[2]{}, copied_[2]{};
  cudaEvent_t began_[2]{}, ended_[2]{};  // timed: a step's first and last kernel (device_busy_seconds)
  double busy_s_ = 0;
  int32_t* hmeta_block_ = nullptr;
  int parity_ = 0;            // of the step being enqueued
  StepWait::Clock::time_point enqueued_at_[2]{};
  StepWait wait_;
  DecodeAhead ahead_;
  std::vector<int32_t> pick_row_;  // step(): each sequence's sampled row in the step that runs it
  DecodeGraphs graphs_;
  WideGraphs wide_graphs_;
  int vocab_limit_ = 0;       // ids >= this (beyond the tokenizer) are never sampled
  int last_sampled_ = 0;      // rows of the last collected step (last_logits)
  float* host_logits_ = nullptr;
  void* host_res_ = nullptr;  // two result slots of S tokens then S log-probs (parity), mapped
  float* res_dev_ = nullptr;  // host_res_ as the device sees it
  // Prompt log-probs of a step (at most T rows), mapped: the targets the host writes, the results
  // (cuda::kTokenLogprobFloats a row) the GPU writes. One set: a step with such rows runs alone (no
  // step is enqueued ahead of or behind it before it is collected).
  int32_t* prompt_targets_ = nullptr;
  int32_t* prompt_rows_ = nullptr;  // each one's row in the rows its forward leaves
  float* prompt_res_ = nullptr;
  int32_t *prompt_targets_dev_ = nullptr, *prompt_rows_dev_ = nullptr;
  float* prompt_res_dev_ = nullptr;
  // The same for the sampled rows in StepPlan::tops (at most S): their rows, their results. One set: a step
  // with them has nothing enqueued ahead of it.
  int32_t *top_rows_ = nullptr, *top_rows_dev_ = nullptr;
  float *top_res_ = nullptr, *top_res_dev_ = nullptr;
  // Host sampling (rows past the GPU's adjustment list or mask slots): in parallel on a few threads.
  ThreadPool sample_pool_{std::min(8, int(std::max(1u, std::thread::hardware_concurrency())))};
  std::vector<std::vector<float>> scratch_;
  std::vector<int32_t> penalty_scratch_;  // adjust_row_logits' sort buffer
  LogitAdjustList adjust_{cfg_.vocab_size, sample_pool_};  // a step's logit adjustments (StepMeta::adj)
  std::vector<SampleJob> jobs_;
};

}  // namespace mx
