// Tensor parallelism (docs/tensor_parallel.md): one CudaRunner a GPU over its shard, each driven by its
// own thread, all running the same steps; the forward's reduce points and the logits' gather
// (forward.h) go through NCCL and, on one host, the one-shot peer all-reduce. Rank 0's results are the
// step's. Across hosts (--nnodes), one process a host: node 0 (the server) sends every step to the other
// nodes over the rendezvous connection (core/rendezvous.h, model/step_wire.h), whose ranks run it too.
// A rank that fails inside a step, a step longer than CudaEngineOptions::tp_step_timeout_s, or a node
// whose process ends leaves the other ranks waiting in their collectives for good: the process then exits
// with one line saying which.
#pragma once
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/rendezvous.h"
#include "kernels/comm/nccl_comm.h"
#include "kernels/comm/peer_allreduce.h"
#include "kernels/comm/tp_comm.h"
#include "kernels/engine/cuda_runner.h"
#include "model/step_wire.h"

namespace mx {

class CudaRunner;

class TpRunner final : public CudaRunnerBase {
 public:
  // This node's ranks (opt.tp.ranks_per_node() of them) on its GPUs 0, 1, ...; with several nodes, meets
  // the others first (node 0 listens on --master-port, the others connect to --master-addr).
  explicit TpRunner(const CudaEngineOptions& opt);
  ~TpRunner() override;
  TpRunner(const TpRunner&) = delete;
  TpRunner& operator=(const TpRunner&) = delete;

  const ModelConfig& config() const override;
  KvCacheShape kv_shape() const override;     // the fewest blocks any rank of any node holds
  CudaLoadStats load_stats() const override;  // this node's GPUs, bytes summed
  DecodeAheadStats decode_ahead_stats() const override;
  std::span<const float> last_logits(int index) const override;
  void step(std::span<const SeqStep> seqs, std::span<SampleResult> out) override;  // node 0
  // A node other than 0: runs the steps node 0 sends until node 0 says it is done.
  void run_remote_steps();
  CudaRunner& rank(int local) { return *runners_[size_t(local)]; }

 private:
  void meet_nodes(const ModelConfig& cfg);
  void rank_main(int local);
  void set_up(int local);
  void run_local(std::span<const SeqStep> seqs, std::span<SampleResult> out);
  void shutdown();  // stops and joins the ranks' threads
  void watch_nodes();
  [[noreturn]] void fatal(const std::string& why) const;

  CudaEngineOptions opt_;
  int size_, local_, first_;  // ranks in all, on this node, and this node's first
  cuda::NcclId id_{};
  std::unique_ptr<cuda::PeerAllReduce> peer_;  // one host, peer access between every pair of GPUs
  std::vector<std::unique_ptr<cuda::NcclComm>> nccl_;
  std::vector<cuda::TpComm> comms_;
  std::vector<std::unique_ptr<CudaRunner>> runners_;
  std::vector<std::thread> threads_;
  // Other nodes: node 0 holds a link to each (index = node rank), the others one to node 0.
  std::vector<std::unique_ptr<NodeLink>> links_;
  std::unique_ptr<NodeLink> to_node0_;
  std::thread watcher_;  // node 0: ends the process when another node's ends, also between steps
  int remote_blocks_ = 1 << 30;  // the fewest KV blocks the other nodes hold (node 0)
  std::string wire_;
  // The step being run: published under mu_, a new generation wakes the ranks.
  std::mutex mu_;
  std::condition_variable go_, done_;
  std::span<const SeqStep> seqs_;
  std::span<SampleResult> out_;
  std::vector<std::vector<SampleResult>> rank_out_;  // local ranks other than 0 write here
  std::vector<std::string> errors_;
  unsigned long long gen_ = 0;
  int finished_ = 0, ready_ = 0;
  bool stop_ = false, unwatch_ = false;
};

}  // namespace mx
