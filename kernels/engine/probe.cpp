#include "kernels/engine/probe.h"

#include <algorithm>
#include <map>

#include "kernels/common/cuda_check.h"

namespace mx {
namespace {
constexpr size_t kMaxMarks = 1024;  // kernels of one profiled step (a 36-layer prefill marks ~400)
}  // namespace

Probe::Probe() = default;

Probe::~Probe() {
  for (auto e : events_) cudaEventDestroy(e);
  if (trace) cudaFree(trace);
}

void Probe::begin_step(cudaStream_t s) {
  if (!profiling) return;
  if (events_.empty()) {
    events_.resize(kMaxMarks);
    for (auto& e : events_) MX_CUDA(cudaEventCreate(&e));
  }
  marks_.clear();
  MX_CUDA(cudaEventRecord(events_[0], s));
}

void Probe::mark(const char* name, double bytes, cudaStream_t s) {
  if (!profiling || marks_.size() + 1 >= events_.size()) return;
  marks_.push_back({name, bytes});
  MX_CUDA(cudaEventRecord(events_[marks_.size()], s));
}

std::vector<KernelProfile> Probe::collect() const {
  std::map<std::string, KernelProfile> agg;
  for (size_t i = 0; i < marks_.size(); ++i) {
    float ms = 0;
    MX_CUDA(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    KernelProfile& k = agg[marks_[i].first];
    k.name = marks_[i].first;
    k.ms += ms;
    k.bytes += marks_[i].second;
    ++k.calls;
  }
  std::vector<KernelProfile> v;
  for (auto& [name, k] : agg) v.push_back(k);
  return v;
}

void Probe::set_trace(bool on, size_t words) {
  if (trace) MX_CUDA(cudaFree(trace));
  trace = nullptr;
  trace_words = trace_items = 0;
  if (!on) return;
  trace_words = words;
  MX_CUDA(cudaMalloc(&trace, trace_words * 8 + 8));  // + the per-op cursor
}

cuda::CtaTrace Probe::op_trace(int layer) const {
  cuda::CtaTrace t;
  if (!trace) return t;
  t.buf = trace;
  t.cursor = reinterpret_cast<unsigned*>(trace + trace_words);
  t.cap = unsigned(trace_words / 4);
  t.layer = layer;
  return t;
}

void Probe::reset_op_cursor(cudaStream_t s) const {
  if (trace) MX_CUDA(cudaMemsetAsync(trace + trace_words, 0, 8, s));
}

std::vector<uint64_t> Probe::read_trace() const {
  if (!trace) return {};
  size_t items = trace_items;
  if (trace_kind == 2) {  // per-op records: as many as the cursor says
    unsigned n = 0;
    MX_CUDA(cudaMemcpy(&n, trace + trace_words, sizeof n, cudaMemcpyDeviceToHost));
    items = std::min<size_t>(n, trace_words / 4);
  }
  std::vector<uint64_t> v(items * 4);
  if (!v.empty()) MX_CUDA(cudaMemcpy(v.data(), trace, v.size() * 8, cudaMemcpyDeviceToHost));
  return v;
}

}  // namespace mx
