#include "kernels/comm/bf16_wire.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/common/cuda_check.h"

namespace mx::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint16_t to_bf16(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
__device__ __forceinline__ float from_bf16(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

// Four values a thread where in and out are 16- / 8-byte aligned (n4 quads), the rest one at a time.
__global__ void pack_k(float* in, uint16_t* out, size_t n, size_t n4, int zero_in) {
  const size_t stride = size_t(gridDim.x) * kThreads;
  for (size_t q = size_t(blockIdx.x) * kThreads + threadIdx.x; q < n4; q += stride) {
    float4 v = reinterpret_cast<const float4*>(in)[q];
    reinterpret_cast<uint2*>(out)[q] =
        make_uint2(uint32_t(to_bf16(v.x)) | uint32_t(to_bf16(v.y)) << 16, uint32_t(to_bf16(v.z)) | uint32_t(to_bf16(v.w)) << 16);
    if (zero_in) reinterpret_cast<float4*>(in)[q] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (size_t i = 4 * n4 + size_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    out[i] = to_bf16(in[i]);
    if (zero_in) in[i] = 0.f;
  }
}

__global__ void unpack_k(const uint16_t* in, float* out, size_t n, size_t n4) {
  const size_t stride = size_t(gridDim.x) * kThreads;
  for (size_t q = size_t(blockIdx.x) * kThreads + threadIdx.x; q < n4; q += stride) {
    const uint2 w = reinterpret_cast<const uint2*>(in)[q];
    reinterpret_cast<float4*>(out)[q] = make_float4(from_bf16(uint16_t(w.x)), from_bf16(uint16_t(w.x >> 16)),
                                                    from_bf16(uint16_t(w.y)), from_bf16(uint16_t(w.y >> 16)));
  }
  for (size_t i = 4 * n4 + size_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) out[i] = from_bf16(in[i]);
}

int grid(size_t n) { return int(std::min<size_t>((n / 4 + kThreads - 1) / kThreads + 1, 1024)); }
bool aligned(const void* a, const void* b) {
  return reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 8 == 0;
}

}  // namespace

void launch_pack_bf16(float* in, uint16_t* out, size_t n, bool zero_in, cudaStream_t s) {
  if (n == 0) return;
  pack_k<<<grid(n), kThreads, 0, s>>>(in, out, n, aligned(in, out) ? n / 4 : 0, zero_in ? 1 : 0);
  MX_CUDA(cudaGetLastError());
}

void launch_unpack_bf16(const uint16_t* in, float* out, size_t n, cudaStream_t s) {
  if (n == 0) return;
  unpack_k<<<grid(n), kThreads, 0, s>>>(in, out, n, aligned(out, in) ? n / 4 : 0);
  MX_CUDA(cudaGetLastError());
}

}  // namespace mx::cuda
