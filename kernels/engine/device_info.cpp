#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "kernels/engine/cuda_runner.h"

namespace mx {

double measure_d2d_bandwidth_gbps(size_t bytes) {
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    cudaFree(a);
    fail("cannot allocate {} bytes for the copy-bandwidth probe", bytes);
  }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);  // warm-up
  const int reps = 10;
  cudaEventRecord(e0);
  for (int i = 0; i < reps; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes * reps / (ms * 1e-3) / 1e9;
}

std::string cuda_device_name() {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "unknown";
  return p.name;
}

}  // namespace mx
