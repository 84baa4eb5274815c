// NCCL through kernels/comm/nccl_comm.h: collectives between the GPUs of this machine (one thread per GPU),
// and a rank whose peer never comes failing with one line. Skipped without libnccl.so.2 (or two GPUs).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/comm/nccl_comm.h"
#include "kernels/comm/tp_comm.h"

namespace {
using namespace mx;

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Why a group test cannot run here (no libnccl.so.2, fewer than two GPUs), "" where it can.
std::string why_no_group() {
  std::string why;
  if (!cuda::nccl_available(&why)) return why;
  return gpu_count() < 2 ? "needs two GPUs" : "";
}

// Runs body(r) on a thread a GPU, each on its own device; returns each rank's error ("" for none).
template <class F>
std::vector<std::string> on_each_gpu(int world, F&& body) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      try {
        cudaSetDevice(r);
        body(r);
      } catch (const Error& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  return errors;
}

TEST(NcclComm, AllReduceAndAllGatherAcrossGpus) {
  if (const std::string why = why_no_group(); !why.empty()) GTEST_SKIP() << why;
  const int world = gpu_count();
  const cuda::NcclId id = cuda::nccl_unique_id();
  const size_t n = 3 * 2880 + 7;  // not a multiple of anything NCCL chunks by
  const size_t W = static_cast<size_t>(world);
  std::vector<std::vector<float>> sums(W), gathered(W);
  const std::vector<std::string> errors = on_each_gpu(world, [&](int r) {
    cuda::NcclComm comm(id, r, world, 60);
    cudaStream_t s;
    cudaStreamCreate(&s);
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = float(r + 1) * 0.5f + float(i % 13);
    float *d = nullptr, *g = nullptr;
    cudaMalloc(&d, n * 4);
    cudaMalloc(&g, size_t(world) * 16);
    cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice);
    comm.all_reduce_sum_f32(d, n, s);
    comm.all_gather(d + r, g, 16, s);  // each rank's 4 floats from offset r
    comm.sync(s, 60);
    sums[size_t(r)].resize(n);
    gathered[size_t(r)].resize(size_t(world) * 4);
    cudaMemcpy(sums[size_t(r)].data(), d, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(gathered[size_t(r)].data(), g, size_t(world) * 16, cudaMemcpyDeviceToHost);
    cudaFree(d);
    cudaFree(g);
    cudaStreamDestroy(s);
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int q = 0; q < world; ++q) want += float(q + 1) * 0.5f + float(i % 13);
      ASSERT_EQ(sums[size_t(r)][i], want) << "rank " << r << " i " << i;  // small integers and halves: exact
    }
    for (int q = 0; q < world; ++q)
      for (int j = 0; j < 4; ++j) EXPECT_EQ(gathered[size_t(r)][size_t(q) * 4 + j], sums[size_t(q)][size_t(q + j)]);
  }
}

// TpComm's large sums over the bf16 wire (bf16_wire.h): each rank's fp32 rows rounded to bf16, summed by
// NCCL, widened back; the partial rows zeroed; within bf16's rounding of the exact sum, the same bits on
// every rank, and exact where the values are bf16 already.
TEST(NcclComm, LargeSumsGoOverTheBf16Wire) {
  if (const std::string why = why_no_group(); !why.empty()) GTEST_SKIP() << why;
  const int world = gpu_count();
  const cuda::NcclId id = cuda::nccl_unique_id();
  const size_t n = 300 * 1024 + 3;  // past the wire's minimum, not a multiple of 4
  const size_t W = static_cast<size_t>(world);
  auto value = [](int r, size_t i) { return float(r + 1) * 0.37f + float(i % 101) * 0.011f - 0.5f; };
  auto exact = [](int r, size_t i) { return float(r + 1) * 0.5f + float(i % 13); };  // bf16 already
  std::vector<std::vector<float>> sums(W), exacts(W), left(W);
  const std::vector<std::string> errors = on_each_gpu(world, [&](int r) {
    cuda::NcclComm comm(id, r, world, 60);
    cudaStream_t s;
    cudaStreamCreate(&s);
    float *in = nullptr, *out = nullptr, *buf = nullptr;
    uint16_t* wire = nullptr;
    cudaMalloc(&in, n * 4);
    cudaMalloc(&out, n * 4);
    cudaMalloc(&buf, n * 4);
    cudaMalloc(&wire, n * 2);
    std::vector<float> h(n), e(n);
    for (size_t i = 0; i < n; ++i) h[i] = value(r, i), e[i] = exact(r, i);
    cudaMemcpy(in, h.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(buf, e.data(), n * 4, cudaMemcpyHostToDevice);
    const cuda::TpComm tp{r, world, &comm, nullptr, wire, n, 1024};
    tp.reduce_into(in, out, n, s);
    tp.all_reduce_sum_f32(buf, n, s);
    comm.sync(s, 60);
    sums[size_t(r)].resize(n);
    exacts[size_t(r)].resize(n);
    left[size_t(r)].resize(n);
    cudaMemcpy(sums[size_t(r)].data(), out, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(exacts[size_t(r)].data(), buf, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(left[size_t(r)].data(), in, n * 4, cudaMemcpyDeviceToHost);
    for (void* p : {static_cast<void*>(in), static_cast<void*>(out), static_cast<void*>(buf), static_cast<void*>(wire)})
      cudaFree(p);
    cudaStreamDestroy(s);
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
    for (size_t i = 0; i < n; ++i) {
      float want = 0, want_exact = 0, mag = 0;
      for (int q = 0; q < world; ++q) want += value(q, i), want_exact += exact(q, i), mag += std::fabs(value(q, i));
      ASSERT_NEAR(sums[size_t(r)][i], want, mag * 0.008f) << "rank " << r << " i " << i;  // two bf16 roundings
      ASSERT_EQ(sums[size_t(r)][i], sums[0][i]) << "rank " << r << " i " << i;
      ASSERT_EQ(exacts[size_t(r)][i], want_exact) << "rank " << r << " i " << i;
      ASSERT_EQ(left[size_t(r)][i], 0.f);
    }
  }
}

TEST(NcclComm, AMissingPeerFailsWithinTheTimeout) {
  std::string why;
  if (!cuda::nccl_available(&why)) GTEST_SKIP() << why;
  if (gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  cudaSetDevice(0);
  const cuda::NcclId id = cuda::nccl_unique_id();
  try {
    cuda::NcclComm comm(id, 0, 2, 3);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not join within"), std::string::npos) << e.what();
  }
}

}  // namespace
