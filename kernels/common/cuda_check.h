// Error reporting usable from .cu files, which compile as C++17 (mx::Error and fmt live in C++20
// land): the message is built with std::string and thrown as mx::Error by cuda_check.cpp.
#pragma once
#include <atomic>
#include <string>
#include <cuda_runtime.h>

namespace mx::cuda {

[[noreturn]] void throw_error(const std::string& msg);

}  // namespace mx::cuda

#define MX_CUDA(call)                                                                            \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess)                                                                       \
      ::mx::cuda::throw_error(std::string("CUDA error ") + cudaGetErrorString(e_) + " at " + __FILE__ + \
                              ":" + std::to_string(__LINE__));                                   \
  } while (0)

namespace mx::cuda {
// Lets `kernel` take up to 160 KiB of dynamic shared memory (the decode kernels' staged activations).
template <class K>
void allow_dynamic_smem(K kernel) {
  MX_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024));
}

// Function attributes belong to a device, so a launcher sets them up once on each device it runs on
// (the current one); `done` is the launcher's own mask of devices already set up.
template <class F>
void once_per_device(std::atomic<unsigned long long>& done, F setup) {
  int dev = 0;
  MX_CUDA(cudaGetDevice(&dev));
  const unsigned long long bit = 1ull << (dev & 63);
  if (done.load(std::memory_order_acquire) & bit) return;
  setup();
  done.fetch_or(bit, std::memory_order_release);
}

// A property of the current device, read once per device (cache: one slot a device, 0 = not read yet;
// `read(dev)` returns a nonzero value).
template <class Read>
int per_device(std::atomic<int> (&cache)[64], Read read) {
  int dev = 0;
  MX_CUDA(cudaGetDevice(&dev));
  int v = cache[dev & 63].load(std::memory_order_relaxed);
  if (!v) {
    v = read(dev);
    cache[dev & 63].store(v, std::memory_order_relaxed);
  }
  return v;
}

// The current device's multiprocessors and the shared memory a block may opt into (read once a device).
int device_sm_count();
int device_smem_optin();
}  // namespace mx::cuda
