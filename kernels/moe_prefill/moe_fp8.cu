// The MoE on Hopper's FP8 tensor cores (wgmma, sm_90a): FC1 + SwiGLU and FC2 over sparse tiles (up to
// 16 sorted rows of one expert: decode steps of 5-256 distinct sequences, short prompt chunks) and over
// prefill tiles (up to 128 rows: moe_fp8_wide_k, below).
//
// Why: the bf16 path (moe_prefill.cu) is issue-bound on the E2M1 -> bf16 placement, the per-value scale
// multiply and redundant shared-memory reads; here a weight costs about a third of those instructions
// (figures: docs/perf.md, session 27):
//   - Each lane loads its weights straight into registers (16 bytes = one MXFP4 group of a row) and
//     turns 8 E2M1 values into 8 e4m3 with two byte-permute lookups and two sign permutes. The lookup
//     table is built per (row, group) from the E8M0 scale relative to the row's largest scale, so the
//     block scale is folded into the e4m3 exponent (offset d = s - smax + 12 in [1, 12]; the largest
//     code then lands on 384 < 448). Groups more than 11 octaves below the row's largest are flushed
//     to zero (below 2^-11 of the row's largest weights). One fp32 factor 2^(smax - 133) per row is
//     applied after the MMA.
//   - With the scales folded, any lane may hold any group: the A fragments mix four groups a k32
//     step, and the activations are staged in the matching k order (moe_fp8_pos).
//   - Activations are two e4m3 terms, x 2^xs = hi + lo (exact for bf16 values whose lo term is
//     normal), as the B operand's two columns of a token: D[row][2j] + D[row][2j + 1]. FC1's input has
//     one power-of-two scale a token (moe_quant_fp8); FC2's input, the SwiGLU output, is bounded by
//     limit * (limit + 1) = 56 and takes a fixed factor of 4.
//   - Sparse tiles: wgmma m64n32k32 with A from registers and B (the tile's 16 tokens x hi/lo, all of
//     K, staged once per CTA) from shared memory; a CTA is four warpgroups = 256 weight rows. Prefill
//     tiles: a producer warpgroup and both operands in shared memory (the comment above
//     moe_fp8_wide_k).
#include "kernels/moe_prefill/moe_prefill.h"

#include <algorithm>
#include <atomic>
#include <cuda_fp8.h>
#include <string>
#include <type_traits>

#include "kernels/common/async_copy.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/mma_tile.cuh"

