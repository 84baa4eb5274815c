#include "kernels/engine/probe.h"

#include <algorithm>
#include <map>

#include "kernels/common/cuda_check.h"

namespace mx {
namespace {
constexpr size_t kMaxMarks = 1024;  // kernels of one profiled step (a 36-layer prefill marks ~400)
constexpr int kMaxRoutedLayers = 128, kMaxRoutedExperts = 512;
}  // namespace

Probe::Probe() = default;

Probe::~Probe() {
  for (auto e : events_) cudaEventDestroy(e);
  if (trace) cudaFree(trace);
  if (routed_) cudaFree(routed_);
}

void Probe::begin_step(cudaStream_t s) {
  if (!profiling) return;
  if (events_.empty()) {
    events_.resize(kMaxMarks);
    for (auto& e : events_) MX_CUDA(cudaEventCreate(&e));
  }
  marks_.clear();
  routed_layers_ = 0;
  MX_CUDA(cudaEventRecord(events_[0], s));
}

void Probe::mark(const char* name, double bytes, cudaStream_t s) { push_mark({name, bytes, -1}, s); }

void Probe::push_mark(const Mark& m, cudaStream_t s) {
  if (!profiling || marks_.size() + 1 >= events_.size()) return;
  marks_.push_back(m);
  MX_CUDA(cudaEventRecord(events_[marks_.size()], s));
}

void Probe::record_routing(const int32_t* counts, int num_experts, int layer, cudaStream_t s) {
  if (!profiling || layer >= kMaxRoutedLayers || num_experts > kMaxRoutedExperts) return;
  if (!routed_) MX_CUDA(cudaMalloc(&routed_, sizeof(int32_t) * kMaxRoutedLayers * kMaxRoutedExperts));
  MX_CUDA(cudaMemcpyAsync(routed_ + size_t(layer) * kMaxRoutedExperts, counts, sizeof(int32_t) * num_experts,
                          cudaMemcpyDeviceToDevice, s));
  routed_layers_ = std::max(routed_layers_, layer + 1);
  routed_e_ = num_experts;
}

void Probe::mark_experts(const char* name, double bytes_per_expert, int layer, cudaStream_t s) {
  push_mark({name, bytes_per_expert, layer}, s);
}

std::vector<KernelProfile> Probe::collect() {
  routed_experts.assign(size_t(routed_layers_), 0);
  if (routed_layers_ > 0) {
    std::vector<int32_t> c(size_t(routed_layers_) * kMaxRoutedExperts);
    MX_CUDA(cudaMemcpy(c.data(), routed_, c.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    for (int l = 0; l < routed_layers_; ++l)
      for (int e = 0; e < routed_e_; ++e) routed_experts[size_t(l)] += c[size_t(l) * kMaxRoutedExperts + e] > 0;
  }
  std::map<std::string, KernelProfile> agg;
  for (size_t i = 0; i < marks_.size(); ++i) {
    float ms = 0;
    MX_CUDA(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    const Mark& m = marks_[i];
    KernelProfile& k = agg[m.name];
    k.name = m.name;
    k.ms += ms;
    const bool routed = m.layer >= 0 && m.layer < int(routed_experts.size());
    k.bytes += routed ? m.bytes * routed_experts[size_t(m.layer)] : m.bytes;
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
