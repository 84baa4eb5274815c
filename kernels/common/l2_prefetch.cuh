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

// Small tensors read once a step (norm weights, biases, sinks, the step's metadata) are evicted by the
// weights streamed between two reads of them, so a kernel reading one after its PDL wait would pay a
// loaded HBM round trip on its critical path. These keep them in L2 (evict_last) and prefetch them before
// the wait.
__device__ __forceinline__ uint64_t l2_keep_policy() {
  uint64_t pol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
#endif
  return pol;
}

// [p, p + bytes) rounded out to 16 bytes, marked evict_last.
__device__ __forceinline__ void l2_prefetch_keep(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(15);
  const uint32_t n = uint32_t((reinterpret_cast<uintptr_t>(p) + bytes + 15 - a) & ~uintptr_t(15));
  asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(a), "r"(n), "l"(l2_keep_policy())
               : "memory");
#endif
}

// One int read with the same evict_last mark.
__device__ __forceinline__ int ld_keep(const int* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  int v;
  asm volatile("ld.global.L2::cache_hint.b32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(l2_keep_policy()));
  return v;
#else
  return *p;
#endif
}

}  // namespace mx::cuda
