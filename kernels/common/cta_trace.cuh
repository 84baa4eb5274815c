// Device side of CtaTrace (cta_trace.h). The stamps live in shared memory so that tracing costs the
// kernels no registers across their bodies.
#pragma once
#include "kernels/common/cta_trace.h"
#include "kernels/common/pdl.cuh"

namespace mx::cuda {

__device__ __forceinline__ unsigned long long trace_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// This CTA's entry and wait stamps.
__device__ __forceinline__ unsigned long long* trace_stamps() {
  __shared__ unsigned long long s[2];
  return s;
}

__device__ __forceinline__ void trace_begin(const CtaTrace& tr) {
  if (tr.buf && threadIdx.x == 0) {
    trace_stamps()[0] = trace_ns();
    trace_stamps()[1] = 0;
  }
}

// PdlWait that also stamps the wait when tracing (buf: CtaTrace::buf).
struct TracedPdlWait {
  const unsigned long long* buf;
  __device__ __forceinline__ void operator()() const {
    pdl_wait();
    if (buf && threadIdx.x == 0) trace_stamps()[1] = trace_ns();
    pdl_launch_dependents();
  }
};

// Call from every thread at the kernel's end (a barrier when tracing).
__device__ __forceinline__ void trace_end(const CtaTrace& tr, int kind) {
  if (!tr.buf) return;
  __syncthreads();
  if (threadIdx.x != 0) return;
  const unsigned long long end = trace_ns();
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const unsigned i = atomicAdd(tr.cursor, 1u);
  if (i >= tr.cap) return;
  unsigned long long* r = tr.buf + size_t(i) * 4;
  r[0] = trace_stamps()[0];
  r[1] = trace_stamps()[1];
  r[2] = end;
  r[3] = (sm & 0xffu) | (unsigned(kind) << 8) | (unsigned long long)(tr.layer) << 16;
}

}  // namespace mx::cuda
