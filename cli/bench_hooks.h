// Diagnostics for `mxserve bench` only (cmd_bench.cpp), kept off the runner's interface (runner.h names
// this class a friend): per-kernel profiles, kernel kinds left out of graph replays, step timelines,
// graph replays without the host. Turning any of them on or off drops decode ahead and the graphs.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/engine/cuda_runner.h"
#include "kernels/engine/probe.h"

namespace mx {

class CudaRunner;

class CudaBenchHooks {
 public:
  explicit CudaBenchHooks(CudaRunnerBase& runner);  // a runner from make_cuda_runner
  // Profiled steps run eagerly with an event after every kernel (slower).
  void set_profiling(bool on);
  std::vector<KernelProfile> last_profile() const;
  // Distinct experts each layer routed to in the last profiled step (empty: the step took the decode
  // path, whose routing stays on the GPU).
  std::vector<int> last_routed_experts() const;
  // Steps leave out the kernel kinds whose DecodeKernelBit / WideKernelBit is set (their outputs go
  // stale, results are garbage), so graph replays time each kind's marginal cost.
  void set_skip(uint32_t mask);
  // The following steps record their timeline: the persistent step's items (kind 0) or the per-op
  // kernels' CTA records (kind 2; cta_trace.h), 4 words each; under tensor parallelism every local rank
  // records and rank 0's timeline is read.
  void set_step_trace(bool on);
  std::vector<uint64_t> last_step_trace() const;
  int last_step_trace_kind() const;
  // Replays the M-token decode graph n times back to back (the last step's metadata, no host work
  // between replays) and returns ms a replay: the step's GPU time without the host's turn.
  double replay_decode_graph_ms(int M, int n);

 private:
  void changed();  // every local rank
  std::vector<CudaRunner*> ranks_;  // this node's ranks (one without tensor parallelism)
  CudaRunner& r_;                   // rank 0: what the hooks read
};

}  // namespace mx
