// Decode attention on tensor cores for full-context layers (attention_decode.h): one CTA per (KV head,
// token, split) over kAttnMmaSplits splits, all 8 query heads of the KV head in the CTA.
//
// Why this shape: at long contexts the register kernel runs more CTAs a KV head than fit beside the qkv
// kernel's, so most of them start only as the qkv CTAs leave and then walk pos -> block table -> K/V on
// the layer's critical path (docs/perf.md). Here kAttnMmaSplits CTAs a KV head fit in the free slots
// beside the qkv grid; each copies its whole split's K/V into shared memory before its PDL wait
// (cp.async), and after it has only q, the current key and a few mma to do. The last split of a KV head
// (an atomic ticket) merges the partials, which travel as tagged words (see tagged()).
//
// Math: S = Q K^T and O = P V as mma.sync m16n8k16 (bf16 in, fp32 accumulate) with the 8 heads as rows
// 0-7 and their bf16 rounding residue as rows 8-15: q = q_hi + q_lo and p = p_hi + p_lo, and a thread
// adds its row g and row g + 8 accumulators, so q and p enter with ~16 significant bits instead of bf16's 8
// (K and V are bf16 in the cache: exact). Scores are in log2 units (q pre-scaled).
//
// FP8 cache (kv_cache.h): rows of 64 bytes are copied as they are and widened to f16 (exact) as the
// fragments are built, so the mma run on f16 with (hi, lo) f16 pairs of q and p. A thread's fragment
// values are made contiguous in shared memory by permuting dims (a sum over dims or keys does not care
// in which order it runs): for Q K^T thread t's 4 k-step values lie in bytes 16 t .. 16 t + 15 of a key
// row (one 16-byte load a key for all of them), for P V thread g's 8 output columns are dims 8 g ..
// 8 g + 7 (one 8-byte load a key); the outputs are put back in order as they leave.
#include <string>

#include "kernels/attention_decode/attention_decode.h"
#include "kernels/attention_decode/attention_decode_body.cuh"
#include "kernels/common/async_copy.cuh"
#include "kernels/common/cta_trace.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/kv_fp8.cuh"
#include "kernels/common/l2_prefetch.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/decode/mma_tile.cuh"

