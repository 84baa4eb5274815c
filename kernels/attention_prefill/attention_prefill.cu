#include "kernels/attention_prefill/attention_prefill.h"

#include <cuda_bf16.h>
#include <mma.h>

namespace mx::cuda {
namespace {
using namespace nvcuda;
constexpr int BQ = 64, BK = 64, D = 64, LDH = D + 8, LDF = BK + 4;

// One block = 64 queries x one q head; 4 warps, each owns 16 query rows.
__global__ void __launch_bounds__(128) attn_prefill_kernel(AttnPrefillParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* Ks = Qs + BQ * LDH;
  __nv_bfloat16* Vs = Ks + BK * LDH;
  __nv_bfloat16* Ps = Vs + BK * LDH;
  float* Ss = reinterpret_cast<float*>(Ps + BQ * LDH);
  float* Os = Ss + BQ * LDF;
  float* row_m = Os + BQ * LDF;
  float* row_l = row_m + BQ;

  const int h = blockIdx.y, kvh = h / (p.Hq / p.Hkv);
  const int q0 = blockIdx.x * BQ;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const float sink = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p.sinks)[h]);

  for (int i = tid; i < BQ * D / 8; i += 128) {
    int r = i / (D / 8), c = (i % (D / 8)) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (q0 + r < p.T) v = *reinterpret_cast<const uint4*>(p.q + size_t(q0 + r) * p.q_stride + h * D + c);
    *reinterpret_cast<uint4*>(Qs + r * LDH + c) = v;
  }
  for (int i = tid; i < BQ * LDF; i += 128) Os[i] = 0.f;
  if (tid < BQ) { row_m[tid] = sink; row_l[tid] = 1.f; }

  const int pmin = p.start + q0;
  const int pmax = p.start + min(q0 + BQ, p.T) - 1;
  int kbeg = p.window > 0 ? max(0, pmin - p.window + 1) : 0;
  kbeg = (kbeg / BK) * BK;
  for (int k0 = kbeg; k0 <= pmax; k0 += BK) {
    __syncthreads();
    for (int i = tid; i < BK * D / 8; i += 128) {
      int r = i / (D / 8), c = (i % (D / 8)) * 8;
      int j = k0 + r;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
      if (j <= pmax) {
        size_t row = size_t(p.block_table[j / p.block_size]) * p.block_size + j % p.block_size;
        size_t off = (row * p.Hkv + kvh) * D + c;
        kv = *reinterpret_cast<const uint4*>(p.k_cache + off);
        vv = *reinterpret_cast<const uint4*>(p.v_cache + off);
      }
      *reinterpret_cast<uint4*>(Ks + r * LDH + c) = kv;
      *reinterpret_cast<uint4*>(Vs + r * LDH + c) = vv;
    }
    __syncthreads();
    {  // S = Q K^T for this warp's 16 rows
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4];
      for (int n = 0; n < 4; ++n) wmma::fill_fragment(acc[n], 0.f);
      for (int kk = 0; kk < D; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::load_matrix_sync(a, Qs + warp * 16 * LDH + kk, LDH);
        for (int n = 0; n < 4; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
          wmma::load_matrix_sync(b, Ks + n * 16 * LDH + kk, LDH);
          wmma::mma_sync(acc[n], a, b, acc[n]);
        }
      }
      for (int n = 0; n < 4; ++n)
        wmma::store_matrix_sync(Ss + warp * 16 * LDF + n * 16, acc[n], LDF, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax: lane owns columns lane and lane + 32 of each of the warp's rows.
    for (int rr = 0; rr < 16; ++rr) {
      const int r = warp * 16 + rr, pos = p.start + q0 + r;
      float s[2];
      float mx = -INFINITY;
      for (int c2 = 0; c2 < 2; ++c2) {
        int j = k0 + lane + 32 * c2;
        bool ok = (q0 + r < p.T) && j <= pos && (p.window == 0 || j > pos - p.window);
        s[c2] = ok ? Ss[r * LDF + lane + 32 * c2] * p.scale : -INFINITY;
        mx = fmaxf(mx, s[c2]);
      }
      for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = row_m[r], m_new = fmaxf(m_old, mx);
      float sum = 0.f;
      for (int c2 = 0; c2 < 2; ++c2) {
        float e = s[c2] == -INFINITY ? 0.f : __expf(s[c2] - m_new);
        __nv_bfloat16 eb = __float2bfloat16(e);
        Ps[r * LDH + lane + 32 * c2] = eb;
        sum += __bfloat162float(eb);  // normalize with what P V actually uses
      }
      for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      const float alpha = __expf(m_old - m_new);
      __syncwarp();
      if (lane == 0) { row_m[r] = m_new; row_l[r] = row_l[r] * alpha + sum; }
      // Store alpha in the S row's spare column for the O rescale below.
      if (lane == 0) Ss[r * LDF + BK] = alpha;
    }
    __syncwarp();
    {  // tmp = P V (16 x 64 per warp) into the S rows of this warp, then O = O * alpha + tmp
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4];
      for (int n = 0; n < 4; ++n) wmma::fill_fragment(acc[n], 0.f);
      for (int kk = 0; kk < BK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::load_matrix_sync(a, Ps + warp * 16 * LDH + kk, LDH);
        for (int n = 0; n < 4; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
          wmma::load_matrix_sync(b, Vs + kk * LDH + n * 16, LDH);
          wmma::mma_sync(acc[n], a, b, acc[n]);
        }
      }
      float alpha_r[16];
      for (int rr = 0; rr < 16; ++rr) alpha_r[rr] = Ss[(warp * 16 + rr) * LDF + BK];
      __syncwarp();
      for (int n = 0; n < 4; ++n)
        wmma::store_matrix_sync(Ss + warp * 16 * LDF + n * 16, acc[n], LDF, wmma::mem_row_major);
      __syncwarp();
      for (int rr = 0; rr < 16; ++rr) {
        const int r = warp * 16 + rr;
        for (int c = lane; c < D; c += 32) Os[r * LDF + c] = Os[r * LDF + c] * alpha_r[rr] + Ss[r * LDF + c];
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < BQ * D; i += 128) {
    int r = i / D, c = i % D;
    if (q0 + r < p.T)
      reinterpret_cast<__nv_bfloat16*>(p.out)[size_t(q0 + r) * p.Hq * D + h * D + c] =
          __float2bfloat16(Os[r * LDF + c] / row_l[r]);
  }
}

constexpr size_t kSmem = size_t(4) * BQ * LDH * 2 + size_t(2) * BQ * LDF * 4 + 2 * BQ * 4;
}  // namespace

void attention_prefill_bf16(const AttnPrefillParams& p, cudaStream_t s) {
  if (p.T <= 0) return;
  static bool attr_set = false;
  if (!attr_set) {
    cudaFuncSetAttribute(attn_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem));
    attr_set = true;
  }
  dim3 grid((p.T + BQ - 1) / BQ, p.Hq);
  attn_prefill_kernel<<<grid, 128, kSmem, s>>>(p);
}

}  // namespace mx::cuda
