// Latency of one all-reduce between this machine's GPUs as a decode step sees it: a CUDA graph of kCalls
// sums in a row on each rank (the peer sum launched with PDL, as the forward launches it), replayed by
// every rank at once; microseconds a sum for the one-shot peer sum (kernels/comm/peer_allreduce.h) and
// NCCL's all-reduce, at the decode step's sizes (fp32 rows of 2880: one token's row and its four expert
// slots, then 32 to 512 rows of wide steps). Results go to docs/perf.md.
// Usage: peer_sum_bench [gpus]   (default: every GPU, at most 8; needs two and peer access between them)
#include <cuda_runtime.h>

#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/comm/nccl_comm.h"
#include "kernels/comm/peer_allreduce.h"
#include "kernels/common/cuda_check.h"

namespace {
using namespace mx;

constexpr int kCalls = 64, kReplays = 20;
constexpr size_t kRow = 2880;
const size_t kRows[] = {1, 4, 32, 33, 128, 256, 512, 1024, 2048};

struct Row {
  size_t n = 0;
  double peer_us = 0, nccl_us = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int world = 0;
  MX_CUDA(cudaGetDeviceCount(&world));
  world = std::min(world, cuda::kPeerMaxRanks);
  if (argc > 1) world = std::min(world, std::atoi(argv[1]));
  if (world < 2) {
    std::fprintf(stderr, "peer_sum_bench: needs two GPUs, found %d\n", world);
    return 1;
  }
  std::string why;
  if (!cuda::nccl_available(&why)) {
    std::fprintf(stderr, "peer_sum_bench: %s\n", why.c_str());
    return 1;
  }
  const size_t max_n = kRows[std::size(kRows) - 1] * kRow;
  cuda::PeerAllReduce peer(world, max_n, 32 * kRow);
  const cuda::NcclId id = cuda::nccl_unique_id();
  std::vector<Row> rows(std::size(kRows));
  std::barrier sync(world);
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        MX_CUDA(cudaSetDevice(r));
        peer.join(r);
        cuda::NcclComm nccl(id, r, world, 120);
        cudaStream_t s;
        MX_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        float* buf = nullptr;
        MX_CUDA(cudaMalloc(&buf, max_n * 4));
        MX_CUDA(cudaMemset(buf, 0, max_n * 4));
        cudaEvent_t e0, e1;
        MX_CUDA(cudaEventCreate(&e0));
        MX_CUDA(cudaEventCreate(&e1));
        for (size_t i = 0; i < std::size(kRows); ++i) {
          const size_t n = kRows[i] * kRow;
          for (int path = 0; path < 2; ++path) {  // 0: peer, 1: NCCL
            cudaGraph_t g;
            cudaGraphExec_t ge;
            MX_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int c = 0; c < kCalls; ++c) {
              if (path == 0) peer.all_reduce_sum_f32(r, buf, n, s);
              else nccl.all_reduce_sum_f32(buf, n, s);
            }
            MX_CUDA(cudaStreamEndCapture(s, &g));
            MX_CUDA(cudaGraphInstantiate(&ge, g, 0));
            for (int w = 0; w < 3; ++w) MX_CUDA(cudaGraphLaunch(ge, s));
            MX_CUDA(cudaStreamSynchronize(s));
            sync.arrive_and_wait();  // every rank replays at once: each sum waits for every rank's
            MX_CUDA(cudaEventRecord(e0, s));
            for (int k = 0; k < kReplays; ++k) MX_CUDA(cudaGraphLaunch(ge, s));
            MX_CUDA(cudaEventRecord(e1, s));
            MX_CUDA(cudaEventSynchronize(e1));
            float ms = 0;
            MX_CUDA(cudaEventElapsedTime(&ms, e0, e1));
            if (r == 0) {
              rows[i].n = n;
              (path == 0 ? rows[i].peer_us : rows[i].nccl_us) = double(ms) * 1e3 / (kCalls * kReplays);
            }
            MX_CUDA(cudaGraphExecDestroy(ge));
            MX_CUDA(cudaGraphDestroy(g));
          }
        }
        MX_CUDA(cudaFree(buf));
        MX_CUDA(cudaStreamDestroy(s));
      } catch (const std::exception& ex) {
        errors[size_t(r)] = ex.what();
        peer.abandon();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r)
    if (!errors[size_t(r)].empty()) {
      std::fprintf(stderr, "rank %d: %s\n", r, errors[size_t(r)].c_str());
      return 1;
    }
  int dev = 0;
  cudaDeviceProp prop{};
  MX_CUDA(cudaGetDeviceProperties(&prop, dev));
  std::printf("%d x %s, %d sums in a row in a CUDA graph, %d replays, rank 0's time\n", world, prop.name, kCalls,
              kReplays);
  std::printf("| rows of %zu | values | peer sum, us | NCCL, us |\n|---|---|---|---|\n", kRow);
  for (const Row& row : rows)
    std::printf("| %zu | %zu | %.2f | %.2f |\n", row.n / kRow, row.n, row.peer_us, row.nccl_us);
  return 0;
}