namespace mx::cuda {
namespace {

constexpr int D = 64, G = kAttnDecodeGroup, kWarps = 4, kThreads = 32 * kWarps, kChunk = 32;
constexpr int kKeys = kAttnMmaKeys;  // key rows held at once (one pass) at most
constexpr int kRow = D * 2;          // bytes of a key's K (or V) row of one KV head
constexpr int kRow8 = D;             // the same with the FP8 cache
// The K/V rows of a pass, at least the warps' outputs that reuse the buffer.
template <bool kFp8>
constexpr size_t smem_bytes(int pass) {
  return kFp8 ? std::max(size_t(2) * pass * kRow8, size_t(kWarps) * G * D * 4) : size_t(2) * pass * kRow;
}
static_assert(kKeys % kChunk == 0, "passes hold whole chunks");
constexpr int kChunksPerWarp = (kKeys / kChunk + kWarps - 1) / kWarps;  // a warp's chunks in one pass
static_assert(size_t(kWarps) * G * D * 4 <= smem_bytes<false>(kChunk), "the warps' outputs reuse the K/V buffer");

// Byte offset of 16-byte piece c (dims 8c..8c+7) of smem row r: XOR-swizzled so the 8 rows an ldmatrix
// reads for one piece column fall in 8 different bank groups.
__device__ __forceinline__ uint32_t swz(int r, int c) { return uint32_t(r * kRow + ((c ^ (r & 7)) << 4)); }
// FP8 rows: row r at slot r ^ bit 2 of r, so the P V loads of keys 2t (t = 0..3) fall in both halves
// of the banks (a 64-byte row covers only half of them).
__device__ __forceinline__ uint32_t row8(int r) { return uint32_t((r ^ ((r >> 2) & 1)) * kRow8); }

// (hi, lo) bf16x2 pairs of two finite floats: hi = bf16(x), lo = bf16(x - hi), both rounded to nearest even.
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const uint32_t h0 = body::attn_to_bf(x0), h1 = body::attn_to_bf(x1);
  hi = h0 | (h1 << 16);
  lo = uint32_t(body::attn_to_bf(x0 - mma::bf16_lo(h0))) | (uint32_t(body::attn_to_bf(x1 - mma::bf16_lo(h1))) << 16);
}

__device__ __forceinline__ uint32_t f16x2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
// The same as f16x2 pairs (FP8 cache): hi = f16(x), lo = f16(x - hi).
__device__ __forceinline__ void split_pair_f16(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(x0, x1);
  const float2 f = __half22float2(h);
  hi = f16x2_bits(h);
  lo = f16x2_bits(__floats2half2_rn(x0 - f.x, x1 - f.y));
}
__device__ __forceinline__ void split_q(bool fp8, float x0, float x1, uint32_t& hi, uint32_t& lo) {
  if (fp8) split_pair_f16(x0, x1, hi, lo);
  else split_pair(x0, x1, hi, lo);
}
// FP8 P V: the b operands of 8 output columns (bytes of x / y: dims of keys k and k + 1) as f16x2,
// key k in the low half.
__device__ __forceinline__ void v_pairs_f16(uint2 x, uint2 y, uint32_t (&b)[8]) {
  const uint32_t w[4] = {__byte_perm(x.x, y.x, 0x5140), __byte_perm(x.x, y.x, 0x7362),
                         __byte_perm(x.y, y.y, 0x5140), __byte_perm(x.y, y.y, 0x7362)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    b[2 * i] = e4m3x2_to_f16x2(w[i]);
    b[2 * i + 1] = e4m3x2_to_f16x2(w[i] >> 16);
  }
}

constexpr int kPW = int(kAttnMmaPartialWords);  // a split's partial: (max, sum)[G], then output[G][D]
static_assert(kPW == 2 * G + G * D, "attention_decode.h sizes the record for D = 64");
static_assert(G * D == 4 * kThreads, "a thread owns 4 output values of the partial and of the merge");

// Partials travel as 64-bit words, (launch tag << 32) | float bits: a 64-bit access is single-copy atomic,
// so a reader that sees the tag sees the value. The last split then needs no fence before its ticket
// (the ticket's round trip overlaps the partial's stores) and polls the others' words until all carry
// the tag, instead of a release fence, the ticket and the loads one round trip after another.
__device__ __forceinline__ unsigned long long tagged(float v, uint32_t tag) {
  return (static_cast<unsigned long long>(tag) << 32) | __float_as_uint(v);
}
__device__ __forceinline__ void st_relaxed_v2(unsigned long long* p, unsigned long long a, unsigned long long b) {
  asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ void ld_relaxed_v2(const unsigned long long* p, unsigned long long& a,
                                              unsigned long long& b) {
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}
__device__ __forceinline__ uint32_t ld_relaxed_lo(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return uint32_t(v);
}
__device__ __forceinline__ bool has_tag(unsigned long long w, uint32_t tag) { return uint32_t(w >> 32) == tag; }
__device__ __forceinline__ float word_value(unsigned long long w) { return __uint_as_float(uint32_t(w)); }

// The partial of keys [begin, end) of (token row n, KV head kvh) into split `split` of rec, tagged with
// the launch's tag, which it returns. Contains the PDL wait and CTA barriers.
template <bool kFp8>
__device__ __forceinline__ uint32_t split_partial(const AttnDecodeParams& p, int kvh, int n, int pos, int begin,
                                                  int end, unsigned long long* rec, int split) {
  extern __shared__ __align__(128) uint8_t kv_smem[];
  const int pass = p.pass_keys ? p.pass_keys : kKeys;
  constexpr int kRowB = kFp8 ? kRow8 : kRow, kPieces = kRowB / 16;
  uint8_t* ks = kv_smem;
  uint8_t* vs = kv_smem + pass * kRowB;
  __shared__ int bts[kKeys + 1];
  __shared__ float wm[kWarps][G], wl[kWarps][G];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int bs = p.kv.block_size;
  const int32_t* bt = p.block_tables + ld_keep(p.bt_off + n);

  // Keys [k0, k1) into smem rows 0.. (the block-table entries staged first: one round trip, not one a
  // key); rows up to the next whole chunk are zero-filled, since a masked P of 0 times a non-finite
  // stale V would still poison O. `skip`: a key not to read (written by the kernel before the wait).
  auto load_pass = [&](int k0, int k1, int skip) {
    const int b0 = k0 / bs, nb = (k1 - 1) / bs - b0 + 1;
    for (int i = tid; i < nb; i += kThreads) bts[i] = ld_keep(bt + b0 + i);
    __syncthreads();
    const int rows = (k1 - k0 + kChunk - 1) / kChunk * kChunk;
    for (int i = tid; i < rows * kPieces; i += kThreads) {
      const int r = i >> (kFp8 ? 2 : 3), c = i & (kPieces - 1), j = k0 + r;
      if (j == skip) continue;  // filled after the wait
      const bool valid = j < k1;
      if constexpr (kFp8) {
        const size_t off = valid ? ((size_t(bts[j / bs - b0]) * bs + j % bs) * p.Hkv + kvh) * D + 16 * c : 0;
        cp_async16(ks + row8(r) + 16 * c, p.kv.k_fp8() + off, valid);
        cp_async16(vs + row8(r) + 16 * c, p.kv.v_fp8() + off, valid);
      } else {
        const size_t off = valid ? ((size_t(bts[j / bs - b0]) * bs + j % bs) * p.Hkv + kvh) * D + 8 * c : 0;
        cp_async16(ks + swz(r, c), p.kv.k_bf16() + off, valid);
        cp_async16(vs + swz(r, c), p.kv.v_bf16() + off, valid);
      }
    }
    cp_async_commit();
  };
  const int k1_first = min(end, begin + pass);
  const bool early = p.kv_stable;  // keys before pos are final: read them while the qkv kernel runs
  if (early) load_pass(begin, k1_first, pos);
  TracedPdlWait{p.trace.buf}();
  if (!early) {
    load_pass(begin, k1_first, -1);
  } else if (pos < k1_first && tid < kPieces) {  // the current key, written by the kernel before
    const int r = pos - begin;
    const size_t row = (size_t(bts[pos / bs - begin / bs]) * bs + pos % bs) * p.Hkv + kvh;
    if constexpr (kFp8) {
      cp_async16(ks + row8(r) + 16 * tid, p.kv.k_fp8() + row * D + 16 * tid);
      cp_async16(vs + row8(r) + 16 * tid, p.kv.v_fp8() + row * D + 16 * tid);
    } else {
      const size_t off = row * D + 8 * tid;
      cp_async16(ks + swz(r, tid), p.kv.k_bf16() + off);
      cp_async16(vs + swz(r, tid), p.kv.v_bf16() + off);
    }
    cp_async_commit();
  }

  // After the wait: the previous launch on this record has finished, and its last split counted it.
  const uint32_t tag = ld_relaxed_lo(rec + kAttnMmaSplits * kPW) + 1;

  // Q fragments (A operand, 4 k-steps of 16 dims): row g = head g's bf16 part, row g + 8 its residue.
  // FP8: k-step kk's columns 2t, 2t + 1, 2t + 8, 2t + 9 are dims 16 t + 4 kk .. 16 t + 4 kk + 3.
  uint32_t qa[4][4];
  {
    const float* qp = p.q + size_t(n) * p.q_stride + size_t(kvh * G + g) * D + (kFp8 ? 16 * t : 2 * t);
    float2 qv[4][2];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if constexpr (kFp8) {
        const float4 v = *reinterpret_cast<const float4*>(qp + 4 * kk);
        qv[kk][0] = make_float2(v.x, v.y);
        qv[kk][1] = make_float2(v.z, v.w);
      } else {
        qv[kk][0] = *reinterpret_cast<const float2*>(qp + 16 * kk);
        qv[kk][1] = *reinterpret_cast<const float2*>(qp + 16 * kk + 8);
      }
    }
    const float qscale = body::kLog2e * rsqrtf(float(D));
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      split_q(kFp8, qv[kk][0].x * qscale, qv[kk][0].y * qscale, qa[kk][0], qa[kk][1]);
      split_q(kFp8, qv[kk][1].x * qscale, qv[kk][1].y * qscale, qa[kk][2], qa[kk][3]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  float m = -INFINITY, l = 0.f;  // head g's running max and (this thread's part of the) sum
  float o[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  for (int k0 = begin; k0 < end; k0 += pass) {
    const int k1 = min(end, k0 + pass);
    if (k0 != begin) {  // long contexts: the next pass after the previous one's reads
      __syncthreads();
      load_pass(k0, k1, -1);
      cp_async_wait<0>();
      __syncthreads();
    }
    // This warp's chunks of the pass (c = k0 + 32 (warp + 4 i)) as one batch: the scores of all of them,
    // one max, then P V, so the chunks' mma chains overlap instead of queueing behind an online softmax
    // step each.
    const int nch = (k1 - k0 - warp * kChunk + kWarps * kChunk - 1) / (kWarps * kChunk);
    float s[kChunksPerWarp][4][4];
#pragma unroll
    for (int ch = 0; ch < kChunksPerWarp; ++ch)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[ch][j][0] = s[ch][j][1] = s[ch][j][2] = s[ch][j][3] = 0.f;
    // S = Q K^T, 32 keys a chunk: 4 n-tiles of 8 keys; ldmatrix x4 gives b0 / b1 of two n-tiles.
#pragma unroll
    for (int ch = 0; ch < kChunksPerWarp; ++ch) {
      if (ch >= nch) break;
      const int r0 = (warp + kWarps * ch) * kChunk;
      if constexpr (kFp8) {  // n-tile j = keys r0 + 8 j ..: key r0 + 8 j + g's 16 bytes for all 4 k-steps
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint4 kw = *reinterpret_cast<const uint4*>(ks + row8(r0 + 8 * j + g) + 16 * t);
          const uint32_t w[4] = {kw.x, kw.y, kw.z, kw.w};
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            mma::mma_16816_f16(s[ch][j], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], e4m3x2_to_f16x2(w[kk]),
                               e4m3x2_to_f16x2(w[kk] >> 16));
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int jp = 0; jp < 2; ++jp) {
            const int mi = lane >> 3, key = r0 + jp * 16 + (lane & 7) + (mi >> 1) * 8, pc = kk * 2 + (mi & 1);
            uint32_t b[4];
            ldmatrix_x4(b[0], b[1], b[2], b[3], ks + swz(key, pc));
            mma::mma_16816(s[ch][2 * jp], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b[0], b[1]);
            mma::mma_16816(s[ch][2 * jp + 1], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b[2], b[3]);
          }
      }
    }
    // Row g's score of key r0 + 8j + 2t + e is s[j][e] + s[j][e + 2] (its bf16 part and residue).
    float cmax = -INFINITY;
#pragma unroll
    for (int ch = 0; ch < kChunksPerWarp; ++ch)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = k0 + (warp + kWarps * ch) * kChunk + 8 * j + 2 * t + e;
          s[ch][j][e] = ch < nch && key < k1 ? s[ch][j][e] + s[ch][j][e + 2] : -INFINITY;
          cmax = fmaxf(cmax, s[ch][j][e]);
        }
    if (nch == 0) continue;  // warp-uniform: no keys for this warp in this pass
    cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, 1));
    cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, 2));
    const float mn = fmaxf(m, cmax);  // finite: the warp's first key is in range
    const float corr = exp2f(m - mn);
    m = mn;
    // P as the A operand of P V, k-step kk = keys 16 kk ..: (hi, lo) of n-tile 2 kk then of 2 kk + 1.
    uint32_t pa[kChunksPerWarp][2][4];
    float psum = 0.f;