namespace mx::cuda {
namespace {

// kWg warpgroups of 64 weight rows over one B staging: 4 (one CTA an SM) where the matrix's rows fill
// 256-row CTAs, else 2 (two CTAs an SM; sparse_cta_warpgroups); kU segments of weights in flight a thread.
[[maybe_unused]] constexpr int kU = 5;
constexpr int kCols = 2 * kMoeTileRowsSparse;       // B columns: (hi, lo) of 16 tokens
constexpr int kStepBytes = kCols * 32;              // one k32 step of B: [n/8][k half][n%8][16 bytes]

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MX_WGMMA 1
#endif

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// The (row, group) lookup pair: e4m3 of code c (E2M1 magnitude) times 2^(d - 6), codes 0-3 in lo,
// 4-7 in hi. Code 1 (0.5) is e4m3's exponent d with no mantissa; codes >= 2 add d to their exponent.
[[maybe_unused]] __device__ __forceinline__ void scale_luts(uint32_t s, uint32_t smax, uint32_t& lo, uint32_t& hi) {
  const int d = int(s) - int(smax) + 12;
  const uint32_t on = d > 0 ? ~0u : 0u, dd = d > 0 ? uint32_t(d) : 0u;
  lo = (dd * 0x08080800u + 0x0C080000u) & on;
  hi = (dd * 0x08080808u + 0x1C181410u) & on;
}

// A checkpoint word (8 E2M1 values, value i in nibble i) -> e4m3 of values 0-3 (v03) and 4-7 (v47).
// The sign permutes pick, for value i, the byte whose top bit is nibble i's sign (prmt mode 8+:
// replicate that bit over the byte).
[[maybe_unused]] __device__ __forceinline__ void e2m1x8_scaled(uint32_t w, uint32_t lo, uint32_t hi, uint32_t& v03, uint32_t& v47) {
  const uint32_t m = w & 0x77777777u, w4 = w << 4;
  v03 = prmt(lo, hi, m) | (prmt(w4, w, 0xD9C8u) & 0x80808080u);
  v47 = prmt(lo, hi, m >> 16) | (prmt(w4, w, 0xFBEAu) & 0x80808080u);
}

__device__ __forceinline__ uint8_t e4m3_rn(float f) {
  return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
}

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
// One segment's four k32 steps, waited for.
template <int kAcc>
__device__ __forceinline__ void mma4(float (&acc)[kAcc], const uint32_t (&f)[4][4], uint32_t d) {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int q = 0; q < 4; ++q) wgmma_rs(acc, f[q], b_desc(d + q * (kStepBytes >> 4)));
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
#endif

// out[r] = max over row r's G E8M0 scales (once at load: a thread a row).
__global__ void row_max_k(const uint8_t* scales, size_t rows, int G, uint8_t* out) {
  const size_t r = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const uint8_t* sc = scales + r * G;
  uint32_t m = 0;
  for (int g = 0; g < G; ++g) m = max(m, uint32_t(sc[g]));
  out[r] = uint8_t(m);
}

// One token row -> its hi/lo rows (zeros past K) and 2^-xs; max |x| 2^xs < 256.
__global__ void quant_k(const uint16_t* x, int K, uint8_t* xq, float* xinv) {
  __shared__ float wmax[8];
  const int row = blockIdx.x, tid = threadIdx.x;
  const uint16_t* xr = x + size_t(row) * K;
  float m = 0.f;
  for (int i = tid; i < K; i += blockDim.x) m = fmaxf(m, fabsf(mma::bf16_lo(xr[i])));
  for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (tid % 32 == 0) wmax[tid / 32] = m;
  __syncthreads();
  m = 0.f;
  for (int w = 0; w < int(blockDim.x / 32); ++w) m = fmaxf(m, wmax[w]);
  int ex = 0;
  frexpf(m, &ex);
  const int xs = m > 0.f ? 8 - ex : 0;
  const float scale = ldexpf(1.f, xs);
  if (tid == 0) xinv[row] = ldexpf(1.f, -xs);
  const int Kp = moe_fp8_kpad(K);
  uint8_t* hi = xq + size_t(row) * 2 * Kp;
  for (int p4 = tid; p4 < Kp / 4; p4 += blockDim.x) {  // positions 4p4..4p4+3 hold 4 consecutive values
    const int pos = 4 * p4, v = moe_fp8_value(pos);
    uint32_t h = 0, l = 0;
    if (v < K) {
      const uint2 raw = *reinterpret_cast<const uint2*>(xr + v);
      const float f[4] = {mma::bf16_lo(raw.x), mma::bf16_hi(raw.x), mma::bf16_lo(raw.y), mma::bf16_hi(raw.y)};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float y = f[j] * scale;
        const uint8_t hb = e4m3_rn(y);
        h |= uint32_t(hb) << (8 * j);
        l |= uint32_t(e4m3_rn(y - e4m3_to_f32(hb))) << (8 * j);
      }
    }
    *reinterpret_cast<uint32_t*>(hi + pos) = h;
    *reinterpret_cast<uint32_t*>(hi + Kp + pos) = l;
  }
}

// Both kernels' output: acc[4j + c] is column 8j + 2t (hi) or + 1 (lo) = token 4j + t, weight row rA for
// c < 2, rA + 1 for c >= 2; FC1 writes SwiGLU as hi/lo e4m3 (act_q), FC2 the weighted rows (y_slot).
// EpiIn holds what the epilogue reads from global memory, read all at once before it (overlapped round
// trips; read before the sparse kernel's main loop instead, it was slower: docs/perf.md, session 31).
template <int kJ>
struct EpiIn {
  float bA, bB, xw[kJ];  // the rows' biases; per token: FC1 2^-xs, FC2 the gate weight
  int slot[kJ];          // FC2: the token's output slot
};
// er: the thread's first row over all experts' rows (e * N + row).
template <bool kFc1, int kJ>
__device__ __forceinline__ EpiIn<kJ> epilogue_in(const MoeGemmPrefillParams& p, size_t er, int row0, int rows, int t) {
  EpiIn<kJ> in;
  const __nv_bfloat16* bias = reinterpret_cast<const __nv_bfloat16*>(p.bias);
  in.bA = __bfloat162float(bias[er]);
  in.bB = __bfloat162float(bias[er + 1]);
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    const int r = row0 + max(0, min(4 * j + t, rows - 1));  // a real row: tokens past `rows` are dropped
    in.xw[j] = kFc1 ? p.xinv[p.sorted_tok[r]] : p.sorted_w[r];
    in.slot[j] = kFc1 ? 0 : p.sorted_slot[r];
  }
  return in;
}
template <bool kFc1, int kAcc>
__device__ __forceinline__ void epilogue(const MoeGemmPrefillParams& p, const float (&acc)[kAcc], const EpiIn<kAcc / 4>& in,
                                         int row0, int rows, int rA, uint32_t smaxA, uint32_t smaxB, int t) {
  const float fa = ldexpf(1.f, int(smaxA) - 133), fb = ldexpf(1.f, int(smaxB) - 133);
#pragma unroll
  for (int j = 0; j < kAcc / 4; ++j) {
    const int tok = 4 * j + t;
    if (tok >= rows) continue;
    const int r = row0 + tok;
    const float xi = kFc1 ? in.xw[j] : 1.f / kMoeFp8ActScale;
    const float y0 = (acc[4 * j] + acc[4 * j + 1]) * fa * xi + in.bA;
    const float y1 = (acc[4 * j + 2] + acc[4 * j + 3]) * fb * xi + in.bB;
    if constexpr (kFc1) {
      const float gate = fminf(y0, p.limit), up = fminf(fmaxf(y1, -p.limit), p.limit);
      const float a = __bfloat162float(__float2bfloat16(gate / (1.f + __expf(-p.alpha * gate)) * (up + 1.f)));
      const int Ip = moe_fp8_kpad(p.N / 2), pos = moe_fp8_pos(rA / 2);
      const float y = a * kMoeFp8ActScale;
      const uint8_t hb8 = e4m3_rn(y);
      uint8_t* out = p.act_q + size_t(r) * 2 * Ip;
      out[pos] = hb8;
      out[Ip + pos] = e4m3_rn(y - e4m3_to_f32(hb8));
    } else {
      const float w = in.xw[j];
      *reinterpret_cast<float2*>(p.y_slot + size_t(in.slot[j]) * p.N + rA) = make_float2(y0 * w, y1 * w);
    }
  }
}

