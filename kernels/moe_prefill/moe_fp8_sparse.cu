// The FP8 MoE over sparse tiles (up to 16 or 24 sorted rows of one expert): the weights in registers, B in shared
// memory, a persistent grid of 256- or 128-row CTAs (the why of the FP8 path: moe_fp8_device.cuh).
#include <algorithm>
#include <atomic>
#include <string>

#include "kernels/common/async_copy.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/mma_tile.cuh"
#include "kernels/moe_prefill/moe_fp8_device.cuh"

namespace mx::cuda::fp8_moe {
namespace {

// kWg warpgroups of 64 weight rows over one B staging: 4 (one CTA an SM) for matrices of more than 256 rows,
// else 2 (two CTAs an SM; sparse_cta_warpgroups); kU segments of weights in flight a thread (4 beside 24-row
// tiles' wider accumulators: 5 spills there).
template <int kTile> constexpr int kUOf = kTile == 24 ? 4 : 5;
// B of a kTile-token tile (kMoeTileRowsSparse or kMoeTileRowsFp8Sparse): (hi, lo) columns of each token, one
// k32 step of them as [n/8][k half][n%8][16 bytes].
template <int kTile> constexpr int kStepBytes = 2 * kTile * 32;

#ifdef MX_WGMMA
// K-major B without swizzle: core matrices of 8 columns x 16 bytes; 128 bytes to the next k half
// (leading byte offset), 256 to the next 8 columns (stride byte offset). The low word holds the address
// in 16-byte units (a step's offset adds to it: one integer add a wgmma) and the leading offset.
__device__ __forceinline__ uint32_t b_desc_lo(uint32_t addr) { return ((addr & 0x3FFFF) >> 4) | ((128 >> 4) << 16); }
__device__ __forceinline__ uint64_t b_desc(uint32_t lo) { return uint64_t(lo) | (uint64_t(256 >> 4) << 32); }
// wgmma m64nNk32 (e4m3, A from registers, B in shared memory) for N = 2 x the accumulators a thread holds.
__device__ __forceinline__ void wgmma_rs(float (&d)[4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
__device__ __forceinline__ void wgmma_rs(float (&d)[8], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
__device__ __forceinline__ void wgmma_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
__device__ __forceinline__ void wgmma_rs(float (&d)[24], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, {%24, %25, %26, %27}, %28, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
// One segment's four k32 steps (kStep: B's bytes a step), waited for.
template <int kStep, int kAcc>
__device__ __forceinline__ void mma4(float (&acc)[kAcc], const uint32_t (&f)[4][4], uint32_t d) {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int q = 0; q < 4; ++q) wgmma_rs(acc, f[q], b_desc(d + q * (kStep >> 4)));
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
#endif

template <bool kFc1, int kWg, int kTile>
__global__ void __launch_bounds__(kWg * 128, 4 / kWg) moe_fp8_k(MoeGemmPrefillParams p) {
#ifdef MX_WGMMA
  constexpr int kThreads = kWg * 128, kRows = kWg * 64, kStep = kStepBytes<kTile>, kU = kUOf<kTile>;
  extern __shared__ __align__(128) uint8_t bsm[];
  // Persistent: a CTA walks a contiguous range of (tile, slice) items, tile-major, so its items mostly share
  // one tile's B, and the weight ring runs on into the next item's first segments (no CTA starts cold).
  const int slices = (p.N + kRows - 1) / kRows, items = *p.num_tiles * slices;
  const int i0 = int(int64_t(items) * blockIdx.x / gridDim.x);
  const int i1 = int(int64_t(items) * (blockIdx.x + 1) / gridDim.x);
  if (i0 >= i1) return;
  const int G = p.K / 32, S = (G + 3) / 4, Kp = 128 * S, steps = 4 * S;
  const int Sp = (S + kU - 1) / kU * kU;  // an item's ring positions: whole blocks of kU, the last ones empty
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // A row g of this warp is the slice's weight row r_in, row g + 8 is r_in + 1: FC1's gate / linear pair.
  const int r_in = 16 * warp + 2 * g;
  // Item i's first weight row of this thread, as an index over all experts' rows (e * N + row).
  auto item_row = [&](int i) {
    return p.tile_expert[i / slices] * p.N + min((i % slices) * kRows + r_in, p.N - 2);
  };

  uint4 wa[kU], wb[kU];
  uint32_t sa[kU], sb[kU];
  auto load = [&](int row, int s, int u) {  // row < 0: past the CTA's last item
    const int gi = 4 * s + t;
    if (row >= 0 && s < S && gi < G) {
      const uint8_t* blk = p.blocks + size_t(row) * G * 16;
      const uint8_t* sc = p.scales + size_t(row) * G;
      wa[u] = mma::ldg_stream<128>(blk + gi * 16);  // DRAM sees 128-byte reads of a row
      wb[u] = mma::ldg_stream<128>(blk + (G + gi) * 16);
      sa[u] = sc[gi];
      sb[u] = sc[G + gi];
    } else {
      wa[u] = wb[u] = make_uint4(0, 0, 0, 0);
      sa[u] = sb[u] = 0;
    }
  };
  int cur = item_row(i0);
#pragma unroll
  for (int u = 0; u < kU; ++u) load(cur, u, u);
  // The rows' largest scales, found at load (a scan of the rows' scales here was round trips a CTA); A's
  // in byte 0, B's in byte 1 (one register).
  auto smax_of = [&](int row) { return row < 0 ? 0u : uint32_t(p.row_smax[row]) | uint32_t(p.row_smax[row + 1]) << 8; };
  uint32_t smax = smax_of(cur);

  int btile = -1, row0 = 0, rows = 0;
  for (int i = i0; i < i1; ++i) {
    const int tile = i / slices, rA = (i % slices) * kRows + r_in;
    const int nxt = i + 1 < i1 ? item_row(i + 1) : -1;
    if (tile != btile) {  // uniform
      if (btile >= 0) __syncthreads();  // every warp's MMAs on the last tile's B are done
      btile = tile;
      const int e = p.tile_expert[tile];
      row0 = p.tile_row0[tile];
      rows = min(kTile, p.offsets[e + 1] - row0);
      // B: the tile's hi/lo rows over all of K. Rows past `rows` keep stale bytes: they feed only columns
      // whose outputs are dropped.
      const int chunks = rows * 2 * steps * 2;
      for (int c = tid; c < chunks; c += kThreads) {
        const int kc = c & 1, ks = (c >> 1) % steps, n = (c >> 1) / steps;
        const int src_row = kFc1 ? p.sorted_tok[row0 + (n >> 1)] : row0 + (n >> 1);
        cp_async16(bsm + ks * kStep + (n >> 3) * 256 + kc * 128 + (n & 7) * 16,
                   p.xq + size_t(src_row) * 2 * Kp + (n & 1) * Kp + ks * 32 + kc * 16);
      }
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();  // every thread's copies have landed before any zeros go over them
      // Groups past G in the last segment: their A is zero, so B must be finite there (zeros).
      const int tail = G - 4 * (S - 1);
      if (tail < 4)
        for (int c = tid; c < 4 * 2 * rows * 2 * (4 - tail); c += kThreads) {
          const int tt = tail + c % (4 - tail), r = c / (4 - tail);
          const int kc = r & 1, n = (r >> 1) % (2 * rows), q = (r >> 1) / (2 * rows);
          *reinterpret_cast<uint32_t*>(bsm + (steps - 4 + q) * kStep + (n >> 3) * 256 + kc * 128 + (n & 7) * 16 +
                                       4 * tt) = 0;
        }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncthreads();
    }

    // The MMA only as wide as the tile's tokens (2 columns a token): n8 up to 4, n16 up to 8, n32 up to 16,
    // else n48 (wn 0 / 1 / 2 / 3, uniform). Each segment's MMAs are waited for before the next one's
    // conversion: their latency is the loop's.
    const int wn = rows <= 4 ? 0 : rows <= 8 ? 1 : rows <= 16 ? 2 : 3;
    float acc[kTile];
#pragma unroll
    for (int j = 0; j < kTile; ++j) acc[j] = 0.f;
    const uint32_t d0 = b_desc_lo(smem_addr(bsm));
    for (int s0 = 0; s0 < Sp; s0 += kU) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int s = s0 + u;
        const uint4 xa = wa[u], xb = wb[u];
        const uint32_t ua = sa[u], ub = sb[u];
        // The ring position kU on: this item's, or past its end the next item's first segments.
        const bool here = s + kU < Sp;
        load(here ? cur : nxt, here ? s + kU : s + kU - Sp, u);
        if (s >= S) continue;  // uniform: an empty position at the item's end
        uint32_t la, ha, lb, hb;
        scale_luts(ua, smax & 0xFF, la, ha);
        scale_luts(ub, smax >> 8, lb, hb);
        const uint32_t A[4] = {xa.x, xa.y, xa.z, xa.w}, B[4] = {xb.x, xb.y, xb.z, xb.w};
        uint32_t f[4][4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          e2m1x8_scaled(A[q], la, ha, f[q][0], f[q][2]);
          e2m1x8_scaled(B[q], lb, hb, f[q][1], f[q][3]);
        }
        const uint32_t db = d0 + 4 * s * (kStep >> 4);
        if (wn == 0) mma4<kStep>(reinterpret_cast<float(&)[4]>(acc), f, db);
        else if (wn == 1) mma4<kStep>(reinterpret_cast<float(&)[8]>(acc), f, db);
        else if (kTile == kMoeTileRowsSparse || wn == 2) mma4<kStep>(reinterpret_cast<float(&)[16]>(acc), f, db);
        else mma4<kStep>(acc, f, db);  // n48: 24-row tiles
      }
    }

    const uint32_t nsmax = smax_of(nxt);  // its latency under the epilogue's
    if (rA < p.N) epilogue<kFc1>(p, acc, epilogue_in<kFc1, kTile / 4>(p, size_t(cur), row0, rows, t), row0, rows, rA, smax & 0xFF, smax >> 8, t);
    cur = nxt;
    smax = nsmax;
  }
#endif
}

// One 256-row CTA an SM stages B and pays the prologue once for twice the rows, and leaves L1 the shared
// memory a second CTA's B would take: on the persistent grid that pays even where the last CTA of a 2,880-row
// matrix (FC2, and FC1 under TP=2) is a quarter live (docs/perf.md, sessions 32 and 55).
int sparse_cta_warpgroups(int N) { return N > 256 ? 4 : 2; }

// A sparse CTA: kWg warpgroups, each an m64 block of weight rows, over tiles of kTile rows.
template <bool kFc1, int kWg, int kTile>
void launch_grid(const MoeGemmPrefillParams& p, int smem_optin, cudaStream_t s) {
  constexpr int rows = kWg * 64;
  const size_t smem = size_t(moe_fp8_kpad(p.K) / 32) * kStepBytes<kTile>;
  if (smem > size_t(smem_optin))
    throw_error("moe fp8: K = " + std::to_string(p.K) + " needs more shared memory than the GPU has");
  const int items = p.max_tiles * ((p.N + rows - 1) / rows);  // at most: the tile count is on the device
  // (Two 128-row CTAs of 24-row tiles do not fit an SM at K 2,880: they run as they fit; N <= 256 is a test shape.)
  const int ctas = p.max_ctas > 0 ? p.max_ctas : device_sm_count() * (4 / kWg);
  moe_fp8_k<kFc1, kWg, kTile><<<std::min(items, ctas), kWg * 128, smem, s>>>(p);
}
template <bool kFc1, int kTile>
void launch_tile(const MoeGemmPrefillParams& p, int smem_optin, cudaStream_t s) {
  if (sparse_cta_warpgroups(p.N) == 4) launch_grid<kFc1, 4, kTile>(p, smem_optin, s);
  else launch_grid<kFc1, 2, kTile>(p, smem_optin, s);
}

}  // namespace

template <bool kFc1>
void launch_sparse(const MoeGemmPrefillParams& p, int smem_optin, cudaStream_t s) {
  static std::atomic<unsigned long long> ready{0};
  once_per_device(ready, [smem_optin] {
    auto optin = [smem_optin](auto* k) { MX_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin)); };
    optin(moe_fp8_k<kFc1, 2, kMoeTileRowsSparse>);
    optin(moe_fp8_k<kFc1, 4, kMoeTileRowsSparse>);
    optin(moe_fp8_k<kFc1, 2, kMoeTileRowsFp8Sparse>);
    optin(moe_fp8_k<kFc1, 4, kMoeTileRowsFp8Sparse>);
  });
  if (p.tile_rows == kMoeTileRowsFp8Sparse) launch_tile<kFc1, kMoeTileRowsFp8Sparse>(p, smem_optin, s);
  else launch_tile<kFc1, kMoeTileRowsSparse>(p, smem_optin, s);
}
template void launch_sparse<true>(const MoeGemmPrefillParams&, int, cudaStream_t);
template void launch_sparse<false>(const MoeGemmPrefillParams&, int, cudaStream_t);

}  // namespace mx::cuda::fp8_moe
