// Tensor parallelism on the CUDA engine (docs/tensor_parallel.md): a RankGroup (model/rank_group.h) whose
// ranks are CudaRunners over their shards, one GPU each; this file adds what is CUDA's: the GPUs, NCCL
// (its unique id is the group's secret), the one-shot peer all-reduce on one host, and each rank's
// collectives (cuda::TpComm), which the forward's reduce points and the logits' gather use.
#pragma once
#include <memory>
#include <vector>

#include "kernels/comm/nccl_comm.h"
#include "kernels/comm/peer_allreduce.h"
#include "kernels/comm/tp_comm.h"
#include "kernels/engine/cuda_runner.h"
#include "model/rank_group.h"

namespace mx {

class CudaRunner;

class TpRunner final : public CudaRunnerBase {
 public:
  // This node's ranks (opt.tp.ranks_per_node() of them) on its GPUs 0, 1, ...
  explicit TpRunner(const CudaEngineOptions& opt);
  ~TpRunner() override;

  const ModelConfig& config() const override { return group_->rank(0).config(); }
  KvCacheShape kv_shape() const override;     // the fewest blocks any rank of any node holds
  CudaLoadStats load_stats() const override;  // this node's GPUs, bytes summed
  DecodeAheadStats decode_ahead_stats() const override;
  double device_busy_seconds() const override { return group_->rank(0).device_busy_seconds(); }  // local rank 0's
  std::span<const float> last_logits(int index) const override { return group_->rank(0).last_logits(index); }
  void step(std::span<const SeqStep> seqs, std::span<SampleResult> out) override { group_->step(seqs, out); }
  void run_remote_steps() { group_->run_remote_steps(); }
  CudaRunner& rank(int local);
  int local_ranks() const { return group_->local_ranks(); }

 private:
  std::unique_ptr<ModelRunner> set_up(int local, const std::string& nccl_id);

  CudaEngineOptions opt_;
  std::unique_ptr<cuda::PeerAllReduce> peer_;  // one host, peer access between every pair of GPUs
  std::vector<std::unique_ptr<cuda::NcclComm>> nccl_;
  std::vector<cuda::TpComm> comms_;
  std::vector<uint16_t*> wires_;  // each local rank's bf16 wire (TpComm::wire), on its device
  size_t wire_elems_ = 0;         // the widest step's rows (bf16_wire.h)
  std::unique_ptr<RankGroup> group_;  // last: its threads use the members above
};

}  // namespace mx