template <bool kFc1, int kWg>
__global__ void __launch_bounds__(kWg * 128, 4 / kWg) moe_fp8_k(MoeGemmPrefillParams p) {
#ifdef MX_WGMMA
  constexpr int kThreads = kWg * 128, kRows = kWg * 64;
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
      rows = min(kMoeTileRowsSparse, p.offsets[e + 1] - row0);
      // B: the tile's hi/lo rows over all of K. Rows past `rows` keep stale bytes: they feed only columns
      // whose outputs are dropped.
      const int chunks = rows * 2 * steps * 2;
      for (int c = tid; c < chunks; c += kThreads) {
        const int kc = c & 1, ks = (c >> 1) % steps, n = (c >> 1) / steps;
        const int src_row = kFc1 ? p.sorted_tok[row0 + (n >> 1)] : row0 + (n >> 1);
        cp_async16(bsm + ks * kStepBytes + (n >> 3) * 256 + kc * 128 + (n & 7) * 16,
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
          *reinterpret_cast<uint32_t*>(bsm + (steps - 4 + q) * kStepBytes + (n >> 3) * 256 + kc * 128 + (n & 7) * 16 +
                                       4 * tt) = 0;
        }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncthreads();
    }

    // The MMA only as wide as the tile's tokens (2 columns a token): n8 up to 4, n16 up to 8, else n32 (wn 0 /
    // 1 / 2, uniform). Each segment's MMAs are waited for before the next one's conversion: their latency is
    // the loop's.
    const int wn = rows <= 4 ? 0 : rows <= 8 ? 1 : 2;
    float acc[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) acc[j] = 0.f;
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
        const uint32_t db = d0 + 4 * s * (kStepBytes >> 4);
        if (wn == 0) mma4(reinterpret_cast<float(&)[4]>(acc), f, db);
        else if (wn == 1) mma4(reinterpret_cast<float(&)[8]>(acc), f, db);
        else mma4(acc, f, db);
      }
    }

    const uint32_t nsmax = smax_of(nxt);  // its latency under the epilogue's
    if (rA < p.N) epilogue<kFc1>(p, acc, epilogue_in<kFc1, 4>(p, size_t(cur), row0, rows, t), row0, rows, rA, smax & 0xFF, smax >> 8, t);
    cur = nxt;
    smax = nsmax;
  }
#endif
}

