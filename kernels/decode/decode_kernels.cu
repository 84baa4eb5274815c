#include "kernels/decode/decode_kernels.h"

#include <algorithm>
#include <cfloat>
#include <cuda_bf16.h>

#include "kernels/common/cuda_check.h"
#include "kernels/common/device_math.cuh"
#include "kernels/common/kv_fp8.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/common/stream_random.cuh"

namespace mx::cuda {
namespace {

__device__ __forceinline__ uint16_t to_bf(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

__global__ void embed_k(const uint16_t* E, const int32_t* tok, const int32_t* picked, float* x, int H) {
  const int m = blockIdx.x;
  const int32_t t = tok[m];
  const uint16_t* row = E + size_t(t < 0 ? picked[-t - 1] : t) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) x[size_t(m) * H + i] = bf(row[i]);
}

__global__ void rmsnorm_k(const float* x, const int32_t* rows, const uint16_t* g, uint16_t* y, int H, float eps) {
  const int m = blockIdx.x;
  const float* xr = x + size_t(rows ? rows[m] : m) * H;
  float ss = 0;
  // Unrolled so a thread's loads of the row are in flight together (same sum order).
#pragma unroll 4
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
#pragma unroll 4
  for (int i = threadIdx.x; i < H; i += blockDim.x) y[size_t(m) * H + i] = to_bf(bf(g[i]) * (xr[i] * r));
}

// A thread an item (grid: tokens x items / 256): a rotated pair of a q or k head, or a v element; a wide
// decode step's few tokens would otherwise give each thread a chain of dependent round trips.
__global__ void rope_kv_k(RopeKvParams p) {
  const int m = blockIdx.x, D = p.D, half = D / 2;
  const int rot = (p.Hq + p.Hkv) * half, t = blockIdx.y * blockDim.x + threadIdx.x;
  if (t >= rot + p.Hkv * D) return;
  const int qkv_dim = (p.Hq + 2 * p.Hkv) * D;
  float* q = p.qkv + size_t(m) * qkv_dim;
  const size_t crow = size_t(p.slot[m]) * p.Hkv * D;
  // heads 0..Hq-1 are q, Hq..Hq+Hkv-1 are k (rotated and cached), then v (cached as is).
  if (t < rot) {
    const float pos = float(p.pos[m]);
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
      if (p.kv.fp8()) {
        p.kv.k_fp8()[o + i] = kv_to_e4m3(y1);
        p.kv.k_fp8()[o + i + half] = kv_to_e4m3(y2);
      } else {
        p.kv.k_bf16()[o + i] = to_bf(y1);
        p.kv.k_bf16()[o + i + half] = to_bf(y2);
      }
    }
  } else {
    const int u = t - rot;
    const float* vv = q + size_t(p.Hq + p.Hkv) * D;
    if (p.kv.fp8()) p.kv.v_fp8()[crow + u] = kv_to_e4m3(vv[u]);
    else p.kv.v_bf16()[crow + u] = to_bf(vv[u]);
  }
}

// One warp per token: k rounds of a warp argmax over the row (lowest index on ties; a NaN never
// wins, and a row of NaNs picks the lowest unused index). Lane 0 does the softmax in pick order.
__global__ void topk_k(const float* lg, int32_t* idx, float* w, int M, int E, int k) {
  const int m = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (m >= M) return;
  const float* r = lg + size_t(m) * E;
  int sel[8];
  float val[8];
  for (int j = 0; j < k; ++j) {
    float bv = -INFINITY;
    int bi = -1;
    for (int e = lane; e < E; e += 32) {
      bool used = false;
      for (int t = 0; t < j; ++t) used |= sel[t] == e;
      const float v = r[e];
      if (!used && (bi < 0 || v > bv || (bv != bv))) { bv = v; bi = e; }  // first candidate, or better
    }
    for (int o = 16; o; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      // a real value beats none and NaN; equal values: the lower index
      const bool take = oi >= 0 && (bi < 0 || (bv != bv && ov == ov) || ov > bv || (ov == bv && oi < bi) ||
                                    (bv != bv && ov != ov && oi < bi));
      if (take) { bv = ov; bi = oi; }
    }
    sel[j] = bi;
    val[j] = bv;
  }
  if (lane) return;
  const float top = val[0];  // val[0] is overwritten below
  float z = 0.f;
  for (int j = 0; j < k; ++j) z += (val[j] = expf(val[j] - top));
  for (int j = 0; j < k; ++j) {
    idx[m * k + j] = sel[j];
    w[m * k + j] = val[j] / z;
  }
}

// The inner log of the Gumbel noise is the accurate logf: near u = 1, __logf's absolute error exceeds
// -log(u). stream_uniform: kernels/common/stream_random.cuh.
// Greedy pick / Gumbel sample + log-softmax, split over argmax_chunks() CTAs per row (one CTA per row
// would leave a whole vocabulary's logit row to a single SM). Each chunk
// leaves (best score, its id, max logit, sum of exp(logit - max), the logit at its id); argmax_merge_k
// combines them.
struct ArgmaxPart { float best; int id; float mx; float z; float x; };
static_assert(sizeof(ArgmaxPart) == kArgmaxPartFloats * 4);
constexpr ArgmaxPart kNoPart{-FLT_MAX, 0x7fffffff, -INFINITY, 0.f, 0.f};

__device__ __forceinline__ void merge_part(ArgmaxPart& a, const ArgmaxPart& b) {
  if (b.best > a.best || (b.best == a.best && b.id < a.id)) { a.best = b.best; a.id = b.id; a.x = b.x; }
  const float m = fmaxf(a.mx, b.mx);
  if (m != -INFINITY) a.z = (a.mx == -INFINITY ? 0.f : a.z * expf(a.mx - m)) + (b.mx == -INFINITY ? 0.f : b.z * expf(b.mx - m));
  a.mx = m;
}

__device__ __forceinline__ ArgmaxPart shfl_part(const ArgmaxPart& p, int o) {
  return {__shfl_xor_sync(0xffffffffu, p.best, o), __shfl_xor_sync(0xffffffffu, p.id, o),
          __shfl_xor_sync(0xffffffffu, p.mx, o), __shfl_xor_sync(0xffffffffu, p.z, o),
          __shfl_xor_sync(0xffffffffu, p.x, o)};
}

// Ids [id0, id0 + V) of a row at lg + row * stride + (id - id0).
__global__ void __launch_bounds__(256) argmax_part_k(const float* lg, int stride, int V, int chunk, int id0,
                                                     const float* inv_temp, const uint64_t* keys, ArgmaxPart* parts,
                                                     int row0) {
  const int s = row0 + blockIdx.y, c = blockIdx.x;
  pdl_wait();
  pdl_launch_dependents();
  const float* r = lg + size_t(s) * stride;
  const float it = inv_temp ? inv_temp[s] : 0.f;
  const uint64_t key = it > 0.f ? keys[s] : 0;
  // score = logit (greedy) or logit / T + Gumbel noise; the raw logits feed the log-softmax. The running
  // max starts finite, so a banned logit (-inf) adds exp(-inf) = 0, not exp(-inf - -inf) = NaN.
  ArgmaxPart a = kNoPart;
  a.mx = -FLT_MAX;
  const int lo = c * chunk, hi = min(V, lo + chunk);
#pragma unroll 8
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float x = r[i];
    const float sc = it > 0.f ? x * it - __logf(-logf(stream_uniform(key, id0 + i))) : x;
    if (sc > a.best) { a.best = sc; a.id = id0 + i; a.x = x; }  // per-thread ids increase: first max kept
    if (x > a.mx) { a.z = a.z * expf(a.mx - x) + 1.f; a.mx = x; } else { a.z += expf(x - a.mx); }
  }
  for (int o = 16; o; o >>= 1) merge_part(a, shfl_part(a, o));
  __shared__ ArgmaxPart w[8];
  if ((threadIdx.x & 31) == 0) w[threadIdx.x >> 5] = a;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < int(blockDim.x >> 5); ++i) merge_part(a, w[i]);
    parts[size_t(s) * gridDim.x + c] = a;
  }
}