#pragma unroll
    for (int ch = 0; ch < kChunksPerWarp; ++ch)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p0 = exp2f(s[ch][j][0] - mn), p1 = exp2f(s[ch][j][1] - mn);
        psum += p0 + p1;
        split_q(kFp8, p0, p1, pa[ch][j >> 1][(j & 1) * 2], pa[ch][j >> 1][(j & 1) * 2 + 1]);
      }
    l = l * corr + psum;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      o[j][0] *= corr; o[j][1] *= corr; o[j][2] *= corr; o[j][3] *= corr;
    }
    // O += P V: V rows are keys (k), columns dims (n): the transposed ldmatrix gives the col operand.
#pragma unroll
    for (int ch = 0; ch < kChunksPerWarp; ++ch) {
      if (ch >= nch) break;
      const int r0 = (warp + kWarps * ch) * kChunk;
      if constexpr (kFp8) {  // k-step kk: keys r0 + 16 kk + (2t, 2t + 1, 2t + 8, 2t + 9), dims 8 g .. 8 g + 7
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          const int key = r0 + 16 * kk + 2 * t;
          uint32_t b0[8], b1[8];
          v_pairs_f16(*reinterpret_cast<const uint2*>(vs + row8(key) + 8 * g),
                      *reinterpret_cast<const uint2*>(vs + row8(key + 1) + 8 * g), b0);
          v_pairs_f16(*reinterpret_cast<const uint2*>(vs + row8(key + 8) + 8 * g),
                      *reinterpret_cast<const uint2*>(vs + row8(key + 9) + 8 * g), b1);
#pragma unroll
          for (int j = 0; j < 8; ++j)
            mma::mma_16816_f16(o[j], pa[ch][kk][0], pa[ch][kk][1], pa[ch][kk][2], pa[ch][kk][3], b0[j], b1[j]);
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
          for (int jp = 0; jp < 4; ++jp) {
            const int mi = lane >> 3, key = r0 + kk * 16 + (lane & 7) + (mi & 1) * 8, pc = jp * 2 + (mi >> 1);
            uint32_t b[4];
            ldmatrix_x4_trans(b[0], b[1], b[2], b[3], vs + swz(key, pc));
            mma::mma_16816(o[2 * jp], pa[ch][kk][0], pa[ch][kk][1], pa[ch][kk][2], pa[ch][kk][3], b[0], b[1]);
            mma::mma_16816(o[2 * jp + 1], pa[ch][kk][0], pa[ch][kk][1], pa[ch][kk][2], pa[ch][kk][3], b[2], b[3]);
          }
      }
    }
  }
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);

  // The warps' (max, sum, output) into shared memory (the K/V buffer, now read), then the split's partial.
  __syncthreads();
  float* wo = reinterpret_cast<float*>(kv_smem);  // [kWarps][G][D]
  if (t == 0) { wm[warp][g] = m; wl[warp][g] = l; }