// ---- Prefill tiles (64 or 128 rows): the shape of a Hopper GEMM ----
// Two producer warpgroups (registers moved to the consumers with setmaxnreg) turn the MXFP4 weights of
// 128 rows into e4m3 in shared memory (raw bytes in through cp.async kWRaw segments ahead, scales folded
// as above, the k order of moe_fp8_pos; a thread has half a row) and copy B (up to 128 tokens x hi/lo:
// two sub-tiles of 128 columns; for 64-row tiles one, copied by a third warpgroup) beside them; two consumer warpgroups, one m64 block of weight rows
// each, run wgmma with both operands in shared memory over both sub-tiles (the second only when the
// tile has more than 64 rows; each MMA only as wide as the sub-tile's tokens), so an expert's weights
// are converted once for up to 128 of its tokens.
// One segment's MMAs stay in flight behind the next. mbarriers hand the kWStages stages over (full: A
// stored and B landed; empty: both consumers' MMAs on it done). The grid is persistent (one CTA an SM
// walks (tile, slice) items): the producer copies the next item's scales and fills its first stages
// while the consumers drain the last item's MMAs and write its outputs. Every global read is whole
// sectors (B: 8 lanes a row's 128 bytes; weights: 2 lanes a 32-byte pair of groups): 16-byte pieces
// of sectors had L2 at its limit (docs/perf.md, session 30).
[[maybe_unused]] constexpr int kWRows = 128, kWProd = 256, kWThreads = kWProd + 256, kWRaw = 3;
[[maybe_unused]] constexpr int kWStepA = 64 * 32;        // one k32 step of an m64 block (2 KB)
[[maybe_unused]] constexpr int kWSegA = kWRows * 128;    // e4m3 weights of a 128-value segment (16 KB)
[[maybe_unused]] constexpr int kWStepB = 128 * 32;       // a sub-tile's 128 columns x k32 (4 KB)
// kSub token sub-tiles of 64 (one n128 MMA each): 2 for 128-row tiles (48 KB stages, 3 fit), 1 for 64-row
// tiles (32 KB stages, 5 fit: a step of up to kMoeFp8NarrowRowsPerExpert rows an expert runs faster so).
template <int kSub> constexpr int kWStages = kSub == 1 ? 5 : 3;
template <int kSub> constexpr int kWStage = kWSegA + kSub * 4 * kWStepB;
// 64-row tiles: a third warpgroup copies B, so the converters' loop is conversion only; their consumers'
// accumulators (n128 at most) leave room for its registers.
template <int kSub> constexpr int kWCopy = kSub == 1 ? 128 : 0;
template <int kSub> constexpr int kWConsumerRegs = kSub == 1 ? 136 : 184;
[[maybe_unused]] constexpr int kWRawSeg = kWRows * 64;   // MXFP4 of a segment (8 KB)
// The CTA's scales, copied whole (128 rows x K / 32 bytes, contiguous in the checkpoint) from the 16-byte
// boundary below them.
__host__ __device__ inline size_t wide_scale_bytes(int K) { return (size_t(kWRows) * (K / 32) + 31) / 16 * 16; }
template <int kSub>
__host__ __device__ inline size_t wide_smem_bytes(int K) {
  return 1024 + size_t(kWStages<kSub>) * kWStage<kSub> + size_t(kWRaw) * kWRawSeg + 4 * kWProd + wide_scale_bytes(K);
}

[[maybe_unused]] __device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
[[maybe_unused]] __device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrives once this thread's earlier cp.async copies have landed.
[[maybe_unused]] __device__ __forceinline__ void mbar_arrive_copies(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}
[[maybe_unused]] __device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred P;\nmbarrier.try_wait.parity.shared::cta.b64 P, [%1], %2;\nselp.u32 %0, 1, 0, P;\n}\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
  } while (!done);
}

#ifdef MX_WGMMA
// K-major, 128-byte swizzle: a row's 128 bytes (a segment) in 8-row atoms of 1 KB (the stride byte
// offset), 16-byte chunk c of row r at chunk c ^ (r % 8); a k32 step starts 32 bytes further.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
// wgmma m64nNk32 (e4m3, both operands in shared memory) for N = 2 x the accumulators a thread holds.
__device__ __forceinline__ void wgmma_ss(float (&d)[16], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgmma_ss(float (&d)[48], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, %48, %49, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db));
}
#endif

