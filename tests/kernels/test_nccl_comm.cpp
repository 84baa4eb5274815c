// NCCL through kernels/comm/nccl_comm.h: collectives between the GPUs of this machine (one thread per GPU),
// and a rank whose peer never comes failing with one line. Skipped without libnccl.so.2 (or two GPUs).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/comm/nccl_comm.h"

namespace {
using namespace mx;

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

TEST(NcclComm, AllReduceAndAllGatherAcrossGpus) {
  std::string why;
  if (!cuda::nccl_available(&why)) GTEST_SKIP() << why;
  const int world = gpu_count();
  if (world < 2) GTEST_SKIP() << "needs two GPUs";
  const cuda::NcclId id = cuda::nccl_unique_id();
  const size_t n = 3 * 2880 + 7;  // not a multiple of anything NCCL chunks by
  const size_t W = static_cast<size_t>(world);
  std::vector<std::vector<float>> sums(W), gathered(W);
  std::vector<std::string> errors(W);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      try {
        cudaSetDevice(r);
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
      } catch (const Error& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
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
