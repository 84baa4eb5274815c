// Programmatic dependent launch (sm_90): a kernel launched with launch_pdl may start while the
// previous kernel in the stream finishes; it must call pdl_wait() before touching anything that
// kernel writes, and before writing anything an earlier kernel may still read. Everything before
// the wait is independent work, in practice issuing the kernel's first weight loads.
#pragma once
#include <utility>
#include <cuda_runtime.h>

#include "kernels/common/cuda_check.h"

namespace mx::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next kernel's CTAs launch (they still wait in pdl_wait for this grid to finish).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// The wait hook of kernel bodies shared with the persistent decode step (see kernels/decode/*_body.cuh):
// in their own grids they wait for the kernel before and let the next one launch.
struct PdlWait {
  __device__ __forceinline__ void operator()() const {
    pdl_wait();
    pdl_launch_dependents();
  }
};

// One shared-memory carveout for every launch here (percent of the SM's maximum). A kernel needing a larger
// carveout than the one its SM runs with cannot start there before the SM drains, so kernels that overlap
// by PDL must agree. 50 % leaves an SM room for a tensor-core attention split beside three qkv CTAs and
// costs the L1-resident weight streams nothing (docs/perf.md).
constexpr int kPdlSmemCarveoutPercent = 50;

// A launch that another kernel does not overlap may ask for more (percent of the SM's maximum).
template <class... KArgs, class... Args>
void launch_pdl_carveout(int carveout_percent, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
  attr[1].val.sharedMemCarveout = carveout_percent;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  MX_CUDA(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <class... KArgs, class... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_pdl_carveout(kPdlSmemCarveoutPercent, kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

}  // namespace mx::cuda
