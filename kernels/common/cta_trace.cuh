// Device side of CtaTrace (cta_trace.h). The stamps live in shared memory so that tracing costs the
// kernels no registers across their bodies.
#pragma once
#include "kernels/common/cta_trace.h"
#include "kernels/common/device_math.cuh"
#include "kernels/common/pdl.cuh"

namespace mx::cuda {

// One trace record (the per-op CTAs here, the persistent step's items in decode_step.cu): entry, wait
// (0: none), exit, and sm | kind << 8 | layer << 16.
__device__ __forceinline__ void write_trace_record(unsigned long long* r, unsigned long long entry,
                                                   unsigned long long waited, int kind, int layer) {
  r[0] = entry;
  r[1] = waited;
  r[2] = global_ns();
  r[3] = (sm_id() & 0xffu) | (unsigned(kind) << 8) | (unsigned long long)(layer) << 16;
}

// This CTA's entry and wait stamps.
__device__ __forceinline__ unsigned long long* trace_stamps() {
  __shared__ unsigned long long s[2];
  return s;
}

__device__ __forceinline__ void trace_begin(const CtaTrace& tr) {
  if (tr.buf && threadIdx.x == 0) {
    trace_stamps()[0] = global_ns();
    trace_stamps()[1] = 0;
  }
}

// PdlWait that also stamps the wait when tracing (buf: CtaTrace::buf).
struct TracedPdlWait {
  const unsigned long long* buf;
  __device__ __forceinline__ void operator()() const {
    pdl_wait();
    if (buf && threadIdx.x == 0) trace_stamps()[1] = global_ns();
    pdl_launch_dependents();
  }
};

// Call from every thread at the kernel's end (a barrier when tracing).
__device__ __forceinline__ void trace_end(const CtaTrace& tr, int kind) {
  if (!tr.buf) return;
  __syncthreads();
  if (threadIdx.x != 0) return;
  const unsigned i = atomicAdd(tr.cursor, 1u);
  if (i < tr.cap) write_trace_record(tr.buf + size_t(i) * 4, trace_stamps()[0], trace_stamps()[1], kind, tr.layer);
}

}  // namespace mx::cuda
