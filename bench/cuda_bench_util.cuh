// What the CUDA micro-benchmarks share: a checked CUDA call and a kernel's time by events.
#pragma once
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

// A failed CUDA call ends the benchmark with the call and its error.
#define CK(x)                                                                      \
  do {                                                                             \
    cudaError_t err_ = (x);                                                        \
    if (err_ != cudaSuccess) {                                                     \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(err_));              \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

// Milliseconds a call of f takes, over `iters` calls after one (checked) warm-up.
template <class F>
double time_ms(F f, int iters) {
  f();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f();
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms / iters;
}