template <bool kFc1, int kSub>
__global__ void __launch_bounds__(kWThreads + kWCopy<kSub>, 1) moe_fp8_wide_k(MoeGemmPrefillParams p) {
#ifdef MX_WGMMA
  constexpr int kStages = kWStages<kSub>, kStage = kWStage<kSub>, kTileRows = 64 * kSub, kCopy = kWCopy<kSub>;
  extern __shared__ __align__(128) uint8_t sm_raw[];
  uint8_t* sm = sm_raw + ((1024 - (smem_addr(sm_raw) & 1023)) & 1023);  // the swizzle's atoms: 1 KB aligned
  // full / empty: the stages; epi: a consumer's epilogue of the item before last is done (smax_s free).
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages], epi[2];
  __shared__ uint8_t smax_s[2][kWRows];  // per item parity: the rows' largest scales, for the epilogue
  const int nt = *p.num_tiles, slices = (p.N + kWRows - 1) / kWRows, items = nt * slices;
  if (int(blockIdx.x) >= items) return;
  const int G = p.K / 32, S = (G + 3) / 4;  // xq rows: hi, lo of 128 S bytes each
  const int tid = threadIdx.x;
  uint8_t* raw = sm + kStages * kStage;
  // The item's B rows: where a column's bytes start in xq, in 128-byte units (-1: zeros).
  int* brow_s = reinterpret_cast<int*>(raw + kWRaw * kWRawSeg);
  uint8_t* slab = raw + kWRaw * kWRawSeg + 4 * kWProd;
  if (tid < kStages) {
    // each converter: its B copies (without a copier), then its stores; each copier thread: its copies
    mbar_init(&full[tid], (kCopy ? 1 : 2) * kWProd + kCopy);
    mbar_init(&empty[tid], 256);  // the consumers' 256 threads
  }
  if (tid < 2) mbar_init(&epi[tid], 256);
  __syncthreads();

  // Items (tile, slice of kWRows weight rows), tile-major within a slice: CTAs running side by side
  // take neighbouring tiles, so an expert's tiles read its weights from L2 once.
  if (tid < kWProd) {  // ---- producer: groups 2 hh, 2 hh + 1 of each segment of local row lr ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 72;");
    const int pt = tid, lr = pt >> 1, hh = pt & 1;
    int it = 0;  // segments produced, over all of this CTA's items
    for (int item = blockIdx.x, j = 0; item < items; item += gridDim.x, ++j) {
      const int tile = item % nt, R0 = (item / nt) * kWRows, nrows = min(kWRows, p.N - R0);
      const int e = p.tile_expert[tile], row0 = p.tile_row0[tile];
      const int rows = min(kTileRows, p.offsets[e + 1] - row0);
      if (j > 0) asm volatile("bar.sync 1, %0;" ::"n"(kWProd) : "memory");  // the last item's slab reads are done
      const uint8_t* sc0 = p.scales + (size_t(e) * p.N + R0) * G;
      const int mis = int(reinterpret_cast<uintptr_t>(sc0) & 15);
      for (int i = pt; i < (mis + nrows * G + 15) / 16; i += kWProd) cp_async16(slab + 16 * i, sc0 - mis + 16 * i);
      cp_async_commit();
      const uint8_t* srow = slab + mis;  // row lr's scales at srow + lr * G
      const uint8_t* blk = p.blocks + (size_t(e) * p.N + min(R0 + lr, p.N - 1)) * G * 16;
      // B row bn = pt: sub-tile bn / 128, column bn % 128 = token (bn % 128) / 2's hi or lo row. Rows
      // past the tile's are not copied (nor a second sub-tile the tile does not reach): their stale bytes
      // feed only output columns the epilogue drops.
      const int bu = pt >> 7, bcol = pt & 127, tok = 64 * bu + (bcol >> 1);
      const bool bvalid = tok < rows, bcopy = kCopy == 0 && (bu == 0 || rows > 64);
      if constexpr (kCopy == 0) {
        const int src_row = !bvalid ? 0 : kFc1 ? p.sorted_tok[row0 + tok] : row0 + tok;
        brow_s[pt] = bvalid ? (2 * src_row + (bcol & 1)) * S : -1;  // read by its group's 8 lanes, after the barrier
      }
      // A group of 8 lanes copies its 8 B rows one at a time, lane ch the row's 16-byte chunk ch: each
      // row's 128 bytes in one request (a row a thread read 16-byte halves of 32-byte sectors).
      const int bg = pt & ~7, bdst = kWSegA + bu * 4 * kWStepB + (bcol >> 3) * 1024;
      const uint8_t* bbase = p.xq + (pt & 7) * 16;
      // Lanes pt, pt ^ 1 copy a row's chunks 2q, 2q + 1 (one sector), then convert chunks 2hh, 2hh + 1.
      auto copy_raw = [&](int s) {
        if (s < S)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int gi = 4 * s + 2 * q + hh;
            cp_async16(raw + (s % kWRaw) * kWRawSeg + lr * 64 + (2 * q + hh) * 16, blk + gi * 16, gi < G);
          }
        cp_async_commit();  // one group a segment, empty past S, so the waits below count segments
      };
#pragma unroll
      for (int s = 0; s < kWRaw - 1; ++s) copy_raw(s);
      // The row's largest scale, found at load (moe_row_max_scale); rows past N keep 0: their outputs are dropped.
      const uint32_t smax = lr < nrows ? p.row_smax[size_t(e) * p.N + R0 + lr] : 0u;
      cp_async_wait<kWRaw - 1>();  // the slab (the oldest group)
      asm volatile("bar.sync 1, %0;" ::"n"(kWProd) : "memory");  // every scale has landed
      if (j >= 2) mbar_wait(&epi[j & 1], ((j >> 1) - 1) & 1);  // item j - 2's epilogue read smax_s[j & 1]
      if (hh == 0) smax_s[j & 1][lr] = uint8_t(smax);
      // Weight row r of an m64 block is the MMA's row 16 (r / 16) + (r % 16) / 2 + 8 (r % 2): a consumer
      // thread's two rows are then a gate / linear pair, as in moe_fp8_k. A thread writes 8 of the 16
      // bytes of each chunk (its two groups).
      const int mb = lr >> 6, r = lr & 63, m = 16 * (r >> 4) + ((r & 15) >> 1) + 8 * (r & 1), asw = m & 7;
      const int adst = mb * 4 * kWStepA + (m >> 3) * 1024 + (m & 7) * 128 + 8 * hh;
      for (int s = 0; s < S; ++s, ++it) {
        const int slot = it % kStages;
        uint8_t* st = sm + slot * kStage;
        if (it >= kStages) mbar_wait(&empty[slot], (it / kStages - 1) & 1);
        if (bcopy) {
          const int4 r0 = *reinterpret_cast<const int4*>(brow_s + bg), r1 = *reinterpret_cast<const int4*>(brow_s + bg + 4);
          const int br[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};  // rows c = column bcol & ~7 | c
#pragma unroll
          for (int c = 0; c < 8; ++c)
            if (br[c] >= 0) cp_async16(st + bdst + c * 128 + (((pt & 7) ^ c) << 4), bbase + (size_t(br[c] + s) << 7));
        }
        if constexpr (kCopy == 0) mbar_arrive_copies(&full[slot]);
        copy_raw(s + kWRaw - 1);
        cp_async_wait<kWRaw - 1>();  // this thread's raw weights of segment s have landed
        __syncwarp();  // and its partner's (half of the chunks read below)
        const uint8_t* rs = raw + (s % kWRaw) * kWRawSeg + lr * 64 + 32 * hh;
        const uint8_t* sr = srow + lr * G + 4 * s + 2 * hh;  // past G: another row's or stale bytes, on zero weights
        const uint4 xs[2] = {*reinterpret_cast<const uint4*>(rs), *reinterpret_cast<const uint4*>(rs + 16)};
        __syncwarp();  // both lanes have read the slot before either copies into it again
        uint32_t o[4][2][2];  // [k32 step][half][group]
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const uint4 x = xs[q];
          uint32_t lo, hi;
          scale_luts(sr[q], smax, lo, hi);
          e2m1x8_scaled(x.x, lo, hi, o[0][0][q], o[0][1][q]);
          e2m1x8_scaled(x.y, lo, hi, o[1][0][q], o[1][1][q]);
          e2m1x8_scaled(x.z, lo, hi, o[2][0][q], o[2][1][q]);
          e2m1x8_scaled(x.w, lo, hi, o[3][0][q], o[3][1][q]);
        }
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf)
            *reinterpret_cast<uint2*>(st + adst + (((2 * ks + hf) ^ asw) << 4)) = make_uint2(o[ks][hf][0], o[ks][hf][1]);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the stores, to the MMAs' proxy
        mbar_arrive(&full[slot]);
      }
      if (kFc1 && R0 == 0) {  // zeros past I in the tile's act_q rows, for FC2's last segment
        const int I = p.N / 2, Ip = moe_fp8_kpad(I), pad = Ip - I;
        for (int c = pt; c < rows * pad; c += kWProd) {
          uint8_t* out = p.act_q + size_t(row0 + c / pad) * 2 * Ip;
          const int pos = moe_fp8_pos(I + c % pad);
          out[pos] = 0;
          out[Ip + pos] = 0;
        }
      }
    }
    cp_async_wait<0>();
    return;
  }

  if constexpr (kCopy > 0) {
    if (tid < kWProd + kCopy) {  // ---- copier: B column ct (token ct / 2's hi or lo row) ----
      asm volatile("setmaxnreg.dec.sync.aligned.u32 56;");
      const int ct = tid - kWProd, bdst = kWSegA + (ct >> 3) * 1024;
      const uint8_t* bbase = p.xq + (ct & 7) * 16;
      int it = 0;
      for (int item = blockIdx.x, j = 0; item < items; item += gridDim.x, ++j) {
        const int tile = item % nt, e = p.tile_expert[tile], row0 = p.tile_row0[tile];
        const int rows = min(kTileRows, p.offsets[e + 1] - row0), tok = ct >> 1;
        const int src_row = tok >= rows ? 0 : kFc1 ? p.sorted_tok[row0 + tok] : row0 + tok;
        if (j > 0) asm volatile("bar.sync 2, %0;" ::"n"(kCopy) : "memory");  // the last item's rows are read
        brow_s[ct] = tok < rows ? (2 * src_row + (ct & 1)) * S : -1;
        asm volatile("bar.sync 2, %0;" ::"n"(kCopy) : "memory");
        // As the converters' copies without a copier: 8 lanes a row's 128 bytes, the group's 8 rows in turn.
        const int4 r0 = *reinterpret_cast<const int4*>(brow_s + (ct & ~7)), r1 = *reinterpret_cast<const int4*>(brow_s + (ct & ~7) + 4);
        const int br[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
        for (int s = 0; s < S; ++s, ++it) {
          const int slot = it % kStages;
          uint8_t* st = sm + slot * kStage;
          if (it >= kStages) mbar_wait(&empty[slot], (it / kStages - 1) & 1);
#pragma unroll
          for (int c = 0; c < 8; ++c)
            if (br[c] >= 0) cp_async16(st + bdst + c * 128 + (((ct & 7) ^ c) << 4), bbase + (size_t(br[c] + s) << 7));
          mbar_arrive_copies(&full[slot]);
        }
      }
      cp_async_wait<0>();
      return;
    }
  }

  // ---- consumers: warpgroup c has m64 block c, over one or two token sub-tiles ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kWConsumerRegs<kSub>));
  const int c = (tid - kWProd - kCopy) >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const uint32_t base = smem_addr(sm);
  int it = 0;  // segments consumed, as the producer counts them
  for (int item = blockIdx.x, j = 0; item < items; item += gridDim.x, ++j) {
    const int tile = item % nt, R0 = (item / nt) * kWRows;
    const int e = p.tile_expert[tile], row0 = p.tile_row0[tile];
    const int rows = min(kTileRows, p.offsets[e + 1] - row0);
    // Each pair of MMA widths has its own copy of the item (accumulators included): wgmma keeps its
    // accumulators only where no other instruction touches them inside the pipeline.
    // The widths: kN0 columns of the first 64-token sub-tile, kN1 of the second (0: none), each
    // the tile's tokens there rounded up (2 columns a token), so a short tile reads less B from shared
    // memory and multiplies less (docs/perf.md, session 49).
    auto run = [&](auto n0, auto n1) {
      constexpr int kN0 = decltype(n0)::value, kN1 = decltype(n1)::value;
      float acc0[kN0 / 2], acc1[kN1 ? kN1 / 2 : 1];
#pragma unroll
      for (int i = 0; i < kN0 / 2; ++i) acc0[i] = 0.f;
      if constexpr (kN1 > 0)
#pragma unroll
        for (int i = 0; i < kN1 / 2; ++i) acc1[i] = 0.f;
      for (int s = 0; s < S; ++s, ++it) {
        const int slot = it % kStages;
        mbar_wait(&full[slot], (it / kStages) & 1);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the copies, to the MMAs' proxy
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        const uint32_t st = base + slot * kStage;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint64_t da = sw128_desc(st + c * 4 * kWStepA + 32 * q);
          wgmma_ss(acc0, da, sw128_desc(st + kWSegA + 32 * q));
          if constexpr (kN1 > 0) wgmma_ss(acc1, da, sw128_desc(st + kWSegA + 4 * kWStepB + 32 * q));
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        if (s > 0) mbar_arrive(&empty[(it - 1) % kStages]);
      }
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      mbar_arrive(&empty[(it - 1) % kStages]);  // the producer fills it for the next item meanwhile
      const int lr = c * 64 + 16 * warp + 2 * g, rA = R0 + lr;
      if (rA < p.N) {
        const uint32_t sa = smax_s[j & 1][lr], sb = smax_s[j & 1][lr + 1];
        epilogue<kFc1>(p, acc0, epilogue_in<kFc1, kN0 / 8>(p, size_t(e) * p.N + rA, row0, min(rows, 64), t), row0, min(rows, 64), rA, sa, sb, t);
        if constexpr (kN1 > 0)
          epilogue<kFc1>(p, acc1, epilogue_in<kFc1, kN1 / 8>(p, size_t(e) * p.N + rA, row0 + 64, rows - 64, t), row0 + 64, rows - 64, rA, sa, sb, t);
      }
    };
    using N0 = std::integral_constant<int, 0>;
    using N32 = std::integral_constant<int, 32>;
    using N64 = std::integral_constant<int, 64>;
    using N96 = std::integral_constant<int, 96>;
    using N128 = std::integral_constant<int, 128>;
    if (rows <= 32) run(N64{}, N0{});
    else if (rows <= 48) run(N96{}, N0{});
    else if (kSub == 1 || rows <= 64) run(N128{}, N0{});
    else if (rows <= 80) run(N128{}, N32{});
    else if (rows <= 96) run(N128{}, N64{});
    else run(N128{}, N128{});
    mbar_arrive(&epi[j & 1]);
  }
#endif
}

