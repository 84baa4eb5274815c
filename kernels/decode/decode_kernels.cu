#include "kernels/decode/decode_kernels.h"

#include <cfloat>
#include <cuda_bf16.h>

#include "kernels/common/device_math.cuh"

namespace mx::cuda {
namespace {

__device__ __forceinline__ uint16_t to_bf(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

__global__ void embed_k(const uint16_t* E, const int32_t* tok, float* x, int H) {
  const int m = blockIdx.x;
  const uint16_t* row = E + size_t(tok[m]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) x[size_t(m) * H + i] = bf(row[i]);
}

__global__ void rmsnorm_k(const float* x, const int32_t* rows, const uint16_t* g, uint16_t* y, int H, float eps) {
  const int m = blockIdx.x;
  const float* xr = x + size_t(rows ? rows[m] : m) * H;
  float ss = 0;
  for (int i = threadIdx.x; i < H; i += blockDim.x) ss += xr[i] * xr[i];
  __shared__ float red[32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
    v = warp_sum(v);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  const float r = rsqrtf(red[0] / H + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x) y[size_t(m) * H + i] = to_bf(bf(g[i]) * (xr[i] * r));
}

__global__ void rope_kv_k(RopeKvParams p) {
  const int m = blockIdx.x, D = p.D, half = D / 2;
  const int qkv_dim = (p.Hq + 2 * p.Hkv) * D;
  float* q = p.qkv + size_t(m) * qkv_dim;
  const float pos = float(p.pos[m]);
  const size_t crow = size_t(p.slot[m]) * p.Hkv * D;
  // heads 0..Hq-1 are q, Hq..Hq+Hkv-1 are k (rotated and cached), then v (cached as is).
  for (int t = threadIdx.x; t < (p.Hq + p.Hkv) * half; t += blockDim.x) {
    const int h = t / half, i = t % half;
    float ang = pos * p.inv_freq[i];
    float sn, cs;
    sincosf(ang, &sn, &cs);
    cs *= p.concentration;
    sn *= p.concentration;
    float* v = q + size_t(h) * D;
    float x1 = v[i], x2 = v[i + half];
    float y1 = x1 * cs - x2 * sn, y2 = x2 * cs + x1 * sn;
    if (h < p.Hq) {
      v[i] = y1;
      v[i + half] = y2;
      uint16_t* qb = p.q_bf16 + size_t(m) * p.Hq * D + size_t(h) * D;
      qb[i] = to_bf(y1);
      qb[i + half] = to_bf(y2);
    } else {
      const size_t o = crow + size_t(h - p.Hq) * D;
      p.k_cache[o + i] = to_bf(y1);
      p.k_cache[o + i + half] = to_bf(y2);
    }
  }
  const float* vv = q + size_t(p.Hq + p.Hkv) * D;
  for (int t = threadIdx.x; t < p.Hkv * D; t += blockDim.x) p.v_cache[crow + t] = to_bf(vv[t]);
}

__global__ void topk_k(const float* lg, int32_t* idx, float* w, int M, int E, int k) {
  const int m = blockIdx.x * blockDim.x + threadIdx.x;
  if (m >= M) return;
  const float* r = lg + size_t(m) * E;
  int sel[8];
  float val[8];
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool used = false;
      for (int t = 0; t < j; ++t) used |= sel[t] == e;
      if (!used && (best < 0 || r[e] > r[best])) best = e;
    }
    sel[j] = best;
    val[j] = r[best];
  }
  const float top = val[0];  // val[0] is overwritten below
  float z = 0.f;
  for (int j = 0; j < k; ++j) z += (val[j] = expf(val[j] - top));
  for (int j = 0; j < k; ++j) {
    idx[m * k + j] = sel[j];
    w[m * k + j] = val[j] / z;
  }
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Uniform in (0, 1) for vocabulary id i of a row's random stream (24 bits, never 0 or 1). The inner
// log of the Gumbel noise is the accurate logf: near u = 1, __logf's absolute error exceeds -log(u).
__device__ __forceinline__ float stream_uniform(uint64_t key, int i) {
  return (float(mix64(key + uint64_t(i) * 0x9e3779b97f4a7c15ull) >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

__global__ void argmax_k(const float* lg, int stride, int V, int32_t* tok, float* lp, const float* inv_temp,
                         const uint64_t* keys) {
  const int s = blockIdx.x;
  const float* r = lg + size_t(s) * stride;
  const float it = inv_temp ? inv_temp[s] : 0.f;
  const uint64_t key = it > 0.f ? keys[s] : 0;
  // score = logit (greedy) or logit / T + Gumbel noise; raw max kept for the log-softmax.
  auto score = [&](float x, int i) { return it > 0.f ? x * it - __logf(-logf(stream_uniform(key, i))) : x; };
  float best = -FLT_MAX, raw = -FLT_MAX;
  int bi = 0x7fffffff;
  // 16-byte loads, several in flight per thread (rows start 16-byte aligned: stride % 4 == 0).
  const float4* r4 = reinterpret_cast<const float4*>(r);
  const int v4 = stride % 4 == 0 && reinterpret_cast<uintptr_t>(lg) % 16 == 0 ? V / 4 : 0;
#pragma unroll 4
  for (int i = threadIdx.x; i < v4; i += blockDim.x) {
    const float4 x = r4[i];
    const float v[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float sc = score(v[u], 4 * i + u);
      raw = fmaxf(raw, v[u]);
      if (sc > best) { best = sc; bi = 4 * i + u; }  // per-thread ids increase: first max kept
    }
  }
  for (int i = 4 * v4 + threadIdx.x; i < V; i += blockDim.x) {
    const float sc = score(r[i], i);
    raw = fmaxf(raw, r[i]);
    if (sc > best) { best = sc; bi = i; }
  }
  __shared__ float sv[1024], sr[1024];
  __shared__ int si[1024];
  sv[threadIdx.x] = best;
  sr[threadIdx.x] = raw;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int o = blockDim.x / 2; o; o >>= 1) {
    if (threadIdx.x < o) {
      float v2 = sv[threadIdx.x + o];
      int i2 = si[threadIdx.x + o];
      if (v2 > sv[threadIdx.x] || (v2 == sv[threadIdx.x] && i2 < si[threadIdx.x])) { sv[threadIdx.x] = v2; si[threadIdx.x] = i2; }
      sr[threadIdx.x] = fmaxf(sr[threadIdx.x], sr[threadIdx.x + o]);
    }
    __syncthreads();
  }
  const float mx = sr[0];
  const int id = si[0];
  __syncthreads();
  float z = 0.f;
#pragma unroll 4
  for (int i = threadIdx.x; i < v4; i += blockDim.x) {
    const float4 x = r4[i];
    z += expf(x.x - mx) + expf(x.y - mx) + expf(x.z - mx) + expf(x.w - mx);
  }
  for (int i = 4 * v4 + threadIdx.x; i < V; i += blockDim.x) z += expf(r[i] - mx);
  sv[threadIdx.x] = z;
  __syncthreads();
  for (int o = blockDim.x / 2; o; o >>= 1) {
    if (threadIdx.x < o) sv[threadIdx.x] += sv[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) { tok[s] = id; lp[s] = r[id] - mx - logf(sv[0]); }
}

__global__ void fill_bf16_k(uint16_t* p, size_t n, float scale, float offset, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float u = float(mix64(seed + i * 0x9e3779b97f4a7c15ull) >> 40) * (1.0f / 16777216.0f);
    p[i] = to_bf(offset + scale * (2.f * u - 1.f));
  }
}
__global__ void fill_u8_k(uint8_t* p, size_t n, uint8_t lo, uint8_t span, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t r = mix64(seed + i * 0x9e3779b97f4a7c15ull);
    p[i] = span ? uint8_t(lo + r % span) : uint8_t(r);
  }
}

}  // namespace

void launch_embed_bf16(const uint16_t* e, const int32_t* t, float* x, int M, int H, cudaStream_t s) {
  embed_k<<<M, 256, 0, s>>>(e, t, x, H);
}
void launch_rmsnorm_bf16(const float* x, const int32_t* rows, const uint16_t* g, uint16_t* y, int M, int H, float eps,
                         cudaStream_t s) {
  rmsnorm_k<<<M, 256, 0, s>>>(x, rows, g, y, H, eps);
}
void launch_rope_kv(const RopeKvParams& p, cudaStream_t s) { rope_kv_k<<<p.M, 256, 0, s>>>(p); }
void launch_topk_softmax(const float* lg, int32_t* idx, float* w, int M, int E, int k, cudaStream_t s) {
  topk_k<<<(M + 63) / 64, 64, 0, s>>>(lg, idx, w, M, E, k);
}
void launch_argmax_logprob(const float* lg, int S, int V, int V_limit, int32_t* tok, float* lp, cudaStream_t s,
                           const float* inv_temp, const uint64_t* key) {
  argmax_k<<<S, 1024, 0, s>>>(lg, V, V_limit, tok, lp, inv_temp, key);
}
void launch_fill_random_bf16(uint16_t* p, size_t n, float scale, float offset, uint64_t seed, cudaStream_t s) {
  fill_bf16_k<<<1024, 256, 0, s>>>(p, n, scale, offset, seed);
}
void launch_fill_random_u8(uint8_t* p, size_t n, uint8_t lo, uint8_t span, uint64_t seed, cudaStream_t s) {
  fill_u8_k<<<1024, 256, 0, s>>>(p, n, lo, span, seed);
}

}  // namespace mx::cuda
