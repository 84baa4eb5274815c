// Grouped MoE for prefill (many tokens) on MXFP4 experts.
//  1. moe_route_prefill: top-k choices -> per-expert contiguous lists (deterministic counting sort:
//     within an expert, entries keep (token, slot) order) + a tile list of (expert, row0), tiles of
//     64 rows (prefill; 64 or 128 on the FP8 path) or 16 (wide decode steps: moe_prefill_tile_rows).
//  2. moe_fc1_prefill: act[r] = SwiGLU(W1[e] . x[tok[r]] + b1[e]) for sorted rows r; bf16 tensor cores
//     (mma.sync), MXFP4 dequantized in registers (weights are never expanded in memory). K % 64 == 0.
//  3. moe_fc2_prefill: y_slot[slot[r]] = gate[r] * (W2[e] . act[r] + b2[e])   (fp32, one row per (token, slot))
//  4. moe_combine_prefill: resid[t] += sum_j y_slot[t * k + j]   (fixed order: deterministic)
// MXFP4 layout (spec 3.4): blocks [E, N, K/32, 16] bytes, scales [E, N, K/32] (E8M0), bias bf16 [E, N].
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace mx::cuda {

// Sorted rows are cut into tiles of one expert. Prefill tiles hold 64 rows (on the FP8 path, which converts
// an expert's weights once a tile, 128 above kMoeFp8NarrowRowsPerExpert rows an expert; its 64-row tiles, one
// token sub-tile, run a deeper stage ring and a B-copy warpgroup); a wide decode step gives most experts a
// few rows, and there 16-row tiles stream the weights with far less token staging. The FP8 path's sparse
// tiles hold 24 rows above kMoeFp8SparseRowsPerExpert rows an expert: near 16 an expert, 16-row tiles would
// cut about half the experts in two and read their weights twice.
constexpr int kMoeTileRowsPrefill = 64, kMoeTileRowsSparse = 16, kMoeTileRowsFp8Wide = 128, kMoeTileRowsFp8Narrow = 64;
constexpr int kMoeTileRowsFp8Sparse = 24;
constexpr int kMoeSparseRowsPerExpert = 16;  // the average rows an expert gets, up to which tiles are sparse
constexpr int kMoeFp8SparseRowsPerExpert = 8;  // ... above which FP8 sparse tiles hold 24 rows
constexpr int kMoeFp8NarrowRowsPerExpert = 48;  // ... up to which FP8 tiles hold 64 rows

inline int moe_prefill_tile_rows(int T, int k, int E, bool fp8 = false) {
  if (T * k <= kMoeSparseRowsPerExpert * E)
    return fp8 && T * k > kMoeFp8SparseRowsPerExpert * E ? kMoeTileRowsFp8Sparse : kMoeTileRowsSparse;
  if (!fp8) return kMoeTileRowsPrefill;
  return T * k <= kMoeFp8NarrowRowsPerExpert * E ? kMoeTileRowsFp8Narrow : kMoeTileRowsFp8Wide;
}
// Tiles of a T-token step: at most T*k/rows + E (each expert's last tile may be partial).
inline int moe_prefill_max_tiles(int T, int k, int E, bool fp8 = false) {
  const int rows = moe_prefill_tile_rows(T, k, E, fp8);
  return (T * k + rows - 1) / rows + E;
}
// The most tiles any step of up to T tokens has (the scratch the memory plan sizes; 64-row tiles, the
// most of either path).
inline int moe_prefill_tile_bound(int T, int k, int E) {
  const int sparse_rows = T * k < kMoeSparseRowsPerExpert * E ? T * k : kMoeSparseRowsPerExpert * E;
  const int sparse = (sparse_rows + kMoeTileRowsSparse - 1) / kMoeTileRowsSparse + E;
  const int dense = moe_prefill_max_tiles(T, k, E);
  return sparse > dense ? sparse : dense;
}

struct MoeRouteParams {
  const int32_t* topk_idx = nullptr;  // [T, k] expert ids
  const float* topk_w = nullptr;      // [T, k] gate weights
  int T = 0, k = 4, E = 128;
  // outputs (device scratch)
  int32_t* counts = nullptr;     // [E]
  int32_t* offsets = nullptr;    // [E + 1]
  int32_t* sorted_tok = nullptr; // [T * k] token index of sorted row r
  int32_t* sorted_slot = nullptr;// [T * k] t * k + j
  float* sorted_w = nullptr;     // [T * k]
  int32_t* tile_expert = nullptr;// [max_tiles]
  int32_t* tile_row0 = nullptr;  // [max_tiles] first sorted row of the tile
  int32_t* num_tiles = nullptr;  // [1]
  int max_tiles = 0;
  int tile_rows = kMoeTileRowsPrefill;  // kMoeTileRowsPrefill (= kMoeTileRowsFp8Narrow), kMoeTileRowsFp8Wide or kMoeTileRowsSparse
  // Expert parallelism: tiles only for experts [expert_lo, expert_hi), whose weights this GPU holds.
  int expert_lo = 0, expert_hi = 1 << 30;
};
void moe_route_prefill(const MoeRouteParams& p, cudaStream_t s);

struct MoeGemmPrefillParams {
  const uint8_t* blocks = nullptr;  // [E, N, K/32, 16]
  const uint8_t* scales = nullptr;  // [E, N, K/32]
  const uint16_t* bias = nullptr;   // bf16 [E, N]
  const uint16_t* x = nullptr;      // FC1: bf16 [T, K] (gathered by sorted_tok); FC2: act bf16 [T*k, K] (sorted rows)
  const int32_t* sorted_tok = nullptr;
  const int32_t* sorted_slot = nullptr;
  const float* sorted_w = nullptr;
  const int32_t* offsets = nullptr;
  const int32_t* tile_expert = nullptr;
  const int32_t* tile_row0 = nullptr;
  const int32_t* num_tiles = nullptr;
  int max_tiles = 0;
  int tile_rows = kMoeTileRowsPrefill;  // as the route's: picks the kernel's tile height
  int max_ctas = 0;  // FP8: the persistent grid's CTAs (0: as many as the SMs hold; tests take fewer)
  uint16_t* act = nullptr;          // FC1 out: bf16 [T*k, N/2] (sorted rows)
  float* y_slot = nullptr;          // FC2 out: fp32 [T*k, N] indexed by slot
  int N = 0, K = 0;                 // FC1: N = 5760, K = 2880; FC2: N = 2880, K = 2880
  float alpha = 1.702f, limit = 7.0f;
  // The FP8 path (moe_fc1_fp8 / moe_fc2_fp8): FC1 reads xq (per token) and xinv, writes act_q; FC2
  // reads act_q as its xq (sorted rows).
  const uint8_t* xq = nullptr;      // e4m3 hi/lo rows [rows, moe_fp8_row_bytes(K)]
  const float* xinv = nullptr;      // FC1: [T] 2^-xs of each token's hi/lo rows
  uint8_t* act_q = nullptr;         // FC1 out: [T*k, moe_fp8_row_bytes(N / 2)] (sorted rows)
  const uint8_t* row_smax = nullptr;  // FP8 paths: [E, N] each weight row's largest scale (moe_row_max_scale)
};
void moe_fc1_prefill(const MoeGemmPrefillParams& p, cudaStream_t s);
void moe_fc2_prefill(const MoeGemmPrefillParams& p, cudaStream_t s);
// resid fp32 [T, H] += sum_j y_slot[t*k + j]; with topk_idx, only the slots routed to experts
// [expert_lo, expert_hi) (expert parallelism: the others were computed on another GPU).
void moe_combine_prefill(const float* y_slot, float* resid, int T, int k, int H, cudaStream_t s,
                         const int32_t* topk_idx = nullptr, int expert_lo = 0, int expert_hi = 1 << 30);

// ---- Wide steps on FP8 tensor cores (sm_90a wgmma; moe_fp8_device.cuh has the why) ----
// Operands are e4m3 hi/lo rows: x 2^xs = hi + lo, the hi row then the lo row, each moe_fp8_kpad(K)
// bytes with value v at moe_fp8_pos(v) (the k order the kernel's A fragments take), zeros past K.
// Tiles of kMoeTileRowsSparse, kMoeTileRowsFp8Sparse, kMoeTileRowsFp8Narrow or kMoeTileRowsFp8Wide rows
// (moe_prefill_tile_rows(T, k, E, true)).
constexpr float kMoeFp8ActScale = 4.f;  // FC2's operand: |SwiGLU| <= limit * (limit + 1) = 56 -> 224 < 448
__host__ __device__ inline int moe_fp8_kpad(int K) { return (K + 127) / 128 * 128; }
__host__ __device__ inline int moe_fp8_pos(int v) {
  return (4 * (v >> 7) + ((v >> 3) & 3)) * 32 + 16 * ((v >> 2) & 1) + 4 * ((v >> 5) & 3) + (v & 3);
}
// The value at position pos (moe_fp8_pos's inverse).
__host__ __device__ inline int moe_fp8_value(int pos) {
  const int ks = pos >> 5, kk = pos & 31;
  return 128 * (ks >> 2) + 32 * ((kk >> 2) & 3) + 8 * (ks & 3) + 4 * (kk >> 4) + (kk & 3);
}
inline size_t moe_fp8_row_bytes(int K) { return 2 * size_t(moe_fp8_kpad(K)); }
bool moe_fp8_available();  // the current device runs the sm_90a kernels
// xq [T, moe_fp8_row_bytes(K)] and xinv [T] from bf16 x [T, K] (one power-of-two scale a row).
void moe_quant_fp8(const uint16_t* x, int T, int K, uint8_t* xq, float* xinv, cudaStream_t s);
// out [rows] = the largest of each row's G E8M0 scales (scales [rows, G]): the FP8 path's per-row
// reference, found once when the weights are loaded.
void moe_row_max_scale(const uint8_t* scales, size_t rows, int G, uint8_t* out, cudaStream_t s);
void moe_fc1_fp8(const MoeGemmPrefillParams& p, cudaStream_t s);
void moe_fc2_fp8(const MoeGemmPrefillParams& p, cudaStream_t s);

// CPU reference of the whole block (host pointers): resid[t] += sum_j w * (W2 . swiglu(W1 . x + b1) + b2),
// with x and the activation rounded to bf16 like the GPU path.
void moe_prefill_ref(const uint8_t* b1, const uint8_t* s1, const uint16_t* bias1, const uint8_t* b2,
                     const uint8_t* s2, const uint16_t* bias2, const uint16_t* x, const int32_t* idx,
                     const float* w, float* resid, int T, int k, int H, int I, float alpha, float limit);

}  // namespace mx::cuda
