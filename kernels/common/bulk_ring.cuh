// sm_90 wrappers for a producer warp that streams data into shared memory and consumer warps that
// read it: mbarriers (one "full" and one "empty" per slot), copies global -> shared that complete on
// an mbarrier (per-lane cp.async, or 1-D bulk copies), shared-space loads, named barriers, and the
// release / acquire counters that order work across CTAs of one persistent grid.
// Per-lane cp.async of a whole warp streams at the HBM rate with 12 KB slots; one bulk copy per slot
// is held back by a fixed ~0.35 us per copy (2 KB copies: 0.76 TB/s, 12 KB: 2.7 TB/s; H100,
// bench/stream_copy_bench.cu, docs/perf.md).
// Only sm_90+ code calls these; the host launcher refuses older GPUs.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "kernels/common/device_math.cuh"

namespace mx::cuda::ring {

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes the barrier inits visible to the async proxy (the bulk copies complete on them).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// The producer's arrival for one fill: the phase completes once `bytes` more have landed.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Waits until the phase with the given parity has completed (acquire: the slot's data are visible).
// The suspend hint lets the hardware park the warp until the phase completes instead of spinning on
// the issue slots the computing warps need.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity), "r"(0x989680u)
        : "memory");
  } while (!done);
}

// L2 policy for data read once per step (weights): evicted first, so they do not push out the
// activations and KV rows that other CTAs read next.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
// bytes (a multiple of 16, both addresses 16-byte aligned) global -> shared, counted on `bar`.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar, uint64_t pol) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(pol)
      : "memory");
}

__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t lds_u8(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u8 %0, [%1];" : "=r"(v) : "r"(a));
  return v;
}

// Barrier `id` (1..15) over `threads` threads (a multiple of 32) of the CTA.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// 16 bytes global -> shared by this lane (L2 only), with an L2 policy.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint64_t pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "l"(pol) : "memory");
}
// One arrival on `bar` once all of this lane's earlier cp.async have landed (the barrier's count
// includes it: noinc).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ unsigned ld_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Waits until *p >= target, then acquires. The poll is relaxed: an acquire load invalidates the SM's
// L1 on every iteration, which evicts the other warps' stack and spills while one thread spins.
__device__ __forceinline__ void spin_until(const unsigned* p, unsigned target) {
  while (ld_relaxed(p) < target) {
  }
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
// Publishes the caller's earlier writes (and those ordered before it by a barrier) with the count.
__device__ __forceinline__ void red_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

using mx::cuda::global_ns;  // device_math.cuh

}  // namespace mx::cuda::ring
