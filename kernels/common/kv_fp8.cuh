// FP8 E4M3 KV values on the device (kv_cache.h): the writers' rounding and the readers' exact widening.
// The hardware conversions (sm_89+) round to nearest even and saturate at 448 like core/fp8.h.
#pragma once
#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace mx::cuda {

__device__ __forceinline__ uint8_t kv_to_e4m3(float x) {
  return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}
// Two E4M3 values (the first in the low byte) as f16x2 (the first in the low half); exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t two) {
  const uint32_t h = e4m3x2_to_f16x2(two);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

}  // namespace mx::cuda
