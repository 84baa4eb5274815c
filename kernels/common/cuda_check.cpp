#include "kernels/common/cuda_check.h"

#include "core/error.h"

namespace mx::cuda {

void throw_error(const std::string& msg) { throw Error(msg); }

namespace {
int device_attribute(std::atomic<int> (&cache)[64], cudaDeviceAttr attr) {
  return per_device(cache, [attr](int dev) {
    int v = 0;
    MX_CUDA(cudaDeviceGetAttribute(&v, attr, dev));
    return v;
  });
}
}  // namespace

int device_sm_count() {
  static std::atomic<int> cache[64];
  return device_attribute(cache, cudaDevAttrMultiProcessorCount);
}
int device_smem_optin() {
  static std::atomic<int> cache[64];
  return device_attribute(cache, cudaDevAttrMaxSharedMemoryPerBlockOptin);
}

}  // namespace mx::cuda
