// Built with the CUDA engine only (MXSERVE_HAVE_CUDA): the bench reaches the runner's internals here.
#ifdef MXSERVE_HAVE_CUDA
#include "cli/bench_hooks.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/decode_step.h"
#include "kernels/engine/runner.h"
#include "kernels/engine/tp_runner.h"

namespace mx {
namespace {
// Per-op step trace capacity: a one-token layer launches ~1,540 CTAs; later records are dropped.
constexpr size_t kOpTraceCtasPerLayer = 4096;

// A tensor-parallel group's hooks read rank 0; what changes the steps' launches (the trace) reaches every
// local rank alike, so that all make the same decode-ahead decisions and run the same collectives. Local
// rank r runs on device r; the hooks' allocations and copies run on this thread.
std::vector<CudaRunner*> local_ranks(CudaRunnerBase& r) {
  auto* tp = dynamic_cast<TpRunner*>(&r);
  if (!tp) return {static_cast<CudaRunner*>(&r)};
  std::vector<CudaRunner*> v;
  for (int i = 0; i < tp->local_ranks(); ++i) v.push_back(&tp->rank(i));
  MX_CUDA(cudaSetDevice(0));
  return v;
}
}  // namespace

CudaBenchHooks::CudaBenchHooks(CudaRunnerBase& runner) : ranks_(local_ranks(runner)), r_(*ranks_[0]) {}

void CudaBenchHooks::changed() {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_.size() > 1) MX_CUDA(cudaSetDevice(int(i)));
    ranks_[i]->ahead_.active = false;
    ranks_[i]->graphs_.clear();  // captured with the old settings
    ranks_[i]->wide_graphs_.clear();
  }
  if (ranks_.size() > 1) MX_CUDA(cudaSetDevice(0));
}

// Every rank profiles (eager, an event after every kernel), so all make the same launch decisions and
// meet at the same collectives; the table reads rank 0's.
void CudaBenchHooks::set_profiling(bool on) {
  for (CudaRunner* r : ranks_) {
    r->probe_.profiling = on;
    r->ahead_.active = false;
  }
}

std::vector<KernelProfile> CudaBenchHooks::last_profile() const { return r_.probe_.profile; }

std::vector<int> CudaBenchHooks::last_routed_experts() const { return r_.probe_.routed_experts; }

void CudaBenchHooks::set_skip(uint32_t mask) {
  if (mask == r_.probe_.skip) return;
  r_.probe_.skip = mask;
  changed();
}

void CudaBenchHooks::set_step_trace(bool on) {
  if (on == (r_.probe_.trace != nullptr)) return;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_.size() > 1) MX_CUDA(cudaSetDevice(int(i)));
    CudaRunner& r = *ranks_[i];
    const DeviceShape& s = r.model_.shape;
    const size_t items = cuda::decode_step_items(cuda::kDecodeMaxTokens, s.layers, s.H, s.I, s.E, s.Hq, s.Hkv, s.D);
    r.probe_.set_trace(on, std::max(items * 4, size_t(s.layers) * kOpTraceCtasPerLayer * 4));
  }
  if (ranks_.size() > 1) MX_CUDA(cudaSetDevice(0));
  changed();
}

std::vector<uint64_t> CudaBenchHooks::last_step_trace() const { return r_.probe_.read_trace(); }

int CudaBenchHooks::last_step_trace_kind() const { return r_.probe_.trace_kind; }

double CudaBenchHooks::replay_decode_graph_ms(int M, int n) {
  const StepPlan& pl = r_.plans_[r_.parity_];
  if (M < 1 || M > cuda::kDecodeMaxTokens || pl.M != M || !pl.graph || !r_.graphs_.at(r_.graph_key(pl)))
    fail("no decode graph for the last step of {} tokens", M);
  r_.ahead_.active = false;  // the replays reuse its result slots
  cudaGraphExec_t g = r_.graphs_.at(r_.graph_key(pl));
  cudaEvent_t a, b;
  MX_CUDA(cudaEventCreate(&a));
  MX_CUDA(cudaEventCreate(&b));
  MX_CUDA(cudaEventRecord(a, r_.stream_));
  for (int i = 0; i < n; ++i) MX_CUDA(cudaGraphLaunch(g, r_.stream_));
  MX_CUDA(cudaEventRecord(b, r_.stream_));
  MX_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  MX_CUDA(cudaEventElapsedTime(&ms, a, b));
  MX_CUDA(cudaEventDestroy(a));
  MX_CUDA(cudaEventDestroy(b));
  return double(ms) / n;
}

}  // namespace mx
#endif  // MXSERVE_HAVE_CUDA
