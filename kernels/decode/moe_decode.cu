// MXFP4 expert kernels of the decode step as their own grids: (row-tile CTAs, distinct-expert slot).
// Bodies and routing in moe_body.cuh.
#include "kernels/decode/decode_gemv.h"

#include <algorithm>
#include <cfloat>

#include "kernels/common/cta_trace.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/device_math.cuh"
#include "kernels/common/l2_prefetch.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/decode/moe_body.cuh"
#include "kernels/decode/e4m3_split.cuh"

namespace mx::cuda {
namespace {
using namespace mma;
using namespace body;

__device__ __forceinline__ bool held(const MoeDecodeParams& p, int e) { return e >= p.expert_lo && e < p.expert_hi; }

__global__ void __launch_bounds__(128, 3) fc1_k(MoeDecodeParams p) {
  __shared__ float red[kMoeWarps * 32 * 4];
  __shared__ Routing r;
  trace_begin(p.trace);
  TracedPdlWait{p.trace.buf}();  // the experts to read depend on the router, the kernel just before
  route_tokens(p.router_logits, p.router_splits, p.M, p.E, r, p.expert_lo, p.expert_hi);
  if (int(blockIdx.y) < r.count) fc1_swiglu(p, r, blockIdx.x, blockIdx.y, red);  // uniform
  trace_end(p.trace, 4);
}

__global__ void __launch_bounds__(128, 3) fc2_k(MoeDecodeParams p) {
  __shared__ float red[kMoeWarps * 32 * 4];
  __shared__ Routing r;
  trace_begin(p.trace);
  // The router finished before FC1 passed its own wait, and FC1 lets this kernel launch only after
  // that: routing and the first weight loads overlap FC1's tail; the wait guards FC1's activations.
  route_tokens(p.router_logits, p.router_splits, p.M, p.E, r, p.expert_lo, p.expert_hi);
  if (int(blockIdx.y) < r.count) fc2(p, r, blockIdx.x, blockIdx.y, red, TracedPdlWait{p.trace.buf});
  trace_end(p.trace, 5);
}

// One token on FP8 tensor cores (e4m3_split.cuh), sm_89+. Same grids and tiles as above; the
// activations are staged as e4m3 (hi, lo) terms, four weight segments in flight per warp (more were
// slower, as was FC2 without the K split: docs/perf.md).
constexpr int kM1U = 4;

__device__ __forceinline__ bool fp8_arch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return true;
#else
  return false;
#endif
}

// Element j of a four-entry register array without a local-memory index.
template <class T>
__device__ __forceinline__ T pick4(const T (&v)[kTopK], int j) {
  return j == 0 ? v[0] : j == 1 ? v[1] : j == 2 ? v[2] : v[3];
}

// kSplit: expert parallelism (some experts held on another GPU). The held check is compiled only there:
// its early exit before the weight loads cost batch-1 decode ~1 % (docs/perf.md, session 39).
template <int KSPLIT, bool kSplit>
__device__ __forceinline__ void fc1_m1(const MoeDecodeParams& p, uint8_t* xst, float* red,
                                       const unsigned long long* tbuf) {
  if (p.route_acc && threadIdx.x == 0) {  // read after the wait (l2_prefetch.cuh)
    l2_prefetch_keep(p.norm_w, p.H * 2);
    l2_prefetch_keep(p.router_bias, p.E * 2);
  }
  TracedPdlWait{tbuf}();
  if (!fp8_arch()) return;
  // One token: its four experts are the distinct slots in order, so every warp routes on its own
  // (no barrier before the weight loads).
  int sel[kTopK];
  float wt[kTopK];
  // The staging's first loads (h, gamma) do not need the routing: issued beside its loads, they do not
  // queue behind the expert weights' first batch.
  e4m3::NormSrc norm{p.h, p.norm_w, 0.f};
  e4m3::NormSrc::Raw raw[e4m3::kStageBatch];
  if (p.route_acc) {
    e4m3::stage_split_load(norm, p.H, 0, raw);
    norm.inv = route_token_acc(p, sel, wt);
  } else {
    route_token(p.router_logits, p.router_splits, 1, 0, p.E, sel, wt);
  }
  const int j = blockIdx.y, e = pick4(sel, j), H = p.H, I = p.I;
  if (kSplit && !held(p, e)) return;  // another GPU's expert
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * (kMoeWarps / KSPLIT) + warp / KSPLIT, kp = warp % KSPLIT, ntiles = I / 8;
  // Fragment rows g / g + 8 are gate row 2i / up row 2i + 1 of activation i.
  const int i = min(tile, ntiles - 1) * 8 + g;
  const size_t rA = size_t(e) * 2 * I + 2 * i;
  int s0;
  e4m3::Pipe<kM1U> pipe = expert_pipe<KSPLIT, kM1U, true>(p.fc1_blocks, p.fc1_scales, rA, rA + 1, H, kp, t, s0);
  const float bg = bf(p.fc1_bias[rA]), bu = bf(p.fc1_bias[rA + 1]);  // the epilogue's, in flight with the weights
  if (p.route_acc) e4m3::stage_split_rest(norm, H, raw, xst);
  else e4m3::stage_split(p.xn, H, xst);
  __syncthreads();
  const float2 v = e4m3::tile_run(pipe, xst, H, s0);
  float c[4] = {v.x, 0.f, v.y, 0.f};
  reduce_ksplit(c, red, KSPLIT);
  if (kp != 0 || tile >= ntiles || t != 0) return;
  const float gate = fminf(c[0] + bg, p.limit);
  const float up = fminf(fmaxf(c[2] + bu, -p.limit), p.limit);
  const float glu = gate / (1.f + expf(-p.alpha * gate));
  p.act[size_t(j) * I + i] = uint16_t(f32_to_bf16_bits(glu * (up + 1.f)));
}

// KSPLIT 2: two warps a tile, each half of K, for grids of under two CTAs an SM (a tensor-parallel rank's
// half of the intermediate rows): the per-warp chain of loads halves where the grid alone would not fill
// the GPU.
template <int KSPLIT, bool kSplit>
__global__ void __launch_bounds__(128, 3) fc1_m1_k(MoeDecodeParams p) {
  extern __shared__ __align__(16) uint8_t xst[];
  __shared__ float red[KSPLIT > 1 ? kMoeWarps * 32 * 4 : 1];
  trace_begin(p.trace);
  fc1_m1<KSPLIT, kSplit>(p, xst, red, p.trace.buf);
  trace_end(p.trace, 4);
}

template <bool kSplit>
__device__ __forceinline__ void fc2_m1(const MoeDecodeParams& p, uint8_t* xst, float* red, const unsigned long long* tbuf) {
  if (!fp8_arch()) return;
  int sel[kTopK];
  float wt[kTopK];
  if (p.route_acc) route_token_acc(p, sel, wt);  // before the wait: see fc2_k
  else route_token(p.router_logits, p.router_splits, 1, 0, p.E, sel, wt);
  constexpr int KSPLIT = kFc2Split;
  const int j = blockIdx.y, e = pick4(sel, j), H = p.H, I = p.I;
  if (kSplit && !held(p, e)) return;  // another GPU's expert
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * (kMoeWarps / KSPLIT) + warp / KSPLIT, kp = warp % KSPLIT, ntiles = (H + 15) / 16;
  const int r0 = min(tile, ntiles - 1) * 16;
  const size_t rA = size_t(e) * H + min(r0 + g, H - 1), rB = size_t(e) * H + min(r0 + g + 8, H - 1);
  int s0;
  e4m3::Pipe<kM1U> pipe = expert_pipe<KSPLIT, kM1U, true>(p.fc2_blocks, p.fc2_scales, rA, rB, I, kp, t, s0);
  const int ra = r0 + g, rb = r0 + g + 8;  // the epilogue's bias, read before the wait
  const float ba = ra < H ? bf(p.fc2_bias[size_t(e) * H + ra]) : 0.f, bb = rb < H ? bf(p.fc2_bias[size_t(e) * H + rb]) : 0.f;
  TracedPdlWait{tbuf}();  // FC1's activations
  e4m3::stage_split(p.act + size_t(j) * I, I, xst);
  __syncthreads();
  const float2 v = e4m3::tile_run(pipe, xst, I, s0);
  float c[4] = {v.x, 0.f, v.y, 0.f};
  reduce_ksplit(c, red, KSPLIT);
  if (kp != 0 || tile >= ntiles || t != 0) return;
  const float w = pick4(wt, j);
  if (ra < H) p.y_slot[size_t(j) * H + ra] = w * (c[0] + ba);
  if (rb < H) p.y_slot[size_t(j) * H + rb] = w * (c[2] + bb);
}

template <bool kSplit>
__global__ void __launch_bounds__(128, 3) fc2_m1_k(MoeDecodeParams p) {
  extern __shared__ __align__(16) uint8_t xst[];
  __shared__ float red[kMoeWarps * 32 * 4];
  trace_begin(p.trace);
  fc2_m1<kSplit>(p, xst, red, p.trace.buf);
  trace_end(p.trace, 5);
}

// The one-token FP8 path: sm_89+.
bool use_m1(int M) {
  if (M != 1) return false;
  static std::atomic<int> cc[64];
  return per_device(cc, [](int dev) {
           int major = 0, minor = 0;
           MX_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
           MX_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
           return major * 10 + minor;
         }) >= 89;
}
bool use_m1(const MoeDecodeParams& p) { return use_m1(p.M); }
bool splits_experts(const MoeDecodeParams& p) { return p.expert_lo > 0 || p.expert_hi < p.E; }

// The one-token FC1's K split: 2 where one warp a tile leaves the grid under two CTAs an SM.
int fc1_m1_ksplit(const MoeDecodeParams& p) {
  return fc1_ctas(p.I, 1) * moe_slots(1, p.E) < 2 * device_sm_count() ? 2 : 1;
}

void check(const MoeDecodeParams& p) {
  if (p.M < 1 || p.M > kMaxDecodeTokens) throw_error("moe decode: M must be 1..8, got " + std::to_string(p.M));
  if (p.E < kTopK || p.E > 128) throw_error("moe decode: expert count must be 4..128");
  if (p.H % 32 || p.I % 32) throw_error("moe decode: hidden and intermediate sizes must be multiples of 32");
}

}  // namespace

