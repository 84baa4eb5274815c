// Helpers shared by the GPU kernel tests: device buffers, random bf16 / MXFP4 data, bf16 rounding.
#pragma once
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "core/mxfp4.h"
#include "model/model_runner.h"

namespace mx::test {

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess); }
  explicit DevBuf(const std::vector<T>& v) : DevBuf(v.size()) { put(v); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void put(const std::vector<T>& v) { cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> get() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  void poison() { cudaMemset(p, 0xff, n * sizeof(T)); }  // NaN for floats and bf16
};

// A device copy of v (cudaFree it), and n values back from the device.
template <class T>
T* to_dev(const std::vector<T>& v) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, v.size()) * sizeof(T)), cudaSuccess);
  if (!v.empty()) cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return p;
}
template <class T>
std::vector<T> from_dev(const T* p, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

inline std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(u(rng));
  return v;
}
inline std::vector<float> random_f32(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}
inline std::vector<uint8_t> random_u8(size_t n, std::mt19937& rng, int lo = 0, int hi = 255) {
  std::uniform_int_distribution<int> u(lo, hi);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = uint8_t(u(rng));
  return v;
}

// Decoded MXFP4 element k of a row (blocks: K/2 bytes, scales: K/32 bytes).
inline float mxfp4_at(const uint8_t* blocks, const uint8_t* scales, int k) {
  const uint8_t b = blocks[k / 2];
  return kFp4Values[k % 2 ? b >> 4 : b & 15] * e8m0_to_f32(scales[k / 32]);
}

// One greedy step of one sequence (its tokens at positions start ..), the runner's logits kept.
inline SampleResult greedy_step(ModelRunner& r, std::span<const int32_t> tokens, int start,
                                std::span<const int32_t> table, std::span<const int32_t> sliding) {
  SeqStep s;
  s.tokens = tokens;
  s.start_pos = start;
  s.block_table = table;
  s.sliding_table = sliding;
  s.sample = true;
  s.sampling.temperature = 0;
  SampleResult out;
  r.step(std::span<const SeqStep>(&s, 1), std::span<SampleResult>(&out, 1));
  return out;
}

// Within one bf16 step of want (2^-7 relative) plus abs_tol; within half an E4M3 step (2^-4 relative,
// 2^-10 absolute) plus tol.
inline bool near_bf16(float got, double want, double abs_tol = 1e-6) {
  return std::fabs(got - want) <= std::fabs(want) * (1.0 / 128) + abs_tol;
}
inline bool near_e4m3(float got, double want, double tol = 0) {
  return std::fabs(got - want) <= std::fabs(want) / 16 + std::ldexp(1.0, -10) + tol;
}

}  // namespace mx::test
