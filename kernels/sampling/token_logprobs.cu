// One CTA a row: a pass for the largest logit, the sum of exponentials (online rescaling) and the ids
// above the target; then `top` passes, each picking the best id after the last one picked.
#include "kernels/common/cuda_check.h"
#include "kernels/sampling/token_logprobs.h"

#include <cfloat>
#include <string>

namespace mx::cuda {
namespace {

constexpr int kThreads = 512, kWarps = kThreads / 32;

// (v, id) before (w, jd) in the candidate order: larger logit first, then the lower id.
__device__ __forceinline__ bool before(float v, int id, float w, int jd) {
  return v > w || (v == w && id < jd);
}

__device__ __forceinline__ void best_of_block(float& v, int& id, float* sv, int* sid) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    const int jd = __shfl_xor_sync(0xffffffffu, id, o);
    if (before(w, jd, v, id)) v = w, id = jd;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // the previous use of sv / sid is over
  if (lane == 0) sv[warp] = v, sid[warp] = id;
  __syncthreads();
  v = sv[0];
  id = sid[0];
  for (int w = 1; w < kWarps; ++w)
    if (before(sv[w], sid[w], v, id)) v = sv[w], id = sid[w];
}

__global__ void __launch_bounds__(kThreads) token_logprobs_k(TokenLogprobParams p) {
  __shared__ float sv[kWarps], sm[kWarps], ss[kWarps];
  __shared__ int sid[kWarps], sc[kWarps];
  const int src = p.row_index ? p.row_index[blockIdx.x] : int(blockIdx.x);
  const float* row = p.logits + size_t(src) * p.stride;
  const int target = p.targets[src];
  const float t = target >= 0 && target < p.V ? row[target] : -INFINITY;
  float m = -INFINITY, sum = 0.f;
  int above = 0;
  for (int i = threadIdx.x; i < p.V; i += kThreads) {
    const float v = row[i];
    above += v > t;
    if (v > m) {
      sum = sum * __expf(m - v) + 1.f;  // (m = -inf at first: 0 * 0 + 1)
      m = v;
    } else if (m != -INFINITY) {  // (both -inf: a masked id adds nothing)
      sum += __expf(v - m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, sum, o);
    const float mm = fmaxf(m, m2);
    sum = (m == -INFINITY ? 0.f : sum * __expf(m - mm)) + (m2 == -INFINITY ? 0.f : s2 * __expf(m2 - mm));
    m = mm;
    above += __shfl_xor_sync(0xffffffffu, above, o);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) sm[warp] = m, ss[warp] = sum, sc[warp] = above;
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w]);
  float Z = 0.f;
  int count = 0;
  for (int w = 0; w < kWarps; ++w) {
    Z += sm[w] == -INFINITY ? 0.f : ss[w] * __expf(sm[w] - M);
    count += sc[w];
  }
  const float log_z = M + logf(Z);
  float* out = p.out + size_t(blockIdx.x) * kTokenLogprobFloats;
  if (threadIdx.x == 0) {
    out[0] = t - log_z;
    out[1] = __int_as_float(1 + count);
  }
  float pv = INFINITY;
  int pid = -1;
  for (int r = 0; r < p.top; ++r) {
    float v = -INFINITY;
    int id = 0x7fffffff;
    for (int i = threadIdx.x; i < p.V; i += kThreads) {
      const float w = row[i];
      if (before(pv, pid, w, i) && before(w, i, v, id)) v = w, id = i;
    }
    best_of_block(v, id, sv, sid);
    if (threadIdx.x == 0) {
      out[2 + 2 * r] = __int_as_float(id == 0x7fffffff ? -1 : id);
      out[3 + 2 * r] = v - log_z;
    }
    pv = v;
    pid = id;
  }
}

}  // namespace

void token_logprobs(const TokenLogprobParams& p, cudaStream_t s) {
  if (p.top < 0 || p.top > kTokenLogprobMaxTop)
    throw_error("token_logprobs: top " + std::to_string(p.top) + " outside [0, " + std::to_string(kTokenLogprobMaxTop) + "]");
  if (p.rows > 0) token_logprobs_k<<<p.rows, kThreads, 0, s>>>(p);
}

}  // namespace mx::cuda
