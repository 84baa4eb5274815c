// The per-candidate arithmetic of the filtered sampler, shared by the kernel and its CPU reference so
// both keep the same set (up to the last ulp of expf / logf, which differ between host and device).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cuda_runtime.h>

namespace mx::cuda::sf {

// -0 -> +0, so equal logits compare equal by key, as they do by value on the host.
__host__ __device__ inline float canon(float x) { return x + 0.0f; }
// NaN and -inf never win and weigh nothing: they are left out.
__host__ __device__ inline bool valid(float x) { return x > -INFINITY; }

// Larger key = better candidate: logit descending, then id ascending.
__host__ __device__ inline uint64_t order_key(float x, int id) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (uint64_t(u) << 32) | uint64_t(~uint32_t(id));
}

__host__ __device__ inline float weight(float x, float mx, float inv_temp) { return expf((x - mx) * inv_temp); }

// Weights in fixed point (2^40 = 1): sums are exact integers, the same in any order, so the kept set
// does not depend on the order of atomics. Weights below 2^-41 count as zero.
constexpr double kFixedOne = 1099511627776.0;
__host__ __device__ inline uint64_t fixed_weight(float x, float mx, float inv_temp) {
  return uint64_t(double(weight(x, mx, inv_temp)) * kFixedOne + 0.5);
}
// The mass the top_p prefix must reach: the smallest integer >= top_p * total.
__host__ __device__ inline uint64_t top_p_target(uint64_t total, float top_p) {
  return uint64_t(ceil(double(top_p) * double(total)));
}

__host__ __device__ inline float gumbel_score(float x, float inv_temp, float u) { return x * inv_temp - logf(-logf(u)); }

}  // namespace mx::cuda::sf
