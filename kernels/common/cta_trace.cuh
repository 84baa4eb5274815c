// Device side of CtaTrace (cta_trace.h).
#pragma once
#include "kernels/common/cta_trace.h"
#include "kernels/common/pdl.cuh"

namespace mx::cuda {

__device__ __forceinline__ unsigned long long trace_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// The stamps of one CTA: entry (thread 0's register) and the wait (shared, written by thread 0).
struct CtaStamps {
  unsigned long long entry = 0;
  unsigned long long* waited = nullptr;  // shared; null when not tracing
};

__device__ __forceinline__ CtaStamps trace_begin(const CtaTrace& tr, unsigned long long* waited_smem) {
  CtaStamps s;
  if (tr.buf) {
    s.entry = trace_ns();
    s.waited = waited_smem;
    if (threadIdx.x == 0) *waited_smem = 0;
  }
  return s;
}

__device__ __forceinline__ void trace_waited(const CtaStamps& s) {
  if (s.waited && threadIdx.x == 0) *s.waited = trace_ns();
}

// PdlWait that also stamps the wait.
struct TracedPdlWait {
  CtaStamps s;
  __device__ __forceinline__ void operator()() const {
    pdl_wait();
    trace_waited(s);
    pdl_launch_dependents();
  }
};

// Call from every thread at the kernel's end (a barrier when tracing).
__device__ __forceinline__ void trace_end(const CtaTrace& tr, const CtaStamps& s, int kind) {
  if (!tr.buf) return;
  __syncthreads();
  if (threadIdx.x != 0) return;
  const unsigned long long end = trace_ns();
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const unsigned i = atomicAdd(tr.cursor, 1u);
  if (i >= tr.cap) return;
  unsigned long long* r = tr.buf + size_t(i) * 4;
  r[0] = s.entry;
  r[1] = *s.waited;
  r[2] = end;
  r[3] = (sm & 0xffu) | (unsigned(kind) << 8) | (unsigned long long)(tr.layer) << 16;
}

}  // namespace mx::cuda
