// Quantized dense weights on the GPU (--mxfp4-layers, --fp8-layers): bf16 rows quantized at load, bit for
// bit as core/dense_quant.h's host functions do (mxfp4_pack_row, fp8_pack_row), and widened back to bf16
// (exact: every quantized value is a bf16) for the prefill GEMMs. All pointers are device pointers.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/dense_weight.h"

namespace mx::cuda {

// Where quantize_dense_rows writes (the mutable view of a DenseWeight).
struct DenseWeightOut {
  DenseFormat fmt = DenseFormat::kMxfp4;
  uint8_t* data = nullptr;
  uint8_t* scales = nullptr;   // kMxfp4: E8M0 [N, K/32]
  float* row_scale = nullptr;  // kFp8: [N]
};

// Rows [row0, row0 + rows) of `dst` (K columns) from bf16 src [rows, K]. kMxfp4 needs K % 32 == 0.
// fmt kBf16 is an error (copy instead).
void quantize_dense_rows(const uint16_t* src, int rows, int K, const DenseWeightOut& dst, size_t row0, cudaStream_t s);

// bf16 dst [rows, K] = rows [row0, row0 + rows) of w, decoded (any format; bf16 is a copy).
void dequantize_dense_rows(const DenseWeight& w, size_t row0, int rows, int K, uint16_t* dst, cudaStream_t s);

}  // namespace mx::cuda
