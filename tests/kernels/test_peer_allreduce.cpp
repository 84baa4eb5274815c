// The one-shot peer all-reduce (kernels/comm/peer_allreduce.h) between the GPUs of this machine, one thread
// each: exact sums for message sizes from one value to past one CTA's share, many calls in a row (the
// epochs and the staging buffers in turn, both channels interleaved), out of place with the input zeroed, a
// captured CUDA graph replayed, and the same result as NCCL's all-reduce; buffers 16-byte aligned (the float4
// path) or not (the float path). Values are small multiples of 1/2, so every order of summation is exact.
// Needs two GPUs.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "kernels/comm/nccl_comm.h"
#include "kernels/comm/peer_allreduce.h"
#include "kernels/decode/decode_gemv.h"

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

// No exception (errors) and no wrong value (bad) on any rank.
void expect_every_rank_fine(const std::vector<std::string>& errors, const std::vector<std::string>& bad) {
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(bad[r], "") << "rank " << r;
  }
}

// Rank r joins the all-reduce (a barrier with the other ranks) and gets a stream of its own for its calls.
cudaStream_t join_rank(cuda::PeerAllReduce& ar, int r) {
  ar.join(r);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  return s;
}

TEST(PeerAllReduce, ExactSumsManyCallsAndGraphReplays) {
  const int world = gpus();
  if (world < 2) GTEST_SKIP() << "needs two GPUs";
  const size_t max_n = 512 * 2880 + 3;  // a wide step's 512 rows at TP=2, and a partial vector
  cuda::PeerAllReduce ar(world, max_n, 92160);  // the small channel up to 32 rows, then the wide one
  const std::vector<size_t> sizes = {1, 7, 1000, 1002, 23040, 92160, 184320, 737280, max_n};  // 64, 256 rows of 2880
  std::vector<std::string> bad(static_cast<size_t>(world));
  auto errors = on_ranks(world, [&](int r) {
    cudaStream_t s = join_rank(ar, r);
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
  expect_every_rank_fine(errors, bad);
}

// The staging's "not arrived" mark (the bits 0xffffffff, a NaN) as an input value: pushed as another NaN, so
// no rank waits for it; the sum is NaN there and exact elsewhere, -0.0 included, over calls in a row (every
// staging buffer in turn, float4 and float paths). A hang here is a stalled poll.
TEST(PeerAllReduce, AnInputWithTheEmptyMarkDoesNotStall) {
  const int world = gpus();
  if (world < 2) GTEST_SKIP() << "needs two GPUs";
  const size_t n = 2880;
  for (const size_t small : {n + 1, size_t(0)}) {  // the small channel, then the wide one
    cuda::PeerAllReduce ar(world, n + 1, small);
    std::vector<std::string> bad(static_cast<size_t>(world));
    auto errors = on_ranks(world, [&](int r) {
      cudaStream_t s = join_rank(ar, r);
      float* d = nullptr;
      cudaMalloc(&d, (n + 1) * 4);
      std::vector<float> h(n), got(n);
      for (int call = 0; call < 7; ++call) {
        float* p = d + call % 2;  // d + 1: the float path
        for (size_t i = 0; i < n; ++i) {
          uint32_t bits = i % 97 == 5 ? 0xffffffffu : i % 89 == 3 ? 0x80000000u : 0u;
          h[i] = bits ? std::bit_cast<float>(bits) : value(r, call, i);
        }
        cudaMemcpyAsync(p, h.data(), n * 4, cudaMemcpyHostToDevice, s);
        ar.all_reduce_sum_f32(r, p, n, s);
        cudaStreamSynchronize(s);
        cudaMemcpy(got.data(), p, n * 4, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < n && bad[size_t(r)].empty(); ++i) {
          float want = 0;
          for (int q = 0; q < world; ++q) want += i % 97 == 5 ? NAN : i % 89 == 3 ? -0.f : value(q, call, i);
          const bool ok = std::isnan(want) ? std::isnan(got[i]) : got[i] == want;
          if (!ok) bad[size_t(r)] = "call " + std::to_string(call) + " i " + std::to_string(i);
        }
      }
      if (cudaGetLastError() != cudaSuccess) bad[size_t(r)] = "CUDA error";
      cudaFree(d);
      cudaStreamDestroy(s);
    });
    expect_every_rank_fine(errors, bad);
  }
}

TEST(PeerAllReduce, EqualsNccl) {
  const int world = gpus();
  if (world < 2) GTEST_SKIP() << "needs two GPUs";
  std::string why;
  if (!cuda::nccl_available(&why)) GTEST_SKIP() << why;
  const size_t n = 92160;  // 8 tokens x 4 slots x 2880: the decode step's expert outputs
  cuda::PeerAllReduce ar(world, n, n);
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

// The router folded into a one-token sum: the sums as reduce_into's, and route_acc / ss_part equal on
// every rank and bit for bit to a CPU replay of the kernel's slices (same fmaf order, same warp tree), on
// the float4 path (H 2880) and the float path (H 1001), 128 and 32 experts.
TEST(PeerAllReduce, RouterFoldMatchesItsCpuReplay) {
  const int world = gpus();
  if (world < 2) GTEST_SKIP() << "needs two GPUs";
  const int kCtas = cuda::kPeerMaxCtas;
  for (const auto& [H, E] : {std::pair<int, int>{2880, 128}, {1001, 32}}) {
    cuda::PeerAllReduce ar(world, 4096, 4096);  // every rank joins once
    std::mt19937 rng(uint32_t(H + E));
    std::vector<uint16_t> w(size_t(E) * H), g(static_cast<size_t>(H));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& x : w) x = f32_to_bf16(u(rng));
    for (auto& x : g) x = f32_to_bf16(u(rng));
    // The summed row (exact in any order), then the CPU replay of each CTA's slice.
    std::vector<float> h(static_cast<size_t>(H));
    for (int i = 0; i < H; ++i)
      for (int q = 0; q < world; ++q) h[size_t(i)] += value(q, 3, size_t(i));
    const int W = H % 4 == 0 ? 4 : 1;
    const size_t units = size_t(H / W), per = (units + kCtas - 1) / kCtas;
    std::vector<long long> acc(static_cast<size_t>(E), 0);
    std::vector<float> ss(static_cast<size_t>(kCtas), 0.f);
    for (int b = 0; b < kCtas; ++b) {
      const size_t begin = std::min(units, size_t(b) * per), end = std::min(units, begin + per);
      const int rows = int(end - begin) * W, row0 = int(begin) * W;
      for (int e = 0; e < E; ++e) {
        float a = 0.f;
        for (int j = 0; j < rows; ++j)
          a = std::fma(bf16_to_f32(w[size_t(e) * H + row0 + j]) * bf16_to_f32(g[size_t(row0 + j)]), h[size_t(row0 + j)], a);
        acc[size_t(e)] += std::llrint(std::fmin(std::fmax(a, -134217728.f), 134217728.f) * cuda::kRouteAccScale);
      }
      float lane[32] = {};
      for (int l = 0; l < 32; ++l)
        for (int j = l; j < rows; j += 32) lane[l] = std::fma(h[size_t(row0 + j)], h[size_t(row0 + j)], lane[l]);
      for (int o = 16; o > 0; o >>= 1) {
        float next[32];
        for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ o];
        std::copy(next, next + 32, lane);
      }
      ss[size_t(b)] = lane[0];
    }
    std::vector<std::string> bad(static_cast<size_t>(world));
    auto errors = on_ranks(world, [&](int r) {
      cudaStream_t s = join_rank(ar, r);
      uint16_t *dw = nullptr, *dg = nullptr;
      float *in = nullptr, *out = nullptr, *dss = nullptr;
      long long* dacc = nullptr;
      cudaMalloc(&dw, w.size() * 2);
      cudaMalloc(&dg, g.size() * 2);
      cudaMalloc(&in, size_t(H) * 4);
      cudaMalloc(&out, size_t(H) * 4);
      cudaMalloc(&dss, size_t(kCtas) * 4);
      cudaMalloc(&dacc, size_t(E) * 8);
      cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
      cudaMemcpy(dg, g.data(), g.size() * 2, cudaMemcpyHostToDevice);
      std::vector<float> hin(static_cast<size_t>(H));
      for (int i = 0; i < H; ++i) hin[size_t(i)] = value(r, 3, size_t(i));
      for (int rep = 0; rep < 3; ++rep) {  // rank 0 in place (its residual), the others out of place
        float* o = r == 0 ? in : out;
        cudaMemcpy(in, hin.data(), size_t(H) * 4, cudaMemcpyHostToDevice);
        cudaMemset(dacc, 0, size_t(E) * 8);
        cudaMemset(dss, 0xff, size_t(kCtas) * 4);
        ar.reduce_into_router(r, in, o, size_t(H), cuda::PeerRouterFold{dg, dw, dacc, dss, E}, s);
        cudaStreamSynchronize(s);
        std::vector<float> got(static_cast<size_t>(H)), gss(static_cast<size_t>(kCtas));
        std::vector<long long> gacc(static_cast<size_t>(E));
        cudaMemcpy(got.data(), o, size_t(H) * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(gss.data(), dss, size_t(kCtas) * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(gacc.data(), dacc, size_t(E) * 8, cudaMemcpyDeviceToHost);
        std::string& why = bad[size_t(r)];
        if (got != h && why.empty()) why = "sums differ, H " + std::to_string(H);
        if (gacc != acc && why.empty()) why = "route_acc differs, H " + std::to_string(H);
        if (gss != ss && why.empty()) why = "ss_part differs, H " + std::to_string(H);
      }
      if (cudaGetLastError() != cudaSuccess) bad[size_t(r)] = "CUDA error";
      cudaFree(dw), cudaFree(dg), cudaFree(in), cudaFree(out), cudaFree(dss), cudaFree(dacc);
      cudaStreamDestroy(s);
    });
    expect_every_rank_fine(errors, bad);
  }
}

}  // namespace
