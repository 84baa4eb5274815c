// bf16 GEMM through cuBLASLt for the prefill path: Y[M,N] (+)= X[M,K] . W[N,K]^T + bias[N].
// W is a PyTorch [out, in] weight (row-major), X/Y row-major. fp32 accumulate; Y bf16 or fp32.
// A GemmContext owns the cuBLASLt handle and workspace (created once) and caches, per shape,
// the matmul descriptor, layouts and heuristic algorithm: no allocation per call after warm-up.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace mx::cuda {

struct GemmContext;  // opaque

GemmContext* gemm_context_create(size_t workspace_bytes = size_t(32) << 20);
void gemm_context_destroy(GemmContext* ctx);

struct GemmBf16Params {
  const uint16_t* x = nullptr;     // bf16 [M, K]
  const uint16_t* w = nullptr;     // bf16 [N, K]
  const uint16_t* bias = nullptr;  // bf16 [N] or null
  void* y = nullptr;               // [M, N], bf16 (uint16_t) or fp32 (y_f32)
  int M = 0, N = 0, K = 0;
  bool y_f32 = false;              // fp32 output (lm_head logits, residual stream)
  bool accumulate = false;         // Y += X W^T (+ bias): residual add
  int ldy = 0;                     // Y's row stride in elements (0: N), e.g. a column slice of wider rows
};
// Throws mx::Error if cuBLASLt has no algorithm for the shape. K, N must be multiples of 8; a bias needs
// ldy 0 or N.
void gemm_bf16(GemmContext* ctx, const GemmBf16Params& p, cudaStream_t s);

// CPU reference (double accumulate), same semantics; x/w/bias bf16, y fp32 (bf16-rounded if !y_f32).
void gemm_bf16_ref(const uint16_t* x, const uint16_t* w, const uint16_t* bias, float* y, int M, int N, int K,
                   bool round_bf16, bool accumulate);

}  // namespace mx::cuda
