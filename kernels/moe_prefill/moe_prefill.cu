#include "kernels/moe_prefill/moe_prefill.h"

#include <cuda_bf16.h>
#include <string>

#include "kernels/common/async_copy.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/mma_tile.cuh"

namespace mx::cuda {
namespace {
using mma::e8m0_mult;
using mma::mma_16816;

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

constexpr int kRouteThreads = 256, kRouteMaxE = 1024;

// Exclusive prefix of v over the block (kRouteThreads threads); total: the sum over the block.
__device__ __forceinline__ int block_exclusive_scan(int v, int* warp_tot, int& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_tot[warp] = x;
  __syncthreads();
  int before = 0;
  total = 0;
  for (int w = 0; w < kRouteThreads / 32; ++w) {
    before += w < warp ? warp_tot[w] : 0;
    total += warp_tot[w];
  }
  __syncthreads();  // warp_tot is free again
  return before + x - v;
}

// One block (256 threads) per expert: stable compaction of that expert's entries in (token, slot) order.
// The experts' offsets and (block 0) the tile list come from a parallel scan of the counts: one thread
// walking them was a chain of serial L2 reads (docs/perf.md, session 31).
__global__ void __launch_bounds__(kRouteThreads) route_scatter_kernel(MoeRouteParams p) {
  __shared__ int warp_cnt[kRouteThreads / 32], warp_tot[kRouteThreads / 32];
  __shared__ int base;
  const int e = blockIdx.x, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // Thread tid holds experts [x0, x1): their rows and (held experts) tiles.
  const int per = (p.E + kRouteThreads - 1) / kRouteThreads, x0 = min(p.E, tid * per), x1 = min(p.E, x0 + per);
  int cnt[kRouteMaxE / kRouteThreads], rows = 0, tiles = 0;
#pragma unroll
  for (int j = 0; j < kRouteMaxE / kRouteThreads; ++j) {
    const int x = x0 + j;
    cnt[j] = x < x1 ? p.counts[x] : 0;
    rows += cnt[j];
    const bool held = x >= p.expert_lo && x < p.expert_hi;
    tiles += held ? (cnt[j] + p.tile_rows - 1) / p.tile_rows : 0;
  }
  int all_rows = 0, all_tiles = 0;
  int o = block_exclusive_scan(rows, warp_tot, all_rows);
  int n = block_exclusive_scan(tiles, warp_tot, all_tiles);
#pragma unroll
  for (int j = 0; j < kRouteMaxE / kRouteThreads; ++j) {
    const int x = x0 + j;
    if (x >= x1) break;
    if (x == e) {
      base = o;
      p.offsets[e] = o;
    }
    if (e == 0 && x >= p.expert_lo && x < p.expert_hi)
      for (int r = 0; r < cnt[j] && n < p.max_tiles; r += p.tile_rows, ++n) {
        p.tile_expert[n] = x;
        p.tile_row0[n] = o + r;
      }
    o += cnt[j];
  }
  if (e == 0 && tid == 0) {
    p.offsets[p.E] = all_rows;
    *p.num_tiles = min(all_tiles, p.max_tiles);
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

// ---- grouped GEMM: mma.sync m16n8k16 with the weights as the 16-row A operand ("swap AB") ----
// CTA = 6 warps = 192 weight rows x one expert tile of kTok sorted rows; each warp owns 32 weight rows
// (two m16 tiles) against all the tile's token columns, so every MXFP4 byte is dequantized once per
// CTA, in registers. K advances kStep values (kStep / 32 MXFP4 groups, kStep / 2 contiguous bytes per
// weight row) per stage through a kStages-deep cp.async pipeline; the E8M0 scales of the whole slab
// (192 rows, contiguous in memory) arrive with the first stage.
// A fragment rows g / g+8 of m16 tile i are weight rows 16i + 2g and 16i + 2g + 1: for FC1 that is
// the gate / linear pair of one SwiGLU output, so the activation is computed in registers.
// Two shapes: prefill tiles (64 rows, 4 stages, two CTAs an SM) and sparse tiles (16 rows: with few
// tokens the kernel is all weight streaming, and 6 stages with three CTAs an SM keep the most bytes in
// flight; docs/perf.md has the shapes tried).
constexpr int kWarps = 6, kThreads = 32 * kWarps, kRowsW = 32 * kWarps;

template <int kTok_, int kStep_, int kStages_, int kMinBlocks_>
struct MoeShape {
  static constexpr int kTok = kTok_, kStep = kStep_, kStages = kStages_, kMinBlocks = kMinBlocks_;
  static constexpr int kGroups = kStep / 32;  // MXFP4 groups a stage
  static constexpr int kTokLd = kStep + 8;    // token rows of 16 * odd bytes: ldmatrix conflict-free
  static constexpr size_t kWStage = size_t(kGroups) * kRowsW * 16, kXStage = size_t(kTok) * kTokLd * 2;
  static size_t smem_bytes(int K) { return kStages * (kWStage + kXStage) + ((size_t(kRowsW) * (K / 32) + 15) & ~size_t(15)); }
};
using PrefillShape = MoeShape<kMoeTileRowsPrefill, 64, 4, 2>;
using SparseShape = MoeShape<kMoeTileRowsSparse, 64, 6, 3>;  // 67 KB: three CTAs an SM

// Byte t of w (two E2M1 values, low nibble first) -> bf16x2, times 2^(scale - 127). The nibble bits
// land on the bf16 exponent/mantissa so the value comes out times 2^-126 (mma::fp4_lo), and `mult`
// (2^(scale-1), from mma::e8m0_mult) restores both factors in one exact multiply.
__device__ __forceinline__ uint32_t fp4_pair(uint32_t w, uint32_t sel, uint32_t mult) {
  const uint32_t u = __byte_perm(w, w >> 4, sel);  // low nibble -> bits 0-3, high nibble -> bits 16-19
  const uint32_t b = mma::fp4_lo(u);
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(b), "r"(mult), "r"(0x80008000u));
  return d;
}
// Weight rows sit in 16-byte slots; flipping bit 0 of the slot for rows 8..15 of every 16 spreads
// the eight rows a fragment load touches (all even or all odd) over all 32 banks.
__device__ __forceinline__ int wslot(int r) { return r ^ ((r >> 3) & 1); }

template <bool kFc1, class Sh>
__global__ void __launch_bounds__(kThreads, Sh::kMinBlocks) moe_mma_k(MoeGemmPrefillParams p) {
  constexpr int kTok = Sh::kTok, kStep = Sh::kStep, kStages = Sh::kStages, kGroups = Sh::kGroups, kTokLd = Sh::kTokLd;
  extern __shared__ __align__(16) uint8_t smem[];
  const int tile = blockIdx.x;
  if (tile >= *p.num_tiles) return;
  const int e = p.tile_expert[tile], row0 = p.tile_row0[tile];
  const int rows = min(kTok, p.offsets[e + 1] - row0);
  const int n0 = blockIdx.y * kRowsW, G = p.K / 32, nsteps = p.K / kStep;
  uint8_t* wsm = smem;                                                          // [stage][group][kRowsW][16]
  uint16_t* xsm = reinterpret_cast<uint16_t*>(smem + kStages * Sh::kWStage);    // [stage][kTok][kTokLd]
  uint8_t* ssm = smem + kStages * (Sh::kWStage + Sh::kXStage);                  // [kRowsW][G]
  const int tid = threadIdx.x;
  const uint8_t* wbase = p.blocks + size_t(e) * p.N * G * 16;

  // Per-thread copy assignments (fixed over K): kGroups weight chunks (a row's run of kStep / 2
  // bytes goes to kGroups adjacent threads), the token chunks of the tile's rows.
  const uint8_t* wsrc[kGroups];
  int wdst[kGroups];
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
    const int c = tid + i * kThreads, r = c / kGroups, q = c % kGroups;
    wsrc[i] = wbase + (size_t(min(n0 + r, p.N - 1)) * G + q) * 16;
    wdst[i] = (q * kRowsW + wslot(r)) * 16;
  }
  // Only the tile's rows are copied: a sparse tile would otherwise move more token bytes than weight
  // bytes. Rows past `rows` hold stale values; they feed only accumulator columns never written.
  constexpr int kRowChunks = kStep / 8, kXChunks = kTok * kRowChunks, kXPer = (kXChunks + kThreads - 1) / kThreads;
  const uint16_t* xsrc[kXPer];
  int xdst[kXPer];
#pragma unroll
  for (int i = 0; i < kXPer; ++i) {
    const int c = tid + i * kThreads, r = c / kRowChunks, ch = c % kRowChunks;
    const bool valid = c < kXChunks && r < rows;
    const int src_row = !valid ? 0 : kFc1 ? p.sorted_tok[row0 + r] : row0 + r;
    xsrc[i] = valid ? p.x + size_t(src_row) * p.K + ch * 8 : nullptr;
    xdst[i] = r * kTokLd + ch * 8;
  }
  auto load_stage = [&](int ks, int st) {
#pragma unroll
    for (int i = 0; i < kGroups; ++i) cp_async16(wsm + st * Sh::kWStage + wdst[i], wsrc[i] + ks * (kStep / 2));
#pragma unroll
    for (int i = 0; i < kXPer; ++i)
      if (xsrc[i]) cp_async16(xsm + st * (Sh::kXStage / 2) + xdst[i], xsrc[i] + ks * kStep);
  };
  {  // the slab's scales, kRowsW rows of G bytes contiguous in memory, in the first stage's group
    const uint8_t* sc = p.scales + (size_t(e) * p.N + n0) * G;
    const int bytes = min(kRowsW, p.N - n0) * G;  // rows past N keep stale scales: their outputs are dropped
    if ((reinterpret_cast<uintptr_t>(sc) & 15) == 0 && bytes % 16 == 0)
      for (int i = tid * 16; i < bytes; i += kThreads * 16) cp_async16(ssm + i, sc + i);
    else  // G is even, so rows start on 2 bytes; other shapes (tests) take the slow path
      for (int i = tid; i < bytes; i += kThreads) ssm[i] = sc[i];
  }
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nsteps) load_stage(s, s);
    cp_async_commit();
  }

  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const uint32_t sel = uint32_t(t) | (uint32_t(t + 4) << 8);
  constexpr int kN8 = kTok / 8;
  const int ntv = (rows + 7) >> 3;  // n8 token tiles holding valid rows (warp-uniform)
  float acc[2][kN8][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < kN8; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
  // ldmatrix.x4 lane roles: matrix lane/8 = (token tile +0/+1, k chunk +0/+1), row lane%8.
  const int lm_tok = ((lane >> 4) << 3) + (lane & 7), lm_chunk = (lane >> 3) & 1;
  int ra[2];
  for (int i = 0; i < 2; ++i) ra[i] = 32 * warp + 16 * i + 2 * g;

  for (int ks = 0; ks < nsteps; ++ks) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (ks + kStages - 1 < nsteps) load_stage(ks + kStages - 1, (ks + kStages - 1) % kStages);
    cp_async_commit();
    const int st = ks % kStages;
    const uint8_t* wst = wsm + st * Sh::kWStage;
    const uint16_t* xst = xsm + st * (Sh::kXStage / 2);
#pragma unroll
    for (int q = 0; q < kGroups; ++q) {
      uint4 wa[2], wb[2];
      uint32_t ma[2], mb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        wa[i] = *reinterpret_cast<const uint4*>(wst + (q * kRowsW + wslot(ra[i])) * 16);
        wb[i] = *reinterpret_cast<const uint4*>(wst + (q * kRowsW + wslot(ra[i] + 1)) * 16);
        ma[i] = e8m0_mult(ssm[ra[i] * G + kGroups * ks + q]);
        mb[i] = e8m0_mult(ssm[(ra[i] + 1) * G + kGroups * ks + q]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // k16 half of the group: 8-value chunks 2h, 2h+1
        uint32_t b[kN8][2];
#pragma unroll
        for (int jp = 0; jp < kN8 / 2; ++jp)
          if (2 * jp < ntv)
            ldmatrix_x4(b[2 * jp][0], b[2 * jp][1], b[2 * jp + 1][0], b[2 * jp + 1][1],
                        xst + (16 * jp + lm_tok) * kTokLd + q * 32 + (2 * h + lm_chunk) * 8);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint32_t wa0 = h ? wa[i].z : wa[i].x, wa1 = h ? wa[i].w : wa[i].y;
          const uint32_t wb0 = h ? wb[i].z : wb[i].x, wb1 = h ? wb[i].w : wb[i].y;
          const uint32_t a0 = fp4_pair(wa0, sel, ma[i]), a1 = fp4_pair(wb0, sel, mb[i]);
          const uint32_t a2 = fp4_pair(wa1, sel, ma[i]), a3 = fp4_pair(wb1, sel, mb[i]);
#pragma unroll
          for (int j = 0; j < kN8; ++j)
            if (j < ntv) mma_16816(acc[i][j], a0, a1, a2, a3, b[j][0], b[j][1]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: acc[i][j] = rows (ra, ra+1) x tokens (8j + 2t, 8j + 2t + 1).
  const __nv_bfloat16* bias = reinterpret_cast<const __nv_bfloat16*>(p.bias) + size_t(e) * p.N;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int n = n0 + ra[i];
    if (n >= p.N) continue;
    const float b0 = __bfloat162float(bias[n]), b1 = __bfloat162float(bias[n + 1]);
#pragma unroll
    for (int j = 0; j < kN8; ++j)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int r = 8 * j + 2 * t + u;
        if (r >= rows) continue;
        const float y0 = acc[i][j][u] + b0, y1 = acc[i][j][2 + u] + b1;
        if constexpr (kFc1) {
          const float gate = fminf(y0, p.limit), up = fminf(fmaxf(y1, -p.limit), p.limit);
          const float a = gate / (1.f + __expf(-p.alpha * gate)) * (up + 1.f);
          reinterpret_cast<__nv_bfloat16*>(p.act)[size_t(row0 + r) * (p.N / 2) + n / 2] = __float2bfloat16(a);
        } else {
          const float w = p.sorted_w[row0 + r];
          *reinterpret_cast<float2*>(p.y_slot + size_t(p.sorted_slot[row0 + r]) * p.N + n) = make_float2(y0 * w, y1 * w);
        }
      }
  }
}

// A thread an element (grid: tokens x H / 256): a wide decode step's few tokens would otherwise give each
// thread a chain of dependent round trips along the row.
__global__ void moe_combine_kernel(const float* y, float* resid, int k, int H, const int32_t* idx, int lo, int hi) {
  const int t = blockIdx.x, h = blockIdx.y * blockDim.x + threadIdx.x;
  if (h >= H) return;
  float s = 0.f;
  for (int j = 0; j < k; ++j) {
    const int e = idx ? idx[size_t(t) * k + j] : lo;
    if (e >= lo && e < hi) s += y[(size_t(t) * k + j) * H + h];
  }
  resid[size_t(t) * H + h] += s;
}
}  // namespace

void moe_route_prefill(const MoeRouteParams& p, cudaStream_t s) {
  if (p.T <= 0) return;
  if (p.E > kRouteMaxE) throw_error("moe route: at most 1024 experts");
  route_count_kernel<<<p.E, 256, 0, s>>>(p);
  route_scatter_kernel<<<p.E, kRouteThreads, 0, s>>>(p);
}

// Grid x walks the tile list (the tiles of one expert are adjacent, so they share the expert's
// weights in L2); blocks past *num_tiles exit at once. Grid y: 192-row slices of the weights.
template <bool kFc1, class Sh>
static void launch_moe_mma(const MoeGemmPrefillParams& p, cudaStream_t s) {
  const size_t smem = Sh::smem_bytes(p.K);
  // The opt-in belongs to the device: once per device, up to the device's limit (any K).
  static std::atomic<unsigned long long> ready{0};
  once_per_device(ready, [] {
    MX_CUDA(cudaFuncSetAttribute(moe_mma_k<kFc1, Sh>, cudaFuncAttributeMaxDynamicSharedMemorySize, device_smem_optin()));
  });
  moe_mma_k<kFc1, Sh><<<dim3(p.max_tiles, (p.N + kRowsW - 1) / kRowsW), kThreads, smem, s>>>(p);
  MX_CUDA(cudaGetLastError());
}

template <bool kFc1>
static void launch_moe(const MoeGemmPrefillParams& p, cudaStream_t s) {
  if (p.max_tiles <= 0) return;
  static_assert(PrefillShape::kStep == 64 && SparseShape::kStep == 64, "K % 64 == 0 is what the check asks");
  if (p.K % 64 || p.N % 2) throw_error("moe prefill: K must be a multiple of 64 and N even");
  if (p.tile_rows == kMoeTileRowsSparse) launch_moe_mma<kFc1, SparseShape>(p, s);
  else if (p.tile_rows == kMoeTileRowsPrefill) launch_moe_mma<kFc1, PrefillShape>(p, s);
  else throw_error("moe prefill: tile_rows must be 16 or 64");
}

void moe_fc1_prefill(const MoeGemmPrefillParams& p, cudaStream_t s) { launch_moe<true>(p, s); }
void moe_fc2_prefill(const MoeGemmPrefillParams& p, cudaStream_t s) { launch_moe<false>(p, s); }
void moe_combine_prefill(const float* y_slot, float* resid, int T, int k, int H, cudaStream_t s,
                         const int32_t* topk_idx, int expert_lo, int expert_hi) {
  if (T <= 0) return;
  moe_combine_kernel<<<dim3(T, (H + 255) / 256), 256, 0, s>>>(y_slot, resid, k, H, topk_idx, expert_lo, expert_hi);
}

}  // namespace mx::cuda
