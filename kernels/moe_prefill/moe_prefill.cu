#include "kernels/moe_prefill/moe_prefill.h"

#include <cuda_bf16.h>
#include <mma.h>

namespace mx::cuda {
namespace {
using namespace nvcuda;
constexpr int TM = kMoePrefillTileM, TN = 64, TK = 32, LDA = TK + 8, LDC = TN + 4;

__global__ void route_count_kernel(MoeRouteParams p) {
  __shared__ int warp_sum[8];
  const int e = blockIdx.x;
  int c = 0;
  for (int i = threadIdx.x; i < p.T * p.k; i += blockDim.x) c += p.topk_idx[i] == e;
  for (int o = 16; o; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = c;
  __syncthreads();
  if (threadIdx.x == 0) {
    int t = 0;
    for (int w = 0; w < blockDim.x / 32; ++w) t += warp_sum[w];
    p.counts[e] = t;
  }
}

// One block (256 threads) per expert: stable compaction of that expert's entries in (token, slot) order.
__global__ void route_scatter_kernel(MoeRouteParams p) {
  __shared__ int warp_cnt[8];
  __shared__ int base;
  const int e = blockIdx.x, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    int off = 0;
    for (int i = 0; i < e; ++i) off += p.counts[i];
    base = off;
    p.offsets[e] = off;
    if (e == p.E - 1) p.offsets[p.E] = off + p.counts[e];
    if (e == 0) {  // tile list over all experts (E is small)
      int n = 0, o = 0;
      for (int x = 0; x < p.E; ++x) {
        for (int r = 0; r < p.counts[x] && n < p.max_tiles; r += TM) { p.tile_expert[n] = x; p.tile_row0[n] = o + r; ++n; }
        o += p.counts[x];
      }
      *p.num_tiles = n;
    }
  }
  __syncthreads();
  const int total = p.T * p.k;
  for (int c0 = 0; c0 < total; c0 += blockDim.x) {
    const int i = c0 + tid;
    const bool hit = i < total && p.topk_idx[i] == e;
    const unsigned b = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warp_cnt[warp] = __popc(b);
    __syncthreads();
    int before = 0, all = 0;
    for (int w = 0; w < blockDim.x / 32; ++w) { before += w < warp ? warp_cnt[w] : 0; all += warp_cnt[w]; }
    if (hit) {
      const int r = base + before + __popc(b & ((1u << lane) - 1));
      p.sorted_tok[r] = i / p.k;
      p.sorted_slot[r] = i;
      p.sorted_w[r] = p.topk_w[i];
    }
    __syncthreads();
    if (tid == 0) base += all;
    __syncthreads();
  }
}

__device__ __forceinline__ float fp4_val(unsigned v) {
  const float lut[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  const float m = lut[v & 7];
  return (v & 8) ? -m : m;
}

// C[64 x 64] tile = X_rows . W[e][n0:n0+64]^T (fp32 in Cs). Returns rows valid in the tile (0 = skip).
template <bool kGather>
__device__ __forceinline__ int moe_tile_mma(const MoeGemmPrefillParams& p, int tile, int n0, int& e_out, int& row0_out,
                                            __nv_bfloat16* As, __nv_bfloat16* Bs, float* Cs) {
  const int e = p.tile_expert[tile], row0 = p.tile_row0[tile];
  const int rows = min(TM, p.offsets[e + 1] - row0);
  e_out = e; row0_out = row0;
  const int tid = threadIdx.x, warp = tid / 32, wr = warp / 2, wc = warp % 2;
  const int G = p.K / 32;
  const uint8_t* wb = p.blocks + (size_t(e) * p.N + n0) * G * 16;
  const uint8_t* ws = p.scales + (size_t(e) * p.N + n0) * G;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  // Per-thread fixed source rows for the A loads (2 x 16-byte chunks per thread per K step).
  const __nv_bfloat16* arow[2];
  for (int q = 0; q < 2; ++q) {
    const int idx = tid + q * 128, r = idx / 4;
    arow[q] = nullptr;
    if (r < rows) {
      const int src = kGather ? p.sorted_tok[row0 + r] : row0 + r;
      arow[q] = reinterpret_cast<const __nv_bfloat16*>(p.x) + size_t(src) * p.K + (idx % 4) * 8;
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int q = 0; q < 2; ++q) {
      const int idx = tid + q * 128, r = idx / 4, c = (idx % 4) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (arow[q]) v = *reinterpret_cast<const uint4*>(arow[q] + g * TK);
      *reinterpret_cast<uint4*>(As + r * LDA + c) = v;
    }
    {  // dequantize 64 rows x 32 of MXFP4: thread = (row n, half): 8 bytes -> 16 bf16
      const int n = tid / 2, half = tid % 2;
      const uint2 raw = *reinterpret_cast<const uint2*>(wb + (size_t(n) * G + g) * 16 + half * 8);
      const float sc = exp2f(float(int(ws[size_t(n) * G + g]) - 127));
      const unsigned words[2] = {raw.x, raw.y};
      __align__(16) __nv_bfloat16 vals[16];
      for (int w = 0; w < 2; ++w)
        for (int b = 0; b < 4; ++b) {
          const unsigned byte = (words[w] >> (8 * b)) & 0xff;
          vals[w * 8 + b * 2] = __float2bfloat16(fp4_val(byte & 0xf) * sc);
          vals[w * 8 + b * 2 + 1] = __float2bfloat16(fp4_val(byte >> 4) * sc);
        }
      uint4* dst = reinterpret_cast<uint4*>(Bs + n * LDA + half * 16);
      dst[0] = reinterpret_cast<const uint4*>(vals)[0];
      dst[1] = reinterpret_cast<const uint4*>(vals)[1];
    }
    __syncthreads();
    for (int kk = 0; kk < TK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b[2];
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], As + (wr * 32 + i * 16) * LDA + kk, LDA);
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], Bs + (wc * 32 + j * 16) * LDA + kk, LDA);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(Cs + (wr * 32 + i * 16) * LDC + wc * 32 + j * 16, acc[i][j], LDC, wmma::mem_row_major);
  __syncthreads();
  return rows;
}

struct __align__(128) TileSmem {
  __nv_bfloat16 As[TM * LDA];
  __nv_bfloat16 Bs[TN * LDA];
  float Cs[TM * LDC];
};

__global__ void __launch_bounds__(128) moe_fc1_kernel(MoeGemmPrefillParams p) {
  __shared__ TileSmem sm;
  const int n0 = blockIdx.x * TN;
  for (int tile = blockIdx.y; tile < *p.num_tiles; tile += gridDim.y) {
    int e, row0;
    const int rows = moe_tile_mma<true>(p, tile, n0, e, row0, sm.As, sm.Bs, sm.Cs);
    const int I = p.N / 2;
    const __nv_bfloat16* bias = reinterpret_cast<const __nv_bfloat16*>(p.bias) + size_t(e) * p.N + n0;
    for (int idx = threadIdx.x; idx < TM * TN / 2; idx += blockDim.x) {
      const int r = idx / (TN / 2), i = idx % (TN / 2);
      if (r >= rows) continue;
      float gate = sm.Cs[r * LDC + 2 * i] + __bfloat162float(bias[2 * i]);
      float up = sm.Cs[r * LDC + 2 * i + 1] + __bfloat162float(bias[2 * i + 1]);
      gate = fminf(gate, p.limit);
      up = fminf(fmaxf(up, -p.limit), p.limit);
      const float a = gate / (1.f + __expf(-p.alpha * gate)) * (up + 1.f);
      reinterpret_cast<__nv_bfloat16*>(p.act)[size_t(row0 + r) * I + n0 / 2 + i] = __float2bfloat16(a);
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(128) moe_fc2_kernel(MoeGemmPrefillParams p) {
  __shared__ TileSmem sm;
  const int n0 = blockIdx.x * TN;
  for (int tile = blockIdx.y; tile < *p.num_tiles; tile += gridDim.y) {
    int e, row0;
    const int rows = moe_tile_mma<false>(p, tile, n0, e, row0, sm.As, sm.Bs, sm.Cs);
    const __nv_bfloat16* bias = reinterpret_cast<const __nv_bfloat16*>(p.bias) + size_t(e) * p.N + n0;
    for (int idx = threadIdx.x; idx < TM * TN; idx += blockDim.x) {
      const int r = idx / TN, c = idx % TN;
      if (r >= rows) continue;
      const float y = (sm.Cs[r * LDC + c] + __bfloat162float(bias[c])) * p.sorted_w[row0 + r];
      p.y_slot[size_t(p.sorted_slot[row0 + r]) * p.N + n0 + c] = y;
    }
    __syncthreads();
  }
}

__global__ void moe_combine_kernel(const float* y, float* resid, int k, int H) {
  const int t = blockIdx.x;
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    float s = 0.f;
    for (int j = 0; j < k; ++j) s += y[(size_t(t) * k + j) * H + h];
    resid[size_t(t) * H + h] += s;
  }
}
}  // namespace

void moe_route_prefill(const MoeRouteParams& p, cudaStream_t s) {
  if (p.T <= 0) return;
  route_count_kernel<<<p.E, 256, 0, s>>>(p);
  route_scatter_kernel<<<p.E, 256, 0, s>>>(p);
}

// Grid y covers the worst-case tile count; blocks past *num_tiles exit at once.
void moe_fc1_prefill(const MoeGemmPrefillParams& p, cudaStream_t s) {
  if (p.max_tiles <= 0) return;
  moe_fc1_kernel<<<dim3(p.N / TN, p.max_tiles), 128, 0, s>>>(p);
}
void moe_fc2_prefill(const MoeGemmPrefillParams& p, cudaStream_t s) {
  if (p.max_tiles <= 0) return;
  moe_fc2_kernel<<<dim3(p.N / TN, p.max_tiles), 128, 0, s>>>(p);
}
void moe_combine_prefill(const float* y_slot, float* resid, int T, int k, int H, cudaStream_t s) {
  if (T <= 0) return;
  moe_combine_kernel<<<T, 256, 0, s>>>(y_slot, resid, k, H);
}

}  // namespace mx::cuda
