// The one-shot peer all-reduce (peer_allreduce.h). Each CTA owns a slice of the message: its copy, its
// flags and its wait, so no grid-wide barrier is needed. Flags hold the CTA's call count (epoch), which only
// grows, so they are never reset; staging buffers alternate by the epoch's parity, so a rank's next call
// never overwrites what a slow peer still reads (a peer raises its flag for call k + 1 only after its call k
// finished reading).
#include "kernels/comm/peer_allreduce.h"

#include <chrono>
#include <string>

#include "core/error.h"
#include "kernels/common/cuda_check.h"
#include "kernels/common/pdl.cuh"

namespace mx::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void st_release_sys(unsigned* p, unsigned v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire_sys(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// out[i] = sum over ranks of in[i]; zero_in (in != out): in[i] = 0 once staged.
__global__ void __launch_bounds__(kThreads) peer_allreduce_k(PeerAllReduceView v, float* in, float* out, size_t n,
                                                             int zero_in) {
  pdl_wait();  // the kernel before wrote `in`
  // The next kernel may launch now and issue its weight loads while the ranks exchange flags; it reads
  // the sums only after its own pdl_wait, which waits for this grid to finish.
  pdl_launch_dependents();
  const int b = blockIdx.x, tid = threadIdx.x;
  const size_t per = (n + gridDim.x - 1) / gridDim.x, begin = min(n, size_t(b) * per), end = min(n, begin + per);
  const unsigned e = v.epoch[b] + 1;
  const int slot = e & 1;
  float* mine = v.stage[v.rank][slot];
  for (size_t i = begin + tid; i < end; i += kThreads) {
    mine[i] = in[i];
    if (zero_in) in[i] = 0.f;
  }
  __syncthreads();
  if (tid == 0) __threadfence_system();  // this CTA's copies reach the peers before its flags
  __syncthreads();
  if (tid < v.world) st_release_sys(v.flags[tid] + v.rank * kPeerMaxCtas + b, e);
  if (tid < v.world)
    while (ld_acquire_sys(v.flags[v.rank] + tid * kPeerMaxCtas + b) < e) {
    }
  __syncthreads();
  for (size_t i = begin + tid; i < end; i += kThreads) {
    float s = 0.f;
    for (int r = 0; r < v.world; ++r) s += __ldcv(v.stage[r][slot] + i);  // not from L1: a peer's new values
    out[i] = s;
  }
  if (tid == 0) v.epoch[b] = e;
}

}  // namespace

PeerAllReduce::PeerAllReduce(int world, size_t max_elems)
    : world_(world), max_elems_(max_elems), views_(size_t(world)), devices_(size_t(world), -1) {
  if (world < 1 || world > kPeerMaxRanks) throw_error("PeerAllReduce: 1.." + std::to_string(kPeerMaxRanks) + " ranks");
}

PeerAllReduce::~PeerAllReduce() {
  for (int r = 0; r < world_; ++r) {
    if (devices_[size_t(r)] < 0) continue;
    cudaSetDevice(devices_[size_t(r)]);
    const PeerAllReduceView& v = views_[size_t(r)];
    cudaFree(v.stage[r][0]);
    cudaFree(v.stage[r][1]);
    cudaFree(v.flags[r]);
    cudaFree(v.epoch);
  }
}

void PeerAllReduce::join(int rank) {
  int dev = 0;
  MX_CUDA(cudaGetDevice(&dev));
  PeerAllReduceView& mine = views_[size_t(rank)];
  float* stage[2];
  unsigned *flags, *epoch;
  MX_CUDA(cudaMalloc(&stage[0], max_elems_ * 4));
  MX_CUDA(cudaMalloc(&stage[1], max_elems_ * 4));
  MX_CUDA(cudaMalloc(&flags, kPeerMaxRanks * kPeerMaxCtas * 4));
  MX_CUDA(cudaMalloc(&epoch, kPeerMaxCtas * 4));
  MX_CUDA(cudaMemset(flags, 0, kPeerMaxRanks * kPeerMaxCtas * 4));
  MX_CUDA(cudaMemset(epoch, 0, kPeerMaxCtas * 4));
  MX_CUDA(cudaDeviceSynchronize());  // zeroed before any peer can raise a flag here
  std::unique_lock<std::mutex> lk(mu_);
  devices_[size_t(rank)] = dev;
  for (PeerAllReduceView& v : views_) {  // publish this rank's buffers in every rank's view
    v.stage[rank][0] = stage[0];
    v.stage[rank][1] = stage[1];
    v.flags[rank] = flags;
  }
  mine.epoch = epoch;
  mine.rank = rank;
  mine.world = world_;
  mine.max_elems = max_elems_;
  ++joined_;
  cv_.notify_all();
  if (!cv_.wait_for(lk, std::chrono::seconds(120), [&] { return joined_ == world_ || failed_; }))
    fail("tensor parallelism: rank {}: the other ranks did not set up their peer buffers within 120 s", rank);
  if (failed_) fail("tensor parallelism: rank {}: another rank failed while setting up", rank);
  lk.unlock();
  for (int r = 0; r < world_; ++r) {
    const int peer = devices_[size_t(r)];
    if (peer == dev) continue;
    int ok = 0;
    MX_CUDA(cudaDeviceCanAccessPeer(&ok, dev, peer));
    if (!ok) fail("tensor parallelism: GPU {} cannot reach GPU {} through peer memory", dev, peer);
    const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) MX_CUDA(e);
    (void)cudaGetLastError();  // clear "already enabled"
  }
}

void PeerAllReduce::abandon() {
  std::lock_guard<std::mutex> lk(mu_);
  failed_ = 1;
  cv_.notify_all();
}

void PeerAllReduce::all_reduce_sum_f32(int rank, float* buf, size_t n, cudaStream_t s) const {
  reduce_into(rank, buf, buf, n, s);
}

void PeerAllReduce::reduce_into(int rank, float* in, float* out, size_t n, cudaStream_t s) const {
  if (n > max_elems_) throw_error("PeerAllReduce: " + std::to_string(n) + " values, at most " + std::to_string(max_elems_));
  if (n == 0) return;
  // Always every CTA (some with nothing to copy): their call counts stay equal, so a call's CTAs all use
  // the same staging parity whatever the sizes of the calls before.
  launch_pdl(peer_allreduce_k, dim3(kPeerMaxCtas), dim3(kThreads), 0, s, views_[size_t(rank)], in, out, n,
             int(in != out));
}

}  // namespace mx::cuda
