// MXFP4 expert kernels of the decode step as their own grids: (row-tile CTAs, distinct-expert slot).
// Bodies and routing in moe_body.cuh.
#include "kernels/decode/decode_gemv.h"

#include <algorithm>
#include <cfloat>

#include "kernels/common/cuda_check.h"
#include "kernels/common/device_math.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/decode/moe_body.cuh"

namespace mx::cuda {
namespace {
using namespace mma;
using namespace body;

template <bool kMul>
__global__ void __launch_bounds__(128, 3) fc1_k(MoeDecodeParams p) {
  __shared__ float red[kMoeWarps * 32 * 4];
  __shared__ Routing r;
  pdl_wait();  // the experts to read depend on the router, the kernel just before
  pdl_launch_dependents();
  route_tokens(p.router_logits, p.router_splits, p.M, p.E, r);
  if (int(blockIdx.y) < r.count) fc1_swiglu<kMul>(p, r, blockIdx.x, blockIdx.y, red);  // uniform
}

template <bool kMul>
__global__ void __launch_bounds__(128, 3) fc2_k(MoeDecodeParams p) {
  __shared__ float red[kMoeWarps * 32 * 4];
  __shared__ Routing r;
  // The router finished before FC1 passed its own wait, and FC1 lets this kernel launch only after
  // that: routing and the first weight loads overlap FC1's tail; the wait guards FC1's activations.
  route_tokens(p.router_logits, p.router_splits, p.M, p.E, r);
  if (int(blockIdx.y) < r.count) fc2<kMul>(p, r, blockIdx.x, blockIdx.y, red, PdlWait{});
}

void check(const MoeDecodeParams& p) {
  if (p.M < 1 || p.M > kMaxDecodeTokens) throw_error("moe decode: M must be 1..8, got " + std::to_string(p.M));
  if (p.E < kTopK || p.E > 128) throw_error("moe decode: expert count must be 4..128");
  if (p.H % 32 || p.I % 32) throw_error("moe decode: hidden and intermediate sizes must be multiples of 32");
}

}  // namespace

void mxfp4_moe_fc1_swiglu(const MoeDecodeParams& p, cudaStream_t s) {
  check(p);
  static bool init = (allow_dynamic_smem(fc1_k<false>), allow_dynamic_smem(fc1_k<true>), true);
  (void)init;
  launch_pdl(p.M > 1 ? fc1_k<true> : fc1_k<false>, dim3(fc1_ctas(p.I), moe_slots(p.M, p.E)), dim3(128),
             size_t(p.M) * staged_ld(p.H) * 2, s, p);
}

void mxfp4_moe_fc2(const MoeDecodeParams& p, cudaStream_t s) {
  check(p);
  static bool init = (allow_dynamic_smem(fc2_k<false>), allow_dynamic_smem(fc2_k<true>), true);
  (void)init;
  launch_pdl(p.M > 1 ? fc2_k<true> : fc2_k<false>, dim3(fc2_ctas(p.H), moe_slots(p.M, p.E)), dim3(128),
             size_t(p.M) * staged_ld(p.I) * 2, s, p);
}

}  // namespace mx::cuda