// Whether the sm_90a kernels exist in this binary: a build for plain sm_90 compiles their bodies empty.
__global__ void wgmma_probe_k(int* out) {
#ifdef MX_WGMMA
  *out = 1;
#else
  *out = 0;
#endif
}

// An sm_90 GPU and the sm_90a kernels for it (once per device: 1 no, 2 yes).
bool fp8_runs_here() {
  static std::atomic<int> cache[64];
  return per_device(cache, [](int dev) {
           int major = 0, minor = 0, has = 0;
           MX_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
           MX_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
           if (major == 9 && minor == 0) {
             int* d = nullptr;
             MX_CUDA(cudaMalloc(&d, sizeof(int)));
             wgmma_probe_k<<<1, 1>>>(d);
             MX_CUDA(cudaGetLastError());
             MX_CUDA(cudaMemcpy(&has, d, sizeof(int), cudaMemcpyDeviceToHost));
             MX_CUDA(cudaFree(d));
           }
           return has ? 2 : 1;
         }) == 2;
}

// One 256-row CTA an SM stages B and pays the prologue once for twice the rows (docs/perf.md, session
// 32), unless over 1/32 of its rows would be idle: a 2,880-row matrix (FC2, and FC1 under TP=2) leaves
// its last CTA a quarter live, which lost 4.4 % at TP=2 b64.
int sparse_cta_warpgroups(int N) {
  const int rounded = (N + 255) / 256 * 256;
  return (rounded - N) * 32 <= rounded ? 4 : 2;
}

