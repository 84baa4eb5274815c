// Bulk L2 prefetch (sm_90 cp.async.bulk.prefetch): a kernel asks for data a later kernel reads, so that
// kernel finds it in L2. Fire and forget: no registers, no completion to wait for; only for data nothing
// writes before the reader runs (weights, or the KV rows of earlier positions), so it may run before
// pdl_wait(). A no-op before sm_90.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace mx::cuda {

// [p, p + bytes): p 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void l2_prefetch(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

}  // namespace mx::cuda
