// The one-shot peer all-reduce (kernels/comm/peer_allreduce.h) between the GPUs of this machine, one thread
// each: exact sums for message sizes from one value to past one CTA's share, many calls in a row (the
// epochs and the alternating buffers), out of place with the input zeroed, a captured CUDA graph replayed,
// and the same result as NCCL's all-reduce; buffers 16-byte aligned (the float4 path) or not (the float
// path). Values are small multiples of 1/2, so every order of summation is exact. Needs two GPUs.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/comm/nccl_comm.h"
#include "kernels/comm/peer_allreduce.h"

namespace {
using namespace mx;

int gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? std::min(n, cuda::kPeerMaxRanks) : 0;
}

float value(int rank, int call, size_t i) { return 0.5f * float((rank + 1) * 3 + call % 5) + float(i % 17); }

// Runs f(rank) on one thread per GPU; returns the ranks' error messages ("" when fine).
template <class F>
std::vector<std::string> on_ranks(int world, F f) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        cudaSetDevice(r);
        f(r);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

TEST(PeerAllReduce, ExactSumsManyCallsAndGraphReplays) {
  const int world = gpus();
  if (world < 2) GTEST_SKIP() << "needs two GPUs";
  const size_t max_n = 200000;
  cuda::PeerAllReduce ar(world, max_n);
  const std::vector<size_t> sizes = {1, 7, 1000, 1002, 23040, 92160, 184320, max_n};  // 184320: 64 rows of 2880
  std::vector<std::string> bad(static_cast<size_t>(world));
  auto errors = on_ranks(world, [&](int r) {
    ar.join(r);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float* d = nullptr;
    cudaMalloc(&d, (max_n + 1) * 4);
    float* p = d;  // d, or d + 1 (unaligned: the float path)
    std::vector<float> h(max_n), got(max_n);
    auto check = [&](size_t n, int call) {
      cudaMemcpy(got.data(), p, n * 4, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int q = 0; q < world; ++q) want += value(q, call, i);
        if (got[i] != want && bad[size_t(r)].empty())
          bad[size_t(r)] = "n " + std::to_string(n) + " call " + std::to_string(call) + " i " + std::to_string(i);
      }
    };
    int call = 0;
    for (int round = 0; round < 20; ++round)
      for (size_t n : sizes) {
        p = d + round % 2;
        for (size_t i = 0; i < n; ++i) h[i] = value(r, call, i);
        cudaMemcpyAsync(p, h.data(), n * 4, cudaMemcpyHostToDevice, s);
        ar.all_reduce_sum_f32(r, p, n, s);
        cudaStreamSynchronize(s);
        check(n, call++);
      }
    // Out of place: the sum into another buffer, the input left zero (the decode o-proj's partial rows).
    p = d;
    float* o = nullptr;
    cudaMalloc(&o, 23040 * 4);
    for (int rep = 0; rep < 3; ++rep) {
      const size_t m = rep == 1 ? 23040 : 2880;
      for (size_t i = 0; i < m; ++i) h[i] = value(r, call, i);
      cudaMemcpyAsync(d, h.data(), m * 4, cudaMemcpyHostToDevice, s);
      ar.reduce_into(r, d, o, m, s);
      cudaStreamSynchronize(s);
      cudaMemcpy(got.data(), d, m * 4, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < m; ++i)
        if (got[i] != 0.f && bad[size_t(r)].empty()) bad[size_t(r)] = "input not zeroed at " + std::to_string(i);
      cudaMemcpy(d, o, m * 4, cudaMemcpyDeviceToDevice);
      check(m, call++);
    }
    cudaFree(o);
    // A captured graph, replayed with new inputs.
    const size_t n = 23040;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    ar.all_reduce_sum_f32(r, d, n, s);
    cudaStreamEndCapture(s, &g);
    cudaGraphInstantiate(&ge, g, 0);
    for (int rep = 0; rep < 10; ++rep) {
      for (size_t i = 0; i < n; ++i) h[i] = value(r, call, i);
      cudaMemcpyAsync(d, h.data(), n * 4, cudaMemcpyHostToDevice, s);
      cudaGraphLaunch(ge, s);
      cudaStreamSynchronize(s);
      check(n, call++);
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    if (cudaGetLastError() != cudaSuccess) bad[size_t(r)] = "CUDA error";
    cudaFree(d);
    cudaStreamDestroy(s);
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
    EXPECT_EQ(bad[size_t(r)], "") << "rank " << r;
  }
}

TEST(PeerAllReduce, EqualsNccl) {
  const int world = gpus();
  if (world < 2) GTEST_SKIP() << "needs two GPUs";
  std::string why;
  if (!cuda::nccl_available(&why)) GTEST_SKIP() << why;
  const size_t n = 92160;  // 8 tokens x 4 slots x 2880: the decode step's expert outputs
  cuda::PeerAllReduce ar(world, n);
  const cuda::NcclId id = cuda::nccl_unique_id();
  std::vector<std::vector<float>> peer(static_cast<size_t>(world)), nccl(static_cast<size_t>(world));
  auto errors = on_ranks(world, [&](int r) {
    ar.join(r);
    cuda::NcclComm comm(id, r, world, 60);
    cudaStream_t s;
    cudaStreamCreate(&s);
    float *a = nullptr, *b = nullptr;
    cudaMalloc(&a, n * 4);
    cudaMalloc(&b, n * 4);
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = value(r, 1, i);
    cudaMemcpy(a, h.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(b, h.data(), n * 4, cudaMemcpyHostToDevice);
    ar.all_reduce_sum_f32(r, a, n, s);
    comm.all_reduce_sum_f32(b, n, s);
    comm.sync(s, 60);
    peer[size_t(r)].resize(n);
    nccl[size_t(r)].resize(n);
    cudaMemcpy(peer[size_t(r)].data(), a, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(nccl[size_t(r)].data(), b, n * 4, cudaMemcpyDeviceToHost);
    cudaFree(a);
    cudaFree(b);
    cudaStreamDestroy(s);
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
    EXPECT_EQ(peer[size_t(r)], nccl[size_t(r)]) << "rank " << r;
  }
}

}  // namespace