// A sparse CTA: kWg warpgroups, each an m64 block of weight rows.
template <bool kFc1, int kWg>
void launch_sparse(const MoeGemmPrefillParams& p, size_t smem, cudaStream_t s) {
  constexpr int rows = kWg * 64;
  const int items = p.max_tiles * ((p.N + rows - 1) / rows);  // at most: the tile count is on the device
  const int ctas = p.max_ctas > 0 ? p.max_ctas : device_sm_count() * (4 / kWg);
  moe_fp8_k<kFc1, kWg><<<std::min(items, ctas), kWg * 128, smem, s>>>(p);
}

template <bool kFc1, int kSub>
void launch_wide(const MoeGemmPrefillParams& p, int most, cudaStream_t s) {
  const size_t smem = wide_smem_bytes<kSub>(p.K);
  if (smem > size_t(most - 1024)) throw_error("moe fp8: K = " + std::to_string(p.K) + " needs more shared memory than the GPU has");
  const int items = p.max_tiles * ((p.N + kWRows - 1) / kWRows);  // at most: the tile count is on the device
  moe_fp8_wide_k<kFc1, kSub><<<std::min(items, p.max_ctas > 0 ? p.max_ctas : device_sm_count()), kWThreads + kWCopy<kSub>, smem, s>>>(p);
}