bool mxfp4_moe_one_token_fp8(int M) { return use_m1(M); }

void mxfp4_moe_fc1_swiglu(const MoeDecodeParams& p, cudaStream_t s) {
  check(p);
  static std::atomic<unsigned long long> ready{0};
  once_per_device(ready, [] { allow_dynamic_smem(fc1_k); });
  const bool m1 = use_m1(p);
  if (p.route_acc && !m1) throw_error("moe decode: route_acc needs the one-token FP8 path");
  if (m1) {
    const int ks = fc1_m1_ksplit(p);
    const dim3 grid(fc1_ctas(p.I, ks), moe_slots(1, p.E));
    const size_t smem = e4m3::stage_bytes(p.H);
    if (splits_experts(p)) {
      if (ks == 2) launch_pdl(fc1_m1_k<2, true>, grid, dim3(128), smem, s, p);
      else launch_pdl(fc1_m1_k<1, true>, grid, dim3(128), smem, s, p);
    } else {
      if (ks == 2) launch_pdl(fc1_m1_k<2, false>, grid, dim3(128), smem, s, p);
      else launch_pdl(fc1_m1_k<1, false>, grid, dim3(128), smem, s, p);
    }
    return;
  }
  launch_pdl(fc1_k, dim3(fc1_ctas(p.I), moe_slots(p.M, p.E)), dim3(128),
             size_t(p.M) * staged_ld(p.H) * 2, s, p);
}

void mxfp4_moe_fc2(const MoeDecodeParams& p, cudaStream_t s) {
  check(p);
  static std::atomic<unsigned long long> ready{0};
  once_per_device(ready, [] { allow_dynamic_smem(fc2_k); });
  const bool m1 = use_m1(p);
  if (p.route_acc && !m1) throw_error("moe decode: route_acc needs the one-token FP8 path");
  if (m1) {
    const dim3 grid(fc2_ctas(p.H), moe_slots(1, p.E));
    const size_t smem = e4m3::stage_bytes(p.I);
    if (splits_experts(p)) launch_pdl(fc2_m1_k<true>, grid, dim3(128), smem, s, p);
    else launch_pdl(fc2_m1_k<false>, grid, dim3(128), smem, s, p);
    return;
  }
  launch_pdl(fc2_k, dim3(fc2_ctas(p.H), moe_slots(p.M, p.E)), dim3(128),
             size_t(p.M) * staged_ld(p.I) * 2, s, p);
}

}  // namespace mx::cuda
