// Bulk L2 prefetch (sm_90 cp.async.bulk.prefetch): a latency-bound kernel that leaves HBM idle asks
// for the next kernel's weights, so that kernel reads them from L2. Fire and forget: no registers,
// no completion to wait for; the data are read-only weights, so it may run before pdl_wait().
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

namespace mx::cuda {

// Part `part` of `nparts` equal slices of [base, base + bytes), spread over the CTA's threads in
// 16 KiB requests. The range is widened to 16-byte boundaries (the instruction's granule), which stays
// inside our 256-byte-aligned allocations.
__device__ __forceinline__ void l2_prefetch_slice(const void* base, size_t bytes, int part, int nparts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (!base || !bytes) return;
  constexpr size_t kReq = 16384;
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(base) & ~uintptr_t(15);
  const size_t total = ((reinterpret_cast<uintptr_t>(base) + bytes + 15) & ~uintptr_t(15)) - a0;
  const size_t chunk = ((total + nparts - 1) / nparts + 127) & ~size_t(127);
  const size_t lo = size_t(part) * chunk, hi = lo + chunk < total ? lo + chunk : total;
  for (size_t off = lo + threadIdx.x * kReq; off < hi; off += size_t(blockDim.x) * kReq) {
    const uint32_t n = uint32_t(hi - off < kReq ? hi - off : kReq);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a0 + off), "r"(n) : "memory");
  }
#endif
}

}  // namespace mx::cuda