template <bool kFc1>
void launch_fp8(const MoeGemmPrefillParams& p, cudaStream_t s) {
  if (p.max_tiles <= 0) return;
  if (!moe_fp8_available()) throw_error("moe fp8: needs an sm_90 GPU (wgmma)");
  if (p.K % 32 || p.N % 2 || p.K <= 0 || p.N <= 0) throw_error("moe fp8: K must be a multiple of 32 and N even");
  const int most = device_smem_optin();
  static std::atomic<unsigned long long> ready{0};
  once_per_device(ready, [most] {
    MX_CUDA(cudaFuncSetAttribute(moe_fp8_k<kFc1, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
    MX_CUDA(cudaFuncSetAttribute(moe_fp8_k<kFc1, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
    MX_CUDA(cudaFuncSetAttribute(moe_fp8_wide_k<kFc1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, most - 1024));
    MX_CUDA(cudaFuncSetAttribute(moe_fp8_wide_k<kFc1, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, most - 1024));
  });
  if (!p.row_smax) throw_error("moe fp8: needs the rows' largest scales (moe_row_max_scale)");
  if (p.tile_rows == kMoeTileRowsSparse) {
    const size_t smem = size_t(moe_fp8_kpad(p.K) / 32) * kStepBytes;
    if (sparse_cta_warpgroups(p.N) == 4) launch_sparse<kFc1, 4>(p, smem, s);
    else launch_sparse<kFc1, 2>(p, smem, s);
  } else if (p.tile_rows == kMoeTileRowsFp8Wide) {
    launch_wide<kFc1, 2>(p, most, s);
  } else if (p.tile_rows == kMoeTileRowsFp8Narrow) {
    launch_wide<kFc1, 1>(p, most, s);
  } else {
    throw_error("moe fp8: tiles of 16, 64 or 128 rows");
  }
  MX_CUDA(cudaGetLastError());
}
}  // namespace

bool moe_fp8_available() { return fp8_runs_here(); }

void moe_quant_fp8(const uint16_t* x, int T, int K, uint8_t* xq, float* xinv, cudaStream_t s) {
  if (T <= 0) return;
  if (K % 32) throw_error("moe fp8: K must be a multiple of 32");
  quant_k<<<T, 256, 0, s>>>(x, K, xq, xinv);
  MX_CUDA(cudaGetLastError());
}
void moe_row_max_scale(const uint8_t* scales, size_t rows, int G, uint8_t* out, cudaStream_t s) {
  if (rows == 0) return;
  if (G <= 0) throw_error("moe_row_max_scale: G must be positive");
  row_max_k<<<unsigned((rows + 255) / 256), 256, 0, s>>>(scales, rows, G, out);
  MX_CUDA(cudaGetLastError());
}
void moe_fc1_fp8(const MoeGemmPrefillParams& p, cudaStream_t s) { launch_fp8<true>(p, s); }
void moe_fc2_fp8(const MoeGemmPrefillParams& p, cudaStream_t s) { launch_fp8<false>(p, s); }

}  // namespace mx::cuda