#pragma unroll
  for (int j = 0; j < 8; ++j) {  // output column 2t + e of n-tile j: dim 8 j + 2t + e, or (FP8) 8 (2t + e) + j
    float* wp = wo + (warp * G + g) * D + (kFp8 ? 16 * t + j : 8 * j + 2 * t);
    wp[0] = o[j][0] + o[j][2];
    wp[kFp8 ? 8 : 1] = o[j][1] + o[j][3];
  }
  __syncthreads();
  {
    const int h = tid / (D / 4), d = 4 * (tid % (D / 4));  // this thread's 4 values
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, wm[w][h]);
    float acc[4] = {0.f, 0.f, 0.f, 0.f}, sum = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      if (wm[w][h] == -INFINITY) continue;  // a warp without keys
      const float f = exp2f(wm[w][h] - mx);
      const float4 v = *reinterpret_cast<const float4*>(wo + (w * G + h) * D + d);
      acc[0] += f * v.x; acc[1] += f * v.y; acc[2] += f * v.z; acc[3] += f * v.w;
      sum += f * wl[w][h];
    }
    unsigned long long* dst = rec + size_t(split) * kPW;
    st_relaxed_v2(dst + 2 * G + 4 * tid, tagged(acc[0], tag), tagged(acc[1], tag));
    st_relaxed_v2(dst + 2 * G + 4 * tid + 2, tagged(acc[2], tag), tagged(acc[3], tag));
    if (d == 0) st_relaxed_v2(dst + 2 * h, tagged(mx, tag), tagged(sum, tag));
  }
  return tag;
}

