// Tensor parallelism on one host (docs/tensor_parallel.md): one CudaRunner a GPU over its shard, each
// driven by its own thread, all running the same steps; the forward's reduce points and the logits'
// gather (forward.h) go through NCCL and the one-shot peer all-reduce. Rank 0's results are the step's.
// A rank that fails inside a step, or takes longer than CudaEngineOptions::tp_step_timeout_s, leaves the
// others waiting in their collectives for good: the process then exits with one line naming the rank.
#pragma once
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/comm/nccl_comm.h"
#include "kernels/comm/peer_allreduce.h"
#include "kernels/comm/tp_comm.h"
#include "kernels/engine/cuda_runner.h"

namespace mx {

class CudaRunner;

class TpRunner final : public CudaRunnerBase {
 public:
  explicit TpRunner(const CudaEngineOptions& opt);  // ranks 0 .. opt.tp.size - 1 on GPUs 0 .. size - 1
  ~TpRunner() override;
  TpRunner(const TpRunner&) = delete;
  TpRunner& operator=(const TpRunner&) = delete;

  const ModelConfig& config() const override;
  KvCacheShape kv_shape() const override;     // the fewest blocks any rank holds
  CudaLoadStats load_stats() const override;  // bytes summed over the GPUs
  DecodeAheadStats decode_ahead_stats() const override;
  std::span<const float> last_logits(int index) const override;
  void step(std::span<const SeqStep> seqs, std::span<SampleResult> out) override;
  CudaRunner& rank(int r) { return *runners_[size_t(r)]; }

 private:
  void rank_main(int r);
  void set_up(int r);
  void shutdown();  // stops and joins the ranks' threads
  [[noreturn]] void fatal(const std::string& why) const;

  CudaEngineOptions opt_;
  int size_;
  cuda::NcclId id_{};
  std::unique_ptr<cuda::PeerAllReduce> peer_;  // null when some pair of GPUs has no peer access
  std::vector<std::unique_ptr<cuda::NcclComm>> nccl_;
  std::vector<cuda::TpComm> comms_;
  std::vector<std::unique_ptr<CudaRunner>> runners_;
  std::vector<std::thread> threads_;
  // The step being run: published under mu_, a new generation wakes the ranks.
  std::mutex mu_;
  std::condition_variable go_, done_;
  std::span<const SeqStep> seqs_;
  std::span<SampleResult> out_;
  std::vector<std::vector<SampleResult>> rank_out_;  // ranks other than 0 write here
  std::vector<std::string> errors_;
  unsigned long long gen_ = 0;
  int finished_ = 0, ready_ = 0;
  bool stop_ = false;
};

}  // namespace mx
