// The persistent decode step (see decode_step.h): one cooperative grid, work items behind ready
// counters, the per-op kernel bodies.
#include "kernels/decode/decode_step.h"

#include <algorithm>
#include <string>

#include "kernels/attention_decode/attention_decode_body.cuh"
#include "kernels/common/cta_trace.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/gemv_body.cuh"
#include "kernels/decode/moe_body.cuh"

namespace mx::cuda {
namespace {
using namespace body;

// Ready counters of one layer (words): per KV head the qkv tiles done, then the phase totals, then
// FC1 tiles done per distinct-expert slot. A stride of 64 words keeps layers on separate lines.
constexpr int kMaxKvHeads = 16;
constexpr int kAttnDone = 16, kOprojDone = 17, kRouterDone = 18, kFc2Done = 19, kFc1Done = 32, kLayerWords = 64;
static_assert(kFc1Done + kMaxSlots <= kLayerWords, "counter layout");

__shared__ unsigned long long s_waited;  // trace: when the current item's wait was satisfied

__device__ __forceinline__ unsigned ld_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Waits until *c >= target (c null: no wait): thread 0 polls (relaxed loads, then one acquire
// fence: an acquire load per poll would invalidate the SM's L1 each time), the barrier passes the
// ordering on to the CTA's other threads.
struct FlagWait {
  const unsigned* c;
  unsigned target;
  __device__ __forceinline__ void operator()() const {
    if (!c) return;
    if (threadIdx.x == 0) {
      while (ld_relaxed(c) < target) {
      }
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
      s_waited = global_ns();
    }
    __syncthreads();
  }
};

// Publishes this item's writes: the barrier orders every thread's stores before thread 0's release
// add (cumulative). Call from every thread; `add` CTA-uniform.
__device__ __forceinline__ void signal(unsigned* c, bool add = true) {
  __syncthreads();
  if (add && threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
}

// Items of one phase: the global sequence position of the phase's first item is `base`; this CTA
// takes items i with (base + i) % gridDim.x == blockIdx.x.
__device__ __forceinline__ int first_item(int base) {
  const int nb = gridDim.x;
  return ((int(blockIdx.x) - base) % nb + nb) % nb;
}

// Two CTAs per SM: the item functions then fit their registers (up to 255) without spilling; at three
// the call ABI made the attention item spill (docs/perf.md).
constexpr int kStepCtasPerSm = 2;

// Shared scratch of the item functions (a CTA runs one item at a time).
__shared__ float s_red[kWarps * 32 * 4];
__shared__ Routing s_route;

// Work-item counts of one layer's phases for M tokens, in sequence order.
struct Phases {
  int qkv, attn, oproj, router_x, router, slots, fc1_x, fc1, fc2_x, fc2;
  __host__ __device__ Phases(int M, int H, int I, int E, int Hq, int Hkv, int D) {
    qkv = qkv_ctas(Hq, Hkv, D);
    attn = M * Hkv * kAttnS;
    oproj = oproj_ctas(H);
    router_x = router_ctas(E);
    router = router_x * kRouterSplits;
    slots = moe_slots(M, E);
    fc1_x = fc1_ctas(I);
    fc1 = fc1_x * slots;
    fc2_x = fc2_ctas(H);
    fc2 = fc2_x * slots;
  }
  __host__ __device__ int total() const { return qkv + attn + oproj + router + fc1 + fc2; }
};

// Runs one item; with a trace buffer, thread 0 records its timeline.
template <class F>
__device__ __forceinline__ void traced(const DecodeStepParams& p, int l, int phase, int g, F f) {
  unsigned long long t0 = 0;
  if (p.trace && threadIdx.x == 0) {
    t0 = global_ns();
    s_waited = 0;
  }
  f();
  if (p.trace && threadIdx.x == 0) write_trace_record(p.trace + size_t(g) * 4, t0, s_waited, phase, l);
}

__device__ __forceinline__ unsigned* layer_counters(const DecodeStepParams& p, int l) {
  return p.counters + size_t(l) * kLayerWords;
}
__device__ __forceinline__ float* layer_in(const DecodeStepParams& p, int l) { return l % 2 ? p.xb : p.xa; }
__device__ __forceinline__ float* layer_out(const DecodeStepParams& p, int l) { return l % 2 ? p.xa : p.xb; }

// One function per item kind, not inlined: each gets its own register allocation (as the per-op
// grids do) instead of the union of all bodies' live ranges.
template <int D, bool kFp8, DenseFormat WF>
__device__ __noinline__ void qkv_item(const DecodeStepParams& p, int l, int i, unsigned n_fc2) {
  const DecodeStepLayer& L = p.layers[l];
  unsigned* cnt = layer_counters(p, l);
  QkvRopeKvParams q;
  q.res = {layer_in(p, l), l ? p.y_slot : nullptr, layer_out(p, l)};
  q.norm_w = L.attn_norm; q.eps = p.eps; q.w = DenseWeight{WF, L.qkv_w, WF == DenseFormat::kBf16 ? nullptr : L.qkv_sc}; q.bias = L.qkv_b;
  q.pos = p.pos; q.slot = L.window ? p.slot_sw : p.slot; q.inv_freq = p.inv_freq; q.concentration = p.concentration;
  q.q_out = p.q; q.kv = L.kv;
  q.M = p.M; q.H = p.H; q.Hq = p.Hq; q.Hkv = p.Hkv; q.D = D;
  qkv_rope_kv<kQkvSplit, false, false, kFp8, WF>(q, i, s_red, FlagWait{l ? cnt - kLayerWords + kFc2Done : nullptr, n_fc2});
  signal(cnt + qkv_cta_kv_head(i, p.Hq, p.Hkv, D));
}

template <int D, bool kFp8>
__device__ __noinline__ void attn_item(const DecodeStepParams& p, int l, int i, unsigned qkv_per_head) {
  const DecodeStepLayer& L = p.layers[l];
  unsigned* cnt = layer_counters(p, l);
  AttnDecodeParams a;
  a.q = p.q; a.q_stride = p.Hq * D; a.kv = L.kv;
  a.pos = p.pos; a.bt_off = L.window ? p.bt_off_sw : p.bt_off; a.block_tables = p.block_tables;
  a.sinks = L.sinks; a.out = p.attn;
  a.partials = p.attn_partials; a.tickets = p.attn_tickets;
  a.M = p.M; a.Hq = p.Hq; a.Hkv = p.Hkv; a.D = D; a.window = L.window;
  a.kv_stable = p.kv_stable;
  const int kvh = i % p.Hkv, qi = i / p.Hkv % p.M, split = i / (p.Hkv * p.M);
  const bool done = attn_decode<D, kAttnG, kFp8>(a, kvh, 0, qi, split, FlagWait{cnt + kvh, qkv_per_head});
  signal(cnt + kAttnDone, done);
}

template <int D, DenseFormat WF>
__device__ __noinline__ void oproj_item(const DecodeStepParams& p, int l, int i) {
  const DecodeStepLayer& L = p.layers[l];
  unsigned* cnt = layer_counters(p, l);
  const DenseWeight w{WF, L.o_w, WF == DenseFormat::kBf16 ? nullptr : L.o_sc};
  const GemvParams o{p.attn, w, L.o_b, layer_out(p, l), p.M, p.H, p.Hq * D, true};
  gemv<kOprojSplit, WF == DenseFormat::kBf16 ? kOprojU : kOprojQuantU, WF>(o, i, s_red, FlagWait{cnt + kAttnDone, unsigned(p.M * p.Hkv)});
  signal(cnt + kOprojDone);
}

__device__ __noinline__ void router_item(const DecodeStepParams& p, int l, int i, int router_x, unsigned n_oproj) {
  const DecodeStepLayer& L = p.layers[l];
  unsigned* cnt = layer_counters(p, l);
  RouterParams r;
  r.res = {layer_out(p, l), nullptr, nullptr};
  r.norm_w = L.mlp_norm; r.eps = p.eps; r.w = L.router_w; r.bias = L.router_b;
  r.logits = p.router_logits; r.xn = p.xn; r.M = p.M; r.E = p.E; r.H = p.H;
  router<kRouterSplit>(r, i % router_x, i / router_x, s_red, FlagWait{cnt + kOprojDone, n_oproj});
  signal(cnt + kRouterDone);
}

__device__ __forceinline__ MoeDecodeParams moe_params(const DecodeStepParams& p, const DecodeStepLayer& L) {
  MoeDecodeParams e;
  e.router_logits = p.router_logits; e.router_splits = kRouterSplits;
  e.fc1_blocks = L.up_blocks; e.fc1_scales = L.up_scales; e.fc1_bias = L.up_bias;
  e.fc2_blocks = L.down_blocks; e.fc2_scales = L.down_scales; e.fc2_bias = L.down_bias;
  e.xn = p.xn; e.act = p.act; e.y_slot = p.y_slot;
  e.M = p.M; e.E = p.E; e.H = p.H; e.I = p.I; e.alpha = p.alpha; e.limit = p.limit;
  return e;
}

// The routing, once per CTA and layer, as soon as the router is done.
__device__ __noinline__ void route_item(const DecodeStepParams& p, int l, unsigned n_router) {
  FlagWait{layer_counters(p, l) + kRouterDone, n_router}();
  route_tokens(p.router_logits, kRouterSplits, p.M, p.E, s_route);
}

__device__ __noinline__ void fc1_item(const DecodeStepParams& p, int l, int i, int fc1_x) {
  const int slot = i / fc1_x;
  if (slot < s_route.count) fc1_swiglu(moe_params(p, p.layers[l]), s_route, i % fc1_x, slot, s_red);
  signal(layer_counters(p, l) + kFc1Done + slot);
}

__device__ __noinline__ void fc2_item(const DecodeStepParams& p, int l, int i, int fc1_x, int fc2_x) {
  unsigned* cnt = layer_counters(p, l);
  const int slot = i / fc2_x;
  if (slot < s_route.count)
    fc2(moe_params(p, p.layers[l]), s_route, i % fc2_x, slot, s_red,
              FlagWait{cnt + kFc1Done + slot, unsigned(fc1_x)});
  signal(cnt + kFc2Done);
}

// kFp8: the KV cache is E4M3 (its own kernel: a runtime choice between the two attention items costs
// the bf16 kernel spills). WF: the format of qkv and o-proj.
template <int D, bool kFp8, DenseFormat WF>
__global__ void __launch_bounds__(128, kStepCtasPerSm) decode_step_k(const __grid_constant__ DecodeStepParams p) {
  const int nb = gridDim.x;
  const Phases n(p.M, p.H, p.I, p.E, p.Hq, p.Hkv, D);
  int base = 0;
  for (int l = 0; l < p.num_layers; ++l) {
    for (int i = first_item(base); i < n.qkv; i += nb)
      traced(p, l, 0, base + i, [&] { qkv_item<D, kFp8, WF>(p, l, i, n.fc2); });
    base += n.qkv;
    for (int i = first_item(base); i < n.attn; i += nb)
      traced(p, l, 1, base + i, [&] { attn_item<D, kFp8>(p, l, i, n.qkv / p.Hkv); });
    base += n.attn;
    for (int i = first_item(base); i < n.oproj; i += nb) traced(p, l, 2, base + i, [&] { oproj_item<D, WF>(p, l, i); });
    base += n.oproj;
    for (int i = first_item(base); i < n.router; i += nb)
      traced(p, l, 3, base + i, [&] { router_item(p, l, i, n.router_x, n.oproj); });
    base += n.router;
    bool routed = false;
    for (int i = first_item(base); i < n.fc1; i += nb)
      traced(p, l, 4, base + i, [&] {
        if (!routed) route_item(p, l, n.router);
        routed = true;
        fc1_item(p, l, i, n.fc1_x);
      });
    base += n.fc1;
    for (int i = first_item(base); i < n.fc2; i += nb)
      traced(p, l, 5, base + i, [&] {
        if (!routed) route_item(p, l, n.router);
        routed = true;
        fc2_item(p, l, i, n.fc1_x, n.fc2_x);
      });
    base += n.fc2;
  }
}

size_t smem_bytes(const DecodeStepParams& p) {
  const int K = std::max(std::max(p.H, p.I), p.Hq * p.D);
  return size_t(p.M) * mma::staged_ld(K) * 2;
}

template <int D, bool kFp8, DenseFormat WF>
void launch(const DecodeStepParams& p, cudaStream_t s) {
  static std::atomic<unsigned long long> ready{0};
  once_per_device(ready, [] { allow_dynamic_smem(decode_step_k<D, kFp8, WF>); });
  // Resident CTAs per SM for this shape (not cached: runners of different shapes may share a process;
  // in graph mode this runs once, at capture).
  const size_t smem = smem_bytes(p);
  const int sms = device_sm_count();
  int per_sm = 0;
  MX_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_step_k<D, kFp8, WF>, 128, smem));
  if (per_sm < 1) throw_error("decode_step: the kernel does not fit on an SM");
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(per_sm * sms);
  cfg.blockDim = dim3(128);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;  // all CTAs resident, or the launch fails
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  MX_CUDA(cudaLaunchKernelEx(&cfg, decode_step_k<D, kFp8, WF>, p));
}

template <DenseFormat WF>
void launch_format(const DecodeStepParams& p, cudaStream_t s) {
  if (p.kv_fp8) p.D == 64 ? launch<64, true, WF>(p, s) : launch<16, true, WF>(p, s);
  else p.D == 64 ? launch<64, false, WF>(p, s) : launch<16, false, WF>(p, s);
}

}  // namespace

size_t decode_step_counter_words(int num_layers) { return size_t(num_layers) * kLayerWords; }

size_t decode_step_items(int M, int num_layers, int H, int I, int E, int Hq, int Hkv, int D) {
  return size_t(num_layers) * Phases(M, H, I, E, Hq, Hkv, D).total();
}

void decode_step(const DecodeStepParams& p, cudaStream_t s) {
  if (p.M < 1 || p.M > kDecodeMaxTokens) throw_error("decode_step: M must be 1..8, got " + std::to_string(p.M));
  if (p.Hkv > kMaxKvHeads || p.Hq != kAttnDecodeGroup * p.Hkv)
    throw_error("decode_step: needs at most 16 KV heads of 8 query heads each");
  if (p.E < kTopK || p.E > 128 || p.H % 32 || p.I % 32) throw_error("decode_step: unsupported expert shapes");
  MX_CUDA(cudaMemsetAsync(p.counters, 0, decode_step_counter_words(p.num_layers) * 4, s));
  if (p.D != 64 && p.D != 16) throw_error("decode_step: head_dim " + std::to_string(p.D) + " is not instantiated (16, 64)");
  if (p.dense == DenseFormat::kMxfp4) launch_format<DenseFormat::kMxfp4>(p, s);
  else if (p.dense == DenseFormat::kFp8) launch_format<DenseFormat::kFp8>(p, s);
  else launch_format<DenseFormat::kBf16>(p, s);
}

}  // namespace mx::cuda