// The last split merges the nsplit partials of rec with the sink: thread tid owns output values 4 tid ..
// 4 tid + 3 (head tid / 16) and loads their words and its head's (max, sum) of every split at once, then
// reloads any split whose words do not carry the tag yet (stores still in flight). Then it counts the
// launch on the record.
__device__ __forceinline__ void merge_tagged(const AttnDecodeParams& p, unsigned long long* rec, uint32_t tag,
                                             int nsplit, int kvh, int n) {
  const int tid = threadIdx.x, h = tid / (D / 4);
  const float sink = bf(p.sinks[kvh * G + h]) * body::kLog2e;
  unsigned long long w[kAttnMmaSplits][6];
  auto load = [&](int sp) {
    const unsigned long long* src = rec + size_t(sp) * kPW;
    ld_relaxed_v2(src + 2 * h, w[sp][0], w[sp][1]);
    ld_relaxed_v2(src + 2 * G + 4 * tid, w[sp][2], w[sp][3]);
    ld_relaxed_v2(src + 2 * G + 4 * tid + 2, w[sp][4], w[sp][5]);
  };
  auto ready = [&](int sp) {
    bool ok = true;
#pragma unroll
    for (int i = 0; i < 6; ++i) ok &= has_tag(w[sp][i], tag);
    return ok;
  };
  // Every split not yet seen with the tag is reloaded in the same round: one round trip a round.
  uint32_t pending = (1u << nsplit) - 1;
  while (pending) {
#pragma unroll
    for (int sp = 0; sp < kAttnMmaSplits; ++sp)
      if (pending >> sp & 1) load(sp);
#pragma unroll
    for (int sp = 0; sp < kAttnMmaSplits; ++sp)
      if ((pending >> sp & 1) && ready(sp)) pending &= ~(1u << sp);
  }
  float mx = sink;
#pragma unroll
  for (int sp = 0; sp < kAttnMmaSplits; ++sp)
    if (sp < nsplit) mx = fmaxf(mx, word_value(w[sp][0]));
  float dn = exp2f(sink - mx), acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int sp = 0; sp < kAttnMmaSplits; ++sp) {
    if (sp >= nsplit) break;
    const float f = exp2f(word_value(w[sp][0]) - mx);  // a split always has keys: its max is finite
    dn += f * word_value(w[sp][1]);
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += f * word_value(w[sp][2 + i]);
  }
  uint2 o;
  o.x = uint32_t(body::attn_to_bf(acc[0] / dn)) | uint32_t(body::attn_to_bf(acc[1] / dn)) << 16;
  o.y = uint32_t(body::attn_to_bf(acc[2] / dn)) | uint32_t(body::attn_to_bf(acc[3] / dn)) << 16;
  *reinterpret_cast<uint2*>(p.out + size_t(n) * p.Hq * D + size_t(kvh * G) * D + 4 * tid) = o;
  __syncthreads();  // every thread has seen its words with this tag: the next launch may take the next one
  if (tid == 0) rec[kAttnMmaSplits * kPW] = tag;
}

