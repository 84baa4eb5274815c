// The FP8 MoE over prefill tiles (64 or 128 sorted rows of one expert): producer warpgroups convert the
// weights into shared memory for consumer warpgroups' wgmma (the why of the FP8 path: moe_fp8_device.cuh).
#include <algorithm>
#include <atomic>
#include <string>
#include <type_traits>

#include "kernels/common/async_copy.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/moe_prefill/moe_fp8_device.cuh"

namespace mx::cuda::fp8_moe {
namespace {

// ---- Prefill tiles (64 or 128 rows): the shape of a Hopper GEMM ----
// Two producer warpgroups (registers moved to the consumers with setmaxnreg) turn the MXFP4 weights of
// 128 rows into e4m3 in shared memory (raw bytes in through cp.async kWRaw segments ahead, scales folded
// as in moe_fp8_device.cuh, the k order of moe_fp8_pos; a thread has half a row) and copy B (up to 128
// tokens x hi/lo: two sub-tiles of 128 columns; for 64-row tiles one, copied by a third warpgroup) beside
// them; two consumer warpgroups, one m64 block of weight rows each, run wgmma with both operands in shared
// memory over both sub-tiles (the second only when the tile has more than 64 rows; each MMA only as wide
// as the sub-tile's tokens), so an expert's weights are converted once for up to 128 of its tokens.
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

// B column col (token tok's hi row, col even, or lo row): where its bytes start in xq, in 128-byte units;
// -1 past the tile's rows.
template <bool kFc1>
__device__ __forceinline__ int b_row(const MoeGemmPrefillParams& p, int row0, int rows, int tok, int col, int S) {
  const int src_row = tok >= rows ? 0 : kFc1 ? p.sorted_tok[row0 + tok] : row0 + tok;
  return tok < rows ? (2 * src_row + (col & 1)) * S : -1;
}
// A group of 8 lanes copies its 8 B rows' segment s (br: their b_row, -1 not copied; lane ch the row's
// 16-byte chunk ch: each row's 128 bytes in one request) into dst, 128-byte swizzled.
__device__ __forceinline__ void copy_b8(uint8_t* dst, const uint8_t* bbase, const int (&br)[8], int s, int lane8) {
#pragma unroll
  for (int c = 0; c < 8; ++c)
    if (br[c] >= 0) cp_async16(dst + c * 128 + ((lane8 ^ c) << 4), bbase + (size_t(br[c] + s) << 7));
}
// The 8 b_row of a lane group, from shared memory (g8: the group's first column).
__device__ __forceinline__ void b_rows8(const int* brow_s, int g8, int (&br)[8]) {
  const int4 r0 = *reinterpret_cast<const int4*>(brow_s + g8), r1 = *reinterpret_cast<const int4*>(brow_s + g8 + 4);
  br[0] = r0.x, br[1] = r0.y, br[2] = r0.z, br[3] = r0.w, br[4] = r1.x, br[5] = r1.y, br[6] = r1.z, br[7] = r1.w;
}

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
      const bool bcopy = kCopy == 0 && (bu == 0 || rows > 64);
      // Its group's 8 lanes read it after the barrier and copy the 8 rows together (copy_b8: a row a thread
      // read 16-byte halves of 32-byte sectors).
      if constexpr (kCopy == 0) brow_s[pt] = b_row<kFc1>(p, row0, rows, tok, bcol, S);
      const int bdst = kWSegA + bu * 4 * kWStepB + (bcol >> 3) * 1024;
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
          int br[8];
          b_rows8(brow_s, pt & ~7, br);
          copy_b8(st + bdst, bbase, br, s, pt & 7);
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
        const int rows = min(kTileRows, p.offsets[e + 1] - row0);
        const int brow = b_row<kFc1>(p, row0, rows, ct >> 1, ct, S);
        if (j > 0) asm volatile("bar.sync 2, %0;" ::"n"(kCopy) : "memory");  // the last item's rows are read
        brow_s[ct] = brow;
        asm volatile("bar.sync 2, %0;" ::"n"(kCopy) : "memory");
        int br[8];  // read once an item (the converters' copies without a copier read them each segment)
        b_rows8(brow_s, ct & ~7, br);
        for (int s = 0; s < S; ++s, ++it) {
          const int slot = it % kStages;
          uint8_t* st = sm + slot * kStage;
          if (it >= kStages) mbar_wait(&empty[slot], (it / kStages - 1) & 1);
          copy_b8(st + bdst, bbase, br, s, ct & 7);
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

template <bool kFc1, int kSub>
void launch_grid(const MoeGemmPrefillParams& p, int most, cudaStream_t s) {
  const size_t smem = wide_smem_bytes<kSub>(p.K);
  if (smem > size_t(most - 1024)) throw_error("moe fp8: K = " + std::to_string(p.K) + " needs more shared memory than the GPU has");
  const int items = p.max_tiles * ((p.N + kWRows - 1) / kWRows);  // at most: the tile count is on the device
  moe_fp8_wide_k<kFc1, kSub><<<std::min(items, p.max_ctas > 0 ? p.max_ctas : device_sm_count()), kWThreads + kWCopy<kSub>, smem, s>>>(p);
}

}  // namespace

template <bool kFc1>
void launch_wide(const MoeGemmPrefillParams& p, int smem_optin, cudaStream_t s) {
  static std::atomic<unsigned long long> ready{0};
  once_per_device(ready, [smem_optin] {
    MX_CUDA(cudaFuncSetAttribute(moe_fp8_wide_k<kFc1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin - 1024));
    MX_CUDA(cudaFuncSetAttribute(moe_fp8_wide_k<kFc1, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin - 1024));
  });
  if (p.tile_rows == kMoeTileRowsFp8Wide) launch_grid<kFc1, 2>(p, smem_optin, s);
  else launch_grid<kFc1, 1>(p, smem_optin, s);
}
template void launch_wide<true>(const MoeGemmPrefillParams&, int, cudaStream_t);
template void launch_wide<false>(const MoeGemmPrefillParams&, int, cudaStream_t);

}  // namespace mx::cuda::fp8_moe
