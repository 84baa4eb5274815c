// The one-shot peer all-reduce (peer_allreduce.h). Each CTA owns a slice of the message: it pushes its
// slice into every peer's staging (stores over NVLink are posted, so a wide step's slice does not wait on
// the link's latency load by load) and sums its slice from its own input and the staged copies, so no
// grid-wide barrier is needed. The data is its own flag: staging holds kPeerEmpty (a NaN bit pattern no
// pushed value has: senders replace it by another NaN) until a peer's value lands, the reader polls the
// values themselves and writes kPeerEmpty back once read, so a sum costs one trip over the link (no fence
// or flag after the pushes). Staging rotates over three buffers by the CTA's call count (epoch): a peer
// pushes call k + 3 into this buffer only after this rank pushed call k + 2, which it does two kernel
// boundaries after its call k (and its reset of the buffer) finished; two buffers would leave one.
#include "kernels/comm/peer_allreduce.h"

#include <chrono>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "kernels/common/cuda_check.h"
#include "kernels/common/device_math.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/decode/decode_gemv.h"

namespace mx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // elements a thread has in flight: the sum's staged loads issue together

constexpr unsigned kPeerEmpty = 0xffffffffu;  // cudaMemset(0xff): the staging's "not arrived yet"

// Stores to a peer and polls of this rank's staging at system scope: relaxed (no ordering needed, each
// 32-bit value is its own flag) but never served from L1.
__device__ __forceinline__ void st_sys(float* p, float v) {
  asm volatile("st.relaxed.sys.global.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}
__device__ __forceinline__ void st_sys(float4* p, float4 v) {
  asm volatile("st.relaxed.sys.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w) : "memory");
}
__device__ __forceinline__ float ld_sys(const float* p) {
  float v;
  asm volatile("ld.relaxed.sys.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ float4 ld_sys(const float4* p) {
  float4 v;
  asm volatile("ld.relaxed.sys.global.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ bool empty(float v) { return __float_as_uint(v) == kPeerEmpty; }
__device__ __forceinline__ bool empty(float4 v) { return empty(v.x) || empty(v.y) || empty(v.z) || empty(v.w); }
// A value as pushed: kPeerEmpty's bits become another NaN (the sum is NaN either way).
__device__ __forceinline__ float pushed(float v) { return empty(v) ? __uint_as_float(0x7fffffffu) : v; }
__device__ __forceinline__ float4 pushed(float4 v) { return {pushed(v.x), pushed(v.y), pushed(v.z), pushed(v.w)}; }
// v in every lane of T (float or float4).
template <class T>
__device__ __forceinline__ T splat(float v) {
  if constexpr (sizeof(T) == sizeof(float4)) return {v, v, v, v};
  else return v;
}
template <class T>
__device__ __forceinline__ T empties() { return splat<T>(__uint_as_float(kPeerEmpty)); }

__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ float4 add(float4 a, float4 b) { return {a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w}; }

// out[i] = sum over ranks of in[i] (in rank order: every rank gets the same bits); zero_in (in != out):
// in[i] = 0 once read. T is float4 when the pointers are 16-byte aligned and n a multiple of 4, else float;
// n and the staging offsets count T. kFold: the router's sums over the CTA's slice (PeerRouterFold).
template <class T, bool kFold>
__global__ void __launch_bounds__(kThreads) peer_allreduce_k(PeerAllReduceView v, T* in, T* out, size_t n,
                                                             int zero_in, PeerRouterFold f) {
  constexpr int W = sizeof(T) / sizeof(float);
  constexpr int kSlice = kFold ? kPeerFoldMaxSlice : 1;
  // Thread e's router weights over the slice, in registers: 4 rows a load on the float4 path (8-byte
  // aligned: the slice starts at a multiple of 4 rows), issued together before the wait.
  constexpr int kWL = kFold ? kPeerFoldMaxSlice / 4 : 1;
  __shared__ float g_s[kSlice];  // gamma over the slice
  __shared__ __align__(16) float h_s[kSlice * W];  // the summed slice
  const int b = blockIdx.x, tid = threadIdx.x, me = v.rank;
  const size_t per = (n + gridDim.x - 1) / gridDim.x, begin = min(n, size_t(b) * per), end = min(n, begin + per);
  const int rows = int(end - begin) * W, row0 = int(begin) * W;
  uint2 wr[kWL];
  if constexpr (kFold) {  // weights, not outputs of the kernel before: loaded before the wait
    const uint16_t* wrow = f.router_w + size_t(min(tid, f.E - 1)) * size_t(n) * W + row0;
    if constexpr (W == 4) {
#pragma unroll
      for (int u = 0; u < kWL; ++u)
        wr[u] = tid < f.E && 4 * u < rows ? __ldg(reinterpret_cast<const uint2*>(wrow) + u) : make_uint2(0, 0);
    }
    for (int k = tid; k < rows; k += kThreads) g_s[k] = bf(f.norm_w[row0 + k]);
  }
  pdl_wait();  // the kernel before wrote `in`
  // The next kernel may launch now and issue its weight loads while the ranks exchange rows; it reads
  // the sums only after its own pdl_wait, which waits for this grid to finish.
  pdl_launch_dependents();
  const size_t stride = v.max_elems * sizeof(float) / sizeof(T);  // one source rank's region of a staging buffer
  const unsigned e = v.epoch[b] + 1;
  const int buf = int(e % kPeerStageBufs);
  for (size_t i = begin + tid; i < end; i += kThreads) {
    const T x = pushed(in[i]);
    for (int r = 0; r < v.world; ++r)
      if (r != me) st_sys(reinterpret_cast<T*>(v.stage[r][buf]) + size_t(me) * stride + i, x);
  }
  T* staged = reinterpret_cast<T*>(v.stage[me][buf]);
  for (size_t i0 = begin + tid; i0 < end; i0 += size_t(kThreads) * kUnroll) {
    T s[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) s[u] = splat<T>(0.f);
    for (int r = 0; r < v.world; ++r) {  // in rank order: every rank sums the same bits
      T p[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {  // the loads issue together; each polls on until its value landed
        const size_t i = i0 + size_t(u) * kThreads;
        if (i < end) p[u] = r == me ? in[i] : ld_sys(staged + size_t(r) * stride + i);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t i = i0 + size_t(u) * kThreads;
        if (i >= end) continue;
        if (r != me) {
          while (empty(p[u])) p[u] = ld_sys(staged + size_t(r) * stride + i);
          staged[size_t(r) * stride + i] = empties<T>();  // ready for call e + 3
        }
        s[u] = add(s[u], p[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = i0 + size_t(u) * kThreads;
      if (i >= end) continue;
      if (zero_in) in[i] = splat<T>(0.f);
      out[i] = s[u];
      if constexpr (kFold) *reinterpret_cast<T*>(h_s + (i - begin) * W) = s[u];
    }
  }
  if (tid == 0) v.epoch[b] = e;
  if constexpr (kFold) {
    __syncthreads();
    if (tid < f.E) {
      float a = 0.f;  // sum_j fmaf(w_j g_j, h_j, a) in row order (w g exact in fp32)
      if constexpr (W == 4) {
#pragma unroll
        for (int u = 0; u < kWL; ++u) {
          if (4 * u >= rows) break;
          const uint32_t pr[2] = {wr[u].x, wr[u].y};
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const float w = bf(uint16_t(pr[c >> 1] >> (16 * (c & 1))));
            a = fmaf(w * g_s[4 * u + c], h_s[4 * u + c], a);
          }
        }
      } else {
        const uint16_t* wrow = f.router_w + size_t(tid) * size_t(n) + row0;
        for (int j = 0; j < rows; ++j) a = fmaf(bf(wrow[j]) * g_s[j], h_s[j], a);
      }
      // |a| < 2^27 keeps 32 slices' sum inside int64 at 2^28 (saturated, never wrapped).
      const long long q = __float2ll_rn(fminf(fmaxf(a, -134217728.f), 134217728.f) * kRouteAccScale);
      atomicAdd(reinterpret_cast<unsigned long long*>(f.route_acc + tid), static_cast<unsigned long long>(q));
    }
    if (tid < 32) {
      float ss = 0.f;
      for (int j = tid; j < rows; j += 32) ss = fmaf(h_s[j], h_s[j], ss);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (tid == 0) f.ss_part[b] = ss;
    }
  }
}

}  // namespace

PeerAllReduce::PeerAllReduce(int world, size_t max_elems, size_t small_elems)
    : world_(world), devices_(size_t(world), -1) {
  if (world < 1 || world > kPeerMaxRanks) throw_error("PeerAllReduce: 1.." + std::to_string(kPeerMaxRanks) + " ranks");
  // Whole float4s: each source rank's region of a staging buffer stays 16-byte aligned.
  small_elems = std::min(small_elems, max_elems);
  elems_[0] = (small_elems + 3) / 4 * 4;
  elems_[1] = max_elems > small_elems ? (max_elems + 3) / 4 * 4 : 0;
  for (auto& v : views_) v.resize(size_t(world));
}

PeerAllReduce::~PeerAllReduce() {
  for (int r = 0; r < world_; ++r) {
    if (devices_[size_t(r)] < 0) continue;
    cudaSetDevice(devices_[size_t(r)]);
    for (const auto& views : views_) {
      const PeerAllReduceView& v = views[size_t(r)];
      for (float* p : v.stage[r]) cudaFree(p);
      cudaFree(v.epoch);
    }
  }
}

void PeerAllReduce::join(int rank) {
  int dev = 0;
  MX_CUDA(cudaGetDevice(&dev));
  float* stage[2][kPeerStageBufs] = {};
  unsigned* epoch[2] = {};
  for (int c = 0; c < 2; ++c) {
    if (!elems_[c]) continue;
    for (float*& p : stage[c]) {  // a region for each source rank, all empty
      MX_CUDA(cudaMalloc(&p, size_t(world_) * elems_[c] * 4));
      MX_CUDA(cudaMemset(p, 0xff, size_t(world_) * elems_[c] * 4));
    }
    MX_CUDA(cudaMalloc(&epoch[c], size_t(kCtas[c]) * 4));
    MX_CUDA(cudaMemset(epoch[c], 0, size_t(kCtas[c]) * 4));
  }
  MX_CUDA(cudaDeviceSynchronize());  // empty before any peer can push here
  std::unique_lock<std::mutex> lk(mu_);
  devices_[size_t(rank)] = dev;
  for (int c = 0; c < 2; ++c) {
    for (PeerAllReduceView& v : views_[c]) {  // publish this rank's buffers in every rank's view
      for (int k = 0; k < kPeerStageBufs; ++k) v.stage[rank][k] = stage[c][k];
    }
    PeerAllReduceView& mine = views_[c][size_t(rank)];
    mine.epoch = epoch[c];
    mine.rank = rank;
    mine.world = world_;
    mine.max_elems = elems_[c];
  }
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
  launch(rank, in, out, n, nullptr, s);
}

void PeerAllReduce::reduce_into_router(int rank, float* in, float* out, size_t n, const PeerRouterFold& f,
                                       cudaStream_t s) const {
  if (!folds_router(n, f.E)) throw_error("PeerAllReduce: the router folds into rows of at most 4096 and 128 experts");
  if (n > elems_[0]) throw_error("PeerAllReduce: the router folds into the small channel's sums only");
  launch(rank, in, out, n, &f, s);
}

void PeerAllReduce::launch(int rank, float* in, float* out, size_t n, const PeerRouterFold* fold, cudaStream_t s) const {
  if (n > max_elems())
    throw_error("PeerAllReduce: " + std::to_string(n) + " values, at most " + std::to_string(max_elems()));
  if (n == 0) return;
  // Always every CTA of the channel (some with nothing to copy): their call counts stay equal, so a call's
  // CTAs all use the same staging buffer whatever the sizes of the channel's calls before.
  const int c = n <= elems_[0] ? 0 : 1;
  const PeerAllReduceView& v = views_[c][size_t(rank)];
  const bool vec = n % 4 == 0 && ((reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out)) & 15) == 0;
  const PeerRouterFold f = fold ? *fold : PeerRouterFold{};
  const dim3 grid(kCtas[c]), block(kThreads);
  float4 *in4 = reinterpret_cast<float4*>(in), *out4 = reinterpret_cast<float4*>(out);
  const int z = int(in != out);
  if (vec && fold) launch_pdl(peer_allreduce_k<float4, true>, grid, block, 0, s, v, in4, out4, n / 4, z, f);
  else if (vec) launch_pdl(peer_allreduce_k<float4, false>, grid, block, 0, s, v, in4, out4, n / 4, z, f);
  else if (fold) launch_pdl(peer_allreduce_k<float, true>, grid, block, 0, s, v, in, out, n, z, f);
  else launch_pdl(peer_allreduce_k<float, false>, grid, block, 0, s, v, in, out, n, z, f);
}

}  // namespace mx::cuda