template <bool kFp8>
__global__ void __launch_bounds__(kThreads) attn_decode_mma_k(AttnDecodeParams p) {
  __shared__ bool last;
  trace_begin(p.trace);
  const int kvh = blockIdx.x, qi = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
  const int n = p.rows ? p.rows[qi] : qi;
  if (tid == 0) l2_prefetch_keep(p.sinks + kvh * G, G * 2);  // read by the merge
  const int pos = ld_keep(p.pos + n), lo = p.window > 0 ? max(0, pos - p.window + 1) : 0, nk = pos - lo + 1;
  const int per = attention_decode_mma_keys_per_split(nk, gridDim.z), nsplit = (nk + per - 1) / per;
  // A split past the context leaves before the wait and is not counted by the ticket.
  if (split >= nsplit) {
    trace_end(p.trace, 1);
    return;
  }
  const int begin = lo + split * per, end = min(pos + 1, begin + per);
  unsigned long long* rec = p.mma_partials + (size_t(qi) * p.Hkv + kvh) * kAttnMmaRecordWords;
  const uint32_t tag = split_partial<kFp8>(p, kvh, n, pos, begin, end, rec, split);
  // The ticket only elects the merging CTA (the last to arrive); the tags order the data (see tagged()).
  // A DSMEM merge in a cluster of the 8 splits starts late (clusters of 8 CTAs rarely all find room beside
  // the qkv grid), and split 0 polling without a ticket costs more at larger batches (docs/perf.md).
  __syncthreads();
  int* ticket = p.tickets + qi * p.Hkv + kvh;
  if (tid == 0) last = atomicAdd(ticket, 1) == nsplit - 1;
  __syncthreads();
  if (last) {
    merge_tagged(p, rec, tag, nsplit, kvh, n);
    if (tid == 0) *ticket = 0;  // ready for the next launch / graph replay
  }
  trace_end(p.trace, 1);
}

