// The ranks of a tensor-parallel group as one process runs them (docs/tensor_parallel.md): one thread a
// local rank, each driving its own ModelRunner over its shard through the same steps, and across hosts
// the links to the other nodes: node 0 sends each step to them (model/step_wire.h) before its own ranks
// run it, and the others run what node 0 sends. Free of CUDA: each rank's runner comes from a callback
// run on the rank's own thread (the CUDA engine sets the device and joins NCCL there), so CPU tests drive
// the group with stand-in runners.
//
// Failures: a step that every local rank refuses alike (its input, before any collective) is an ordinary
// error. Otherwise a rank that fails inside a step, a step longer than step_timeout_s, or another node's
// process ending leaves the other ranks waiting in their collectives for good, which nothing can stop
// from the host: the process logs one line saying which and exits with status 1.
#pragma once
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/rendezvous.h"
#include "model/model_runner.h"
#include "model/step_wire.h"
#include "model/tensor_parallel.h"

namespace mx {

struct RankGroupOptions {
  TensorParallel tp;           // size, nodes, this node's rank, node 0's address and port
  std::string agreed;          // what every node must agree on (its flags): compared at the meeting
  double step_timeout_s = 600;
  double meet_timeout_s = 600;  // every node starts within this
};

class RankGroup {
 public:
  // On local rank `local`'s thread: its runner. `secret` is node 0's (handed to the other nodes when
  // they meet; the CUDA engine's NCCL unique id).
  using MakeRank = std::function<std::unique_ptr<ModelRunner>(int local, const std::string& secret)>;
  // On the rank's thread after its runner is gone.
  using EndRank = std::function<void(int local)>;
  // Fails with the first rank's error when a rank cannot be made; `abandon` (if any) is called at once
  // when one fails, so that ranks waiting for it in their set-up give up.
  RankGroup(const RankGroupOptions& o, std::string secret, MakeRank make, EndRank end = {},
            std::function<void()> abandon = {});
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int local_ranks() const { return local_; }
  int first_rank() const { return first_; }
  ModelRunner& rank(int local) { return *runners_[size_t(local)]; }
  const ModelRunner& rank(int local) const { return *runners_[size_t(local)]; }
  int kv_blocks() const;  // the fewest any rank of any node holds
  // Node 0: the step on every rank of every node; out is local rank 0's.
  void step(std::span<const SeqStep> seqs, std::span<SampleResult> out);
  // Any other node: runs the steps node 0 sends until node 0 ends the group.
  void run_remote_steps();

 private:
  void meet();
  void rank_main(int local);
  void run_local(std::span<const SeqStep> seqs, std::span<SampleResult> out);
  void watch_nodes();
  void shutdown();
  [[noreturn]] void fatal(const std::string& why) const;

  RankGroupOptions o_;
  int local_, first_;
  std::string secret_;
  MakeRank make_;
  EndRank end_;
  std::function<void()> abandon_;
  std::vector<std::unique_ptr<ModelRunner>> runners_;
  std::vector<std::thread> threads_;
  std::vector<std::unique_ptr<NodeLink>> links_;  // node 0: one a node (index: node rank)
  std::unique_ptr<NodeLink> to_node0_;             // the other nodes
  std::thread watcher_;                            // node 0: the other nodes' links between steps
  int remote_blocks_ = 1 << 30;
  std::string wire_;
  // The step being run: published under mu_, a new generation wakes the ranks.
  mutable std::mutex mu_;
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
