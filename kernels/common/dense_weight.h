// A dense weight matrix W [N, K] on the device, in the format --mxfp4-layers / --fp8-layers chose
// (core/dense_format.h, numerics in core/dense_quant.h):
//   kBf16 : data = bf16 [N, K], the checkpoint's values
//   kMxfp4: data = E2M1 blocks [N, K/2] (low nibble = even k), scales = E8M0 [N, K/32] (mx_scales())
//   kFp8  : data = E4M3 [N, K], scales = fp32 [N] (row_scale(); W[n, k] = e4m3 * row_scale[n], a power of two)
// 24 bytes: a larger struct in the kernels' parameters cost the bf16 o-proj kernel spills (docs/perf.md).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

#include "core/dense_format.h"

namespace mx::cuda {

struct DenseWeight {
  DenseFormat fmt = DenseFormat::kBf16;
  const void* data = nullptr;
  const void* scales = nullptr;
  __host__ __device__ const uint16_t* bf16() const { return static_cast<const uint16_t*>(data); }
  __host__ __device__ const uint8_t* bytes() const { return static_cast<const uint8_t*>(data); }
  __host__ __device__ const uint8_t* mx_scales() const { return static_cast<const uint8_t*>(scales); }
  __host__ __device__ const float* row_scale() const { return static_cast<const float*>(scales); }
  // Rows [r0, ...) as a matrix of their own (a vocabulary slice of lm_head, one of q / k / v).
  DenseWeight rows_from(size_t r0, int K) const {
    DenseWeight w = *this;
    if (fmt == DenseFormat::kBf16) w.data = bf16() + r0 * size_t(K);
    else if (fmt == DenseFormat::kMxfp4) w.data = bytes() + r0 * size_t(K / 2), w.scales = mx_scales() + r0 * size_t(K / 32);
    else w.data = bytes() + r0 * size_t(K), w.scales = row_scale() + r0;
    return w;
  }
};

__host__ __device__ inline DenseWeight bf16_weight(const uint16_t* w) { return DenseWeight{DenseFormat::kBf16, w, nullptr}; }

// Bytes of W [N, K] in `fmt`: the values, and the scales (E8M0 bytes or fp32 row scales).
inline size_t dense_value_bytes(DenseFormat fmt, size_t N, size_t K) {
  return fmt == DenseFormat::kBf16 ? N * K * 2 : fmt == DenseFormat::kMxfp4 ? N * K / 2 : N * K;
}
inline size_t dense_scale_bytes(DenseFormat fmt, size_t N, size_t K) {
  return fmt == DenseFormat::kMxfp4 ? N * K / 32 : fmt == DenseFormat::kFp8 ? N * 4 : 0;
}

}  // namespace mx::cuda