// One warp per row: merge the row's chunks of every rank (parts [ranks][S][nchunks], at most
// kArgmaxMaxChunks a row; lane l takes l, l + 32, ..., all loaded first). Ties go to the lowest id
// whatever the order, so every rank picks the same.
__global__ void argmax_merge_k(int ranks, int S, int nchunks, const ArgmaxPart* parts, int32_t* tok, float* lp,
                               int32_t* tok_dev, int row0) {
  const int s = row0 + blockIdx.x, lane = threadIdx.x;
  pdl_wait();
  pdl_launch_dependents();
  constexpr int kPer = kArgmaxMaxChunks / 32;
  ArgmaxPart q[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int f = lane + 32 * u, rk = f / nchunks, c = f % nchunks;
    q[u] = rk < ranks ? parts[(size_t(rk) * S + s) * nchunks + c] : kNoPart;
  }
  ArgmaxPart a = q[0];
#pragma unroll
  for (int u = 1; u < kPer; ++u) merge_part(a, q[u]);
  for (int o = 16; o; o >>= 1) merge_part(a, shfl_part(a, o));
  if (lane == 0) {
    tok[s] = a.id;
    lp[s] = a.x - a.mx - logf(a.z);
    if (tok_dev) tok_dev[s] = a.id;
  }
}

