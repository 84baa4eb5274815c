// Diagnostics of `mxserve bench` (bench_hooks.h sets them): per-kernel events (--breakdown), kernel
// kinds left out of graph replays (marginal costs) and per-CTA / per-item timelines (--step-trace).
// In serving every hook is one branch on an inactive member.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/cta_trace.h"

namespace mx {

// Time and bytes of one kernel kind over the last profiled step (all layers summed).
struct KernelProfile {
  std::string name;
  double ms = 0, bytes = 0;
  int calls = 0;
};

// Kernel kinds that bench can leave out (set_skip): the one-token decode forward's (bits 0-6) and the
// prefill forward's, which wide decode steps run (bits 8-18).
enum DecodeKernelBit : uint32_t {
  kDecodeQkv = 1, kDecodeAttention = 2, kDecodeOProj = 4, kDecodeRouter = 8, kDecodeFc1 = 16, kDecodeFc2 = 32,
  kDecodeHead = 64,  // final norm, lm_head and the pick
};
inline constexpr const char* kDecodeKernelNames[] = {"qkv_rope_kv", "attention", "o_proj_residual", "router",
                                                     "moe_fc1_swiglu", "moe_fc2", "final_norm+lm_head+pick"};
inline constexpr int kWideKernelBit0 = 8;
enum WideKernelBit : uint32_t {  // bit kWideKernelBit0 + i is kWideKernelNames[i]
  kWideNorms = 1u << kWideKernelBit0, kWideQkv = kWideNorms << 1, kWideRopeKv = kWideNorms << 2,
  kWideAttention = kWideNorms << 3, kWideOProj = kWideNorms << 4, kWideRouter = kWideNorms << 5,
  kWideRoute = kWideNorms << 6, kWideFc1 = kWideNorms << 7, kWideFc2 = kWideNorms << 8, kWideCombine = kWideNorms << 9,
  kWideHead = kWideNorms << 10,  // final norm, lm_head and the pick
};
inline constexpr const char* kWideKernelNames[] = {
    "attn_norm+mlp_norm", "qkv_gemm", "rope_kv", "attention", "o_gemm_residual", "router_topk", "moe_route",
    "moe_fc1 (with its fp8 quant)", "moe_fc2", "moe_combine", "final_norm+lm_head+pick"};
static_assert(kWideHead == 1u << (kWideKernelBit0 + std::size(kWideKernelNames) - 1), "one name a bit");

class Probe {
 public:
  Probe();
  ~Probe();
  Probe(const Probe&) = delete;
  Probe& operator=(const Probe&) = delete;

  // Any diagnostic on: steps run without decode ahead.
  bool active() const { return profiling || skip || trace; }
  bool skips(uint32_t bit) const { return (skip & bit) != 0; }

  // Profiled steps run eagerly with an event after every kernel.
  void begin_step(cudaStream_t s);
  void mark(const char* name, double bytes, cudaStream_t s);
  // The grouped MoE's per-expert row counts of one layer, copied aside (profiled steps), and a mark
  // whose bytes are bytes_per_expert times the experts that layer routed to.
  void record_routing(const int32_t* counts, int num_experts, int layer, cudaStream_t s);
  void mark_experts(const char* name, double bytes_per_expert, int layer, cudaStream_t s);
  // After the step's event has fired: the profile, and routed_experts from the recorded counts.
  std::vector<KernelProfile> collect();

  // Traces: the persistent step's items (kind 0) or the per-op kernels' CTA records (kind 2), in one
  // device buffer of `trace_words` words plus the per-op cursor after it.
  void set_trace(bool on, size_t words);
  cuda::CtaTrace op_trace(int layer) const;
  void reset_op_cursor(cudaStream_t s) const;
  std::vector<uint64_t> read_trace() const;

  bool profiling = false;
  uint32_t skip = 0;  // DecodeKernelBit | WideKernelBit mask
  unsigned long long* trace = nullptr;
  size_t trace_words = 0, trace_items = 0;
  int trace_kind = 0;
  std::vector<KernelProfile> profile;  // of the last profiled step
  std::vector<int> routed_experts;     // distinct experts per layer of the last profiled step (prefill path)

 private:
  struct Mark { const char* name; double bytes; int layer; };  // layer >= 0: bytes are per routed expert
  void push_mark(const Mark& m, cudaStream_t s);
  std::vector<cudaEvent_t> events_;
  std::vector<Mark> marks_;
  int32_t* routed_ = nullptr;  // [kMaxRoutedLayers][kMaxRoutedExperts] counts
  int routed_layers_ = 0, routed_e_ = 0;
};

}  // namespace mx
