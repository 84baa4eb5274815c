#include "kernels/decode/decode_kernels.h"

#include <cfloat>
#include <cuda_bf16.h>

namespace mx::cuda {
namespace {

__device__ __forceinline__ float bf(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint16_t to_bf(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__constant__ float kFp4[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

__global__ void embed_k(const uint16_t* E, const int32_t* tok, float* x, int H) {
  const int m = blockIdx.x;
  const uint16_t* row = E + size_t(tok[m]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) x[size_t(m) * H + i] = bf(row[i]);
}

__global__ void rmsnorm_k(const float* x, const int32_t* rows, const uint16_t* g, float* y, int H, float eps) {
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
  for (int i = threadIdx.x; i < H; i += blockDim.x) y[size_t(m) * H + i] = bf(g[i]) * (xr[i] * r);
}

// One warp per output row; each lane streams 16-byte chunks (8 bf16) of the row.
constexpr int kMT = 8;
__global__ void gemv_bf16_k(const uint16_t* __restrict__ W, const uint16_t* __restrict__ b,
                            const float* __restrict__ x, float* y, int M, int N, int K, int ldy, bool acc) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = blockIdx.x * (blockDim.x >> 5) + warp;
  if (r >= N) return;
  const uint4* wr = reinterpret_cast<const uint4*>(W + size_t(r) * K);
  const int C = K / 8;
  for (int m0 = 0; m0 < M; m0 += kMT) {
    float a[kMT];
#pragma unroll
    for (int i = 0; i < kMT; ++i) a[i] = 0.f;
    for (int c = lane; c < C; c += 32) {
      uint4 w = __ldg(wr + c);
      float wf[8] = {bf_lo(w.x), bf_hi(w.x), bf_lo(w.y), bf_hi(w.y), bf_lo(w.z), bf_hi(w.z), bf_lo(w.w), bf_hi(w.w)};
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
        if (m0 + i < M) {
          const float4* xp = reinterpret_cast<const float4*>(x + size_t(m0 + i) * K + c * 8);
          float4 x0 = xp[0], x1 = xp[1];
          a[i] += wf[0] * x0.x + wf[1] * x0.y + wf[2] * x0.z + wf[3] * x0.w + wf[4] * x1.x + wf[5] * x1.y +
                  wf[6] * x1.z + wf[7] * x1.w;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
      float v = warp_sum(a[i]);
      if (lane == 0 && m0 + i < M) {
        v += b ? bf(b[r]) : 0.f;
        float* o = y + size_t(m0 + i) * ldy + r;
        *o = acc ? *o + v : v;
      }
    }
  }
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
    } else {
      const size_t o = crow + size_t(h - p.Hq) * D;
      p.k_cache[o + i] = to_bf(y1);
      p.k_cache[o + i + half] = to_bf(y2);
    }
  }
  const float* vv = q + size_t(p.Hq + p.Hkv) * D;
  for (int t = threadIdx.x; t < p.Hkv * D; t += blockDim.x) p.v_cache[crow + t] = to_bf(vv[t]);
}

// One block (4 warps) per (token, q head); each warp runs an online softmax over a strided
// subset of keys, then the warps merge and the sink joins the denominator once.
constexpr int kAttnWarps = 4;
__global__ void attention_k(AttnParams p) {
  const int m = blockIdx.x, h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int D = p.D, kvh = h / (p.Hq / p.Hkv), kvd = p.Hkv * D;
  const float* q = p.qkv + size_t(m) * (p.Hq + 2 * p.Hkv) * D + size_t(h) * D;
  const float scale = rsqrtf(float(D));
  const float q0 = lane < D ? q[lane] * scale : 0.f, q1 = lane + 32 < D ? q[lane + 32] * scale : 0.f;
  const int pos = p.pos[m];
  const int lo = p.window > 0 ? max(0, pos - p.window + 1) : 0;
  const int32_t* bt = p.block_tables + p.bt_off[m];
  float mx = -FLT_MAX, l = 0.f, o0 = 0.f, o1 = 0.f;
  for (int j = lo + warp; j <= pos; j += kAttnWarps) {
    const size_t base = (size_t(bt[j / p.block_size]) * p.block_size + j % p.block_size) * kvd + size_t(kvh) * D;
    float k0 = lane < D ? bf(p.k_cache[base + lane]) : 0.f, k1 = lane + 32 < D ? bf(p.k_cache[base + lane + 32]) : 0.f;
    float s = warp_sum(q0 * k0 + q1 * k1);
    float nm = fmaxf(mx, s), c = __expf(mx - nm), e = __expf(s - nm);
    float v0 = lane < D ? bf(p.v_cache[base + lane]) : 0.f, v1 = lane + 32 < D ? bf(p.v_cache[base + lane + 32]) : 0.f;
    l = l * c + e;
    o0 = o0 * c + e * v0;
    o1 = o1 * c + e * v1;
    mx = nm;
  }
  __shared__ float sm[kAttnWarps], sl[kAttnWarps], so[kAttnWarps][64];
  if (lane == 0) { sm[warp] = mx; sl[warp] = l; }
  so[warp][lane] = o0;
  so[warp][lane + 32] = o1;
  __syncthreads();
  if (warp == 0) {
    const float sink = bf(p.sinks[h]);
    float M = sink;
    for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm[w]);
    float den = expf(sink - M), a0 = 0.f, a1 = 0.f;
    for (int w = 0; w < kAttnWarps; ++w) {
      float f = sl[w] > 0.f ? expf(sm[w] - M) : 0.f;
      den += sl[w] * f;
      a0 += so[w][lane] * f;
      a1 += so[w][lane + 32] * f;
    }
    float* out = p.out + size_t(m) * p.Hq * D + size_t(h) * D;
    if (lane < D) out[lane] = a0 / den;
    if (lane + 32 < D) out[lane + 32] = a1 / den;
  }
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
  float z = 0.f;
  for (int j = 0; j < k; ++j) z += (val[j] = expf(val[j] - val[0]));
  for (int j = 0; j < k; ++j) {
    idx[m * k + j] = sel[j];
    w[m * k + j] = val[j] / z;
  }
}

// Dot of one MXFP4 row (K elements: K/32 groups of 16 bytes + 1 scale byte) with x, one warp.
// A 16-byte chunk is exactly one 32-element group, so each lane owns whole groups.
__device__ __forceinline__ float mxfp4_row_dot(const uint8_t* blk, const uint8_t* sc, const float* x, int K,
                                               int lane) {
  float acc = 0.f;
  for (int g = lane; g < K / 32; g += 32) {
    uint4 w = __ldg(reinterpret_cast<const uint4*>(blk) + g);
    const float s = __uint_as_float(uint32_t(sc[g]) << 23);
    const float4* xp = reinterpret_cast<const float4*>(x + g * 32);
    uint32_t ws[4] = {w.x, w.y, w.z, w.w};
    float part = 0.f;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float4 xa = xp[2 * q], xb = xp[2 * q + 1];
      uint32_t v = ws[q];
      part += kFp4[v & 15] * xa.x + kFp4[(v >> 4) & 15] * xa.y + kFp4[(v >> 8) & 15] * xa.z +
              kFp4[(v >> 12) & 15] * xa.w + kFp4[(v >> 16) & 15] * xb.x + kFp4[(v >> 20) & 15] * xb.y +
              kFp4[(v >> 24) & 15] * xb.z + kFp4[v >> 28] * xb.w;
    }
    acc += part * s;
  }
  return warp_sum(acc);
}

// grid: (ceil(I / warps), M * k). Each warp makes one activation from rows 2i (gate), 2i+1 (up).
__global__ void moe_fc1_k(MoeFc1Params p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i = blockIdx.x * (blockDim.x >> 5) + warp, mj = blockIdx.y, m = mj / p.k;
  if (i >= p.I) return;
  const int e = p.idx[mj];
  const size_t R = size_t(e) * 2 * p.I + 2 * i;
  const size_t rb = size_t(p.H) / 2, rs = size_t(p.H) / 32;
  const float* x = p.x + size_t(m) * p.H;
  float g = mxfp4_row_dot(p.blocks + R * rb, p.scales + R * rs, x, p.H, lane) + bf(p.bias[R]);
  float u = mxfp4_row_dot(p.blocks + (R + 1) * rb, p.scales + (R + 1) * rs, x, p.H, lane) + bf(p.bias[R + 1]);
  if (lane == 0) {
    g = fminf(g, p.limit);
    u = fminf(fmaxf(u, -p.limit), p.limit);
    p.act[size_t(mj) * p.I + i] = g / (1.f + expf(-p.alpha * g)) * (u + 1.f);
  }
}

// grid: (ceil(H / warps), M). Each warp owns x[m, h] and sums the k experts' rows into it.
__global__ void moe_fc2_k(MoeFc2Params p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = blockIdx.x * (blockDim.x >> 5) + warp, m = blockIdx.y;
  if (h >= p.H) return;
  const size_t rb = size_t(p.I) / 2, rs = size_t(p.I) / 32;
  float acc = 0.f;
  for (int j = 0; j < p.k; ++j) {
    const int mj = m * p.k + j, e = p.idx[mj];
    const size_t R = size_t(e) * p.H + h;
    float y = mxfp4_row_dot(p.blocks + R * rb, p.scales + R * rs, p.act + size_t(mj) * p.I, p.I, lane) + bf(p.bias[R]);
    acc += p.w[mj] * y;
  }
  if (lane == 0) p.x[size_t(m) * p.H + h] += acc;
}

__global__ void argmax_k(const float* lg, int V, int32_t* tok, float* lp) {
  const int s = blockIdx.x;
  const float* r = lg + size_t(s) * V;
  float best = -FLT_MAX;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += blockDim.x)
    if (r[i] > best) { best = r[i]; bi = i; }  // per-thread ids increase: first max kept
  __shared__ float sv[1024];
  __shared__ int si[1024];
  sv[threadIdx.x] = best;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int o = blockDim.x / 2; o; o >>= 1) {
    if (threadIdx.x < o) {
      float v2 = sv[threadIdx.x + o];
      int i2 = si[threadIdx.x + o];
      if (v2 > sv[threadIdx.x] || (v2 == sv[threadIdx.x] && i2 < si[threadIdx.x])) { sv[threadIdx.x] = v2; si[threadIdx.x] = i2; }
    }
    __syncthreads();
  }
  const float mx = sv[0];
  const int id = si[0];
  __syncthreads();
  float z = 0.f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) z += expf(r[i] - mx);
  sv[threadIdx.x] = z;
  __syncthreads();
  for (int o = blockDim.x / 2; o; o >>= 1) {
    if (threadIdx.x < o) sv[threadIdx.x] += sv[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) { tok[s] = id; lp[s] = -logf(sv[0]); }
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
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
void launch_rmsnorm_f32(const float* x, const int32_t* rows, const uint16_t* g, float* y, int M, int H, float eps,
                        cudaStream_t s) {
  rmsnorm_k<<<M, 256, 0, s>>>(x, rows, g, y, H, eps);
}
void launch_gemv_bf16(const uint16_t* W, const uint16_t* b, const float* x, float* y, int M, int N, int K, int ldy,
                      bool acc, cudaStream_t s) {
  gemv_bf16_k<<<(N + 7) / 8, 256, 0, s>>>(W, b, x, y, M, N, K, ldy, acc);
}
void launch_rope_kv(const RopeKvParams& p, cudaStream_t s) { rope_kv_k<<<p.M, 256, 0, s>>>(p); }
void launch_attention(const AttnParams& p, cudaStream_t s) {
  attention_k<<<dim3(p.M, p.Hq), 32 * kAttnWarps, 0, s>>>(p);
}
void launch_topk_softmax(const float* lg, int32_t* idx, float* w, int M, int E, int k, cudaStream_t s) {
  topk_k<<<(M + 63) / 64, 64, 0, s>>>(lg, idx, w, M, E, k);
}
void launch_moe_fc1_swiglu(const MoeFc1Params& p, cudaStream_t s) {
  moe_fc1_k<<<dim3((p.I + 7) / 8, p.M * p.k), 256, 0, s>>>(p);
}
void launch_moe_fc2_combine(const MoeFc2Params& p, cudaStream_t s) {
  moe_fc2_k<<<dim3((p.H + 7) / 8, p.M), 256, 0, s>>>(p);
}
void launch_argmax_logprob(const float* lg, int S, int V, int32_t* tok, float* lp, cudaStream_t s) {
  argmax_k<<<S, 1024, 0, s>>>(lg, V, tok, lp);
}
void launch_fill_random_bf16(uint16_t* p, size_t n, float scale, float offset, uint64_t seed, cudaStream_t s) {
  fill_bf16_k<<<1024, 256, 0, s>>>(p, n, scale, offset, seed);
}
void launch_fill_random_u8(uint8_t* p, size_t n, uint8_t lo, uint8_t span, uint64_t seed, cudaStream_t s) {
  fill_u8_k<<<1024, 256, 0, s>>>(p, n, lo, span, seed);
}

}  // namespace mx::cuda
