// The GPU samplers' random stream: one 64-bit key per sampled row (sample_stream_key), one uniform per
// vocabulary id. Host and device share it so CPU references draw the same numbers.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace mx::cuda {

__host__ __device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Uniform in (0, 1) for vocabulary id i of a row's random stream (24 bits, never 0 or 1).
__host__ __device__ __forceinline__ float stream_uniform(uint64_t key, int i) {
  return (float(mix64(key + uint64_t(i) * 0x9e3779b97f4a7c15ull) >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

}  // namespace mx::cuda