template <bool kFp8>
void launch(const AttnDecodeParams& p, cudaStream_t s) {
  static std::atomic<unsigned long long> ready{0};
  once_per_device(ready, [] {
    MX_CUDA(cudaFuncSetAttribute(attn_decode_mma_k<kFp8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(smem_bytes<kFp8>(kKeys))));
  });
  const dim3 grid(p.Hkv, p.M, p.splits ? p.splits : kAttnMmaSplits);
  if (p.pass_keys)
    launch_pdl_carveout(100, attn_decode_mma_k<kFp8>, grid, dim3(kThreads), smem_bytes<kFp8>(p.pass_keys), s, p);
  else
    launch_pdl(attn_decode_mma_k<kFp8>, grid, dim3(kThreads), smem_bytes<kFp8>(kKeys), s, p);
}

}  // namespace

void attention_decode_mma(const AttnDecodeParams& p, cudaStream_t s) {
  require_kv(p.kv, "attention_decode_mma");
  if (p.D != D) throw_error("attention_decode_mma: head_dim " + std::to_string(p.D) + " is not instantiated (64)");
  if (p.Hq != G * p.Hkv) throw_error("attention_decode_mma: needs 8 query heads per KV head");
  if (!p.mma_partials) throw_error("attention_decode_mma: mma_partials (attention_decode_mma_scratch_words) not set");
  if (p.splits < 0 || p.splits > kAttnMmaSplits) throw_error("attention_decode_mma: splits out of range");
  if (p.pass_keys && (p.pass_keys < kChunk || p.pass_keys > kKeys || p.pass_keys % kChunk))
    throw_error("attention_decode_mma: pass_keys must be a multiple of 32 in [32, " + std::to_string(kKeys) + "]");
  if (p.kv.fp8()) launch<true>(p, s);
  else launch<false>(p, s);
}

}  // namespace mx::cuda
