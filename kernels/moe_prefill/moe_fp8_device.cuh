// What the FP8 MoE's kernel families share: the weights' E2M1 -> e4m3 conversion with the block scale folded
// in, and the epilogue. The families: moe_fp8_sparse.cu (tiles of up to 16 or 24 sorted rows of one expert: decode
// steps of 5-256 distinct sequences, short prompt chunks) and moe_fp8_wide.cu (tiles of 64 or 128 rows:
// prefill, the widest decode steps); moe_fp8.cu has the entry points (moe_prefill.h) and hands each tile
// height to its family.
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
//   - Sparse tiles: wgmma m64n32k32 (n48) with A from registers and B (the tile's 16 (24) tokens x
//     hi/lo, all of K, staged once per CTA) from shared memory; a CTA is four warpgroups = 256 weight
//     rows (moe_fp8_sparse.cu). Prefill tiles: producer warpgroups and both operands in shared memory
//     (moe_fp8_wide.cu).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/moe_prefill/moe_prefill.h"

namespace mx::cuda::fp8_moe {

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

// Each family's launch, after moe_fp8.cu's checks (smem_optin: the device's opt-in shared memory a CTA);
// each sets its kernels' shared-memory limit once a device.
template <bool kFc1>
void launch_sparse(const MoeGemmPrefillParams& p, int smem_optin, cudaStream_t s);
template <bool kFc1>
void launch_wide(const MoeGemmPrefillParams& p, int smem_optin, cudaStream_t s);

}  // namespace mx::cuda::fp8_moe