__global__ void adjust_logits_k(float* lg, int stride, int id0, int n_ids, const int32_t* adj, int s0, int S) {
  pdl_wait();
  pdl_launch_dependents();
  const int n = adj[0];
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int32_t* e = adj + 1 + kAdjustWords * i;
    const int s = e[0] - s0, id = e[1] - id0;
    if (s < 0 || s >= S || id < 0 || id >= n_ids) continue;
    const float add = __int_as_float(e[2]), rep = __int_as_float(e[3]), sub = __int_as_float(e[4]);
    float* x = lg + size_t(s) * stride + id;
    float l = *x;  // one entry an (s, id): no other thread writes it
    // Rounded ops, never contracted into an FMA: the host's adjust_row_logits bit for bit.
    if (add != 0.f) l = __fadd_rn(l, add);
    if (rep != 1.f) l = l > 0.f ? __fdiv_rn(l, rep) : __fmul_rn(l, rep);
    if (sub != 0.f) l = __fsub_rn(l, sub);
    *x = l;
  }
}

__global__ void mask_logits_k(float* lg, int stride, int id0, int n_ids, const int32_t* mask, int slots, int words,
                              int s0, int S) {
  pdl_wait();
  pdl_launch_dependents();
  const int k = blockIdx.y;
  if (k >= mask[0]) return;
  const int s = mask[1 + k] - s0;
  if (s < 0 || s >= S) return;
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(mask + 1 + slots) + size_t(k) * words;
  float* row = lg + size_t(s) * stride;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_ids; i += gridDim.x * blockDim.x) {
    const int id = id0 + i;
    if (id >= words * 32 || !(bits[id >> 5] >> (id & 31) & 1u)) row[i] = -INFINITY;  // (a slice's padding too)
  }
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

void launch_embed_bf16(const uint16_t* e, const int32_t* t, float* x, int M, int H, cudaStream_t s,
                       const int32_t* picked) {
  embed_k<<<M, 256, 0, s>>>(e, t, picked, x, H);
}
void launch_rmsnorm_bf16(const float* x, const int32_t* rows, const uint16_t* g, uint16_t* y, int M, int H, float eps,
                         cudaStream_t s) {
  rmsnorm_k<<<M, 256, 0, s>>>(x, rows, g, y, H, eps);
}
void launch_rope_kv(const RopeKvParams& p, cudaStream_t s) {
  require_kv(p.kv, "rope_kv");
  if (p.M <= 0) return;
  const int items = (p.Hq + p.Hkv) * (p.D / 2) + p.Hkv * p.D;
  rope_kv_k<<<dim3(p.M, (items + 255) / 256), 256, 0, s>>>(p);
}
void launch_topk_softmax(const float* lg, int32_t* idx, float* w, int M, int E, int k, cudaStream_t s) {
  if (M <= 0) return;
  topk_k<<<(M + 7) / 8, 256, 0, s>>>(lg, idx, w, M, E, k);
}
void launch_argmax_parts(const float* lg, int S, int stride, int V_limit, int id0, int nchunks, float* scratch,
                         cudaStream_t s, const float* inv_temp, const uint64_t* key) {
  if (S <= 0) return;
  if (nchunks < 1 || nchunks > kArgmaxMaxChunks) throw_error("argmax: 1 to 128 chunks a row");
  const int chunk = (V_limit + nchunks - 1) / nchunks;
  auto* parts = reinterpret_cast<ArgmaxPart*>(scratch);
  for (int r0 = 0; r0 < S; r0 += 65535) {  // grid.y limit
    const int n = std::min(S - r0, 65535);
    launch_pdl(argmax_part_k, dim3(nchunks, n), dim3(256), 0, s, lg, stride, V_limit, chunk, id0, inv_temp, key,
               parts, r0);
  }
}
void launch_argmax_merge(const float* scratch, int ranks, int S, int nchunks, int32_t* tok, float* lp, cudaStream_t s,
                         int32_t* tok_dev) {
  if (S <= 0) return;
  if (ranks < 1 || nchunks < 1 || ranks * nchunks > kArgmaxMaxChunks) throw_error("argmax: at most 128 partials a row");
  const auto* parts = reinterpret_cast<const ArgmaxPart*>(scratch);
  for (int r0 = 0; r0 < S; r0 += 65535)
    launch_pdl(argmax_merge_k, dim3(std::min(S - r0, 65535)), dim3(32), 0, s, ranks, S, nchunks, parts, tok, lp,
               tok_dev, r0);
}
void launch_argmax_logprob(const float* lg, int S, int V, int V_limit, int32_t* tok, float* lp, float* scratch,
                           cudaStream_t s, const float* inv_temp, const uint64_t* key, int32_t* tok_dev) {
  const int nchunks = argmax_chunks(V_limit);
  launch_argmax_parts(lg, S, V, V_limit, 0, nchunks, scratch, s, inv_temp, key);
  launch_argmax_merge(scratch, 1, S, nchunks, tok, lp, s, tok_dev);
}
void launch_mask_logits(float* logits, int stride, int id0, int n_ids, const int32_t* mask, int slots, int words,
                        int s0, int S, cudaStream_t s) {
  // 16 CTAs a slot over the vocabulary; slots past the step's count, or of rows outside [s0, s0 + S) (a
  // decode chunk), return at once.
  if (S > 0 && slots > 0)
    launch_pdl(mask_logits_k, dim3(16, slots), dim3(256), 0, s, logits, stride, id0, n_ids, mask, slots, words, s0, S);
}

void launch_adjust_logits(float* logits, int stride, int id0, int n_ids, const int32_t* adj, int s0, int S,
                          cudaStream_t s) {
  // The count is read on the device (a graph replays any list): 8 CTAs cover a wide step's lists.
  // A CTA a sampled row (at least 8, at most 256): a penalized row has an entry an id of its history.
  if (S > 0) launch_pdl(adjust_logits_k, dim3(std::clamp(S, 8, 256)), dim3(256), 0, s, logits, stride, id0, n_ids, adj, s0, S);
}
void launch_fill_random_bf16(uint16_t* p, size_t n, float scale, float offset, uint64_t seed, cudaStream_t s) {
  fill_bf16_k<<<1024, 256, 0, s>>>(p, n, scale, offset, seed);
}
void launch_fill_random_u8(uint8_t* p, size_t n, uint8_t lo, uint8_t span, uint64_t seed, cudaStream_t s) {
  fill_u8_k<<<1024, 256, 0, s>>>(p, n, lo, span, seed);
}

}  // namespace mx::cuda
