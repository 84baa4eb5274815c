// Filtered sampling on the GPU (see sample_filtered.h). One thread-block cluster of kCtas CTAs per row
// (sm_90+; one CTA per row before): each CTA sweeps its slice of the row's logits (0.8 MB,
// L2-resident after lm_head) per pass, and the per-pass results (maxima, counts, radix histograms,
// best draws) are combined through distributed shared memory. Every CTA combines them the same way in
// the same order, so all make the same radix decisions without another broadcast.
#include "kernels/sampling/sample_filtered.h"

#include <atomic>

#include <cooperative_groups.h>

#include "kernels/common/cuda_check.h"
#include "kernels/common/stream_random.cuh"
#include "kernels/sampling/sample_filtered_math.h"

namespace mx::cuda {
namespace {
namespace cg = cooperative_groups;

// Cluster launches (sm_90+ with 100+ KB of shared memory per CTA): 8 CTAs of 1024 threads per row.
// Elsewhere one CTA of 512 threads per row (48 KB of shared memory), slower but within every limit.
constexpr int kCtas = 8, kBins = 256;

// The kN CTAs that share a row: a thread-block cluster (sm_90+), or the CTA alone when kN is 1.
template <int kN>
struct RowGroup {
  static constexpr int size() { return kN; }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cg::cluster_group cl = cg::this_cluster();
  __device__ int rank() const { return kN > 1 ? int(cl.block_rank()) : 0; }
  __device__ void sync() {
    if (kN > 1) cl.sync(); else __syncthreads();
  }
  template <class T>
  __device__ T* at(T* p, int r) { return kN > 1 ? cl.map_shared_rank(p, r) : p; }
#else
  __device__ int rank() const {  // the host launches kN > 1 only on sm_90+
    if (kN > 1) __trap();
    return 0;
  }
  __device__ void sync() { __syncthreads(); }
  template <class T>
  __device__ T* at(T* p, int) { return p; }
#endif
};

template <int kThreads>
struct Shared {
  static constexpr int kWarps = kThreads / 32;
  uint32_t cnt[kWarps][kBins];  // per warp: no contention across warps, summed in a fixed order
  uint64_t mass[kWarps][kBins];
  uint64_t tot[kBins];          // this CTA's bucket totals (read by the whole cluster)
  uint32_t tcnt[kBins];
  uint64_t all_tot[kBins];      // the cluster's
  uint32_t all_tcnt[kBins];
  float fred[kWarps];
  int ired[kWarps];
  float part_f[2];              // this CTA's result of a reduction pass (read by the cluster)
  int part_i[2];
  uint64_t word[3];
};

struct Row {
  const float* row;
  int lo, hi;  // this CTA's slice of the ids
  float mx, it;
};

// Block-wide sum (every thread gets it).
template <int kWarps, class T>
__device__ T block_sum(T v, T* red) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  T t = 0;
  for (int w = 0; w < kWarps; ++w) t += red[w];
  return t;
}

// Radix selection over the order keys of the candidates in `in`: the largest threshold t such that the
// candidates with key >= t hold `need` of them (kMass false) or at least ceil(top_p * total) of their
// fixed-point weight (kMass true, `need` ignored). Keys are unique (they carry the id), so the count
// form keeps exactly `need`.
template <bool kMass, int kThreads, class Group, class In>
__device__ uint64_t radix_select(Group& cl, const Row& r, In in, uint64_t need, float top_p, Shared<kThreads>& sh) {
  constexpr int kWarps = kThreads / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint64_t prefix = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = lane; b < kBins; b += 32) {
      sh.cnt[warp][b] = 0;
      if (kMass) sh.mass[warp][b] = 0;
    }
    __syncthreads();
    for (int i = r.lo + threadIdx.x; i < r.hi; i += kThreads) {
      const float x = sf::canon(r.row[i]);
      if (!in(x, i)) continue;
      const uint64_t k = sf::order_key(x, i);
      if (shift < 56 && (k >> (shift + 8)) != (prefix >> (shift + 8))) continue;
      const int b = int(k >> shift) & (kBins - 1);
      atomicAdd(&sh.cnt[warp][b], 1u);
      if (kMass)
        atomicAdd(reinterpret_cast<unsigned long long*>(&sh.mass[warp][b]),
                  static_cast<unsigned long long>(sf::fixed_weight(x, r.mx, r.it)));
    }
    __syncthreads();
    if (threadIdx.x < kBins) {
      uint32_t n = 0;
      uint64_t m = 0;
      for (int w = 0; w < kWarps; ++w) {
        n += sh.cnt[w][threadIdx.x];
        if (kMass) m += sh.mass[w][threadIdx.x];
      }
      sh.tcnt[threadIdx.x] = n;
      sh.tot[threadIdx.x] = kMass ? m : n;
    }
    cl.sync();
    if (threadIdx.x < kBins) {
      uint32_t n = 0;
      uint64_t m = 0;
      for (int c = 0; c < cl.size(); ++c) {
        const Shared<kThreads>* o = cl.at(&sh, c);
        n += o->tcnt[threadIdx.x];
        m += o->tot[threadIdx.x];
      }
      sh.all_tcnt[threadIdx.x] = n;
      sh.all_tot[threadIdx.x] = m;
    }
    cl.sync();  // the remote reads are done before the next level overwrites tot
    if (warp == 0) {
      // Lane l owns bins 255 - 8l - j (j < 8): lane 0 the largest keys. Scan, then the lane where the
      // running sum reaches `need` walks its bins.
      uint64_t v[8], sum = 0;
      for (int j = 0; j < 8; ++j) sum += (v[j] = sh.all_tot[kBins - 1 - (8 * lane + j)]);
      uint64_t incl = sum;
      for (int o = 1; o < 32; o <<= 1) {
        const uint64_t t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
      }
      if (kMass && shift == 56) need = sf::top_p_target(__shfl_sync(0xffffffffu, incl, 31), top_p);
      const unsigned hit = __ballot_sync(0xffffffffu, incl >= need);
      // The sums are exact integers and need <= total, so some lane reaches it; the fallback only
      // guards against a caller's need above the total (then everything is kept).
      const int L = hit ? __ffs(hit) - 1 : 31;
      if (lane == L) {
        uint64_t cum = incl - sum;
        int b = kBins - 1 - 8 * L - 7;
        for (int j = 0; j < 8; ++j)
          if (cum + v[j] >= need) { b = kBins - 1 - (8 * L + j); break; } else cum += v[j];
        const uint64_t left = need - cum;
        // Done when the bucket is kept whole (count form) or holds one candidate.
        const bool done = !hit || (!kMass && sh.all_tcnt[b] == left) || sh.all_tcnt[b] == 1;
        sh.word[0] = prefix | (uint64_t(b) << shift);
        sh.word[1] = left;
        sh.word[2] = done;
      }
    }
    __syncthreads();
    prefix = sh.word[0];
    need = sh.word[1];
    const bool done = sh.word[2];
    __syncthreads();
    if (done) return prefix;
  }
  return prefix;
}

template <int kThreads, int kN>
__global__ void __launch_bounds__(kThreads) sample_filtered_k(SampleFilterParams p) {
  constexpr int kWarps = kThreads / 32, ctas = kN;
  RowGroup<kN> cl;
  const int s = blockIdx.x / ctas, rank = cl.rank();
  const float it = p.inv_temp[s];
  const int top_k = p.top_k[s];
  const float top_p = p.top_p[s], min_p = p.min_p[s];
  if (!(it > 0.f) || (top_k <= 0 && top_p >= 1.f && min_p <= 0.f)) return;  // uniform per cluster
  extern __shared__ __align__(16) unsigned char smem[];
  Shared<kThreads>& sh = *reinterpret_cast<Shared<kThreads>*>(smem);
  const float* row = p.logits + size_t(s) * p.stride;
  const int chunk = (p.V + ctas - 1) / ctas, lo = min(p.V, rank * chunk), hi = min(p.V, lo + chunk);

  // Pass 1: max logit and finite count.
  float mx = -INFINITY;
  int valid = 0;
  for (int i = lo + threadIdx.x; i < hi; i += kThreads) {
    const float x = sf::canon(row[i]);
    if (!sf::valid(x)) continue;
    ++valid;
    mx = fmaxf(mx, x);
  }
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((threadIdx.x & 31) == 0) sh.fred[threadIdx.x >> 5] = mx;
  __syncthreads();
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sh.fred[w]);
  valid = block_sum<kWarps>(valid, sh.ired);
  if (threadIdx.x == 0) { sh.part_f[0] = mx; sh.part_i[0] = valid; }
  cl.sync();
  float bm = -INFINITY;
  int n_valid = 0;
  for (int c = 0; c < ctas; ++c) {
    const Shared<kThreads>* o = cl.at(&sh, c);
    bm = fmaxf(bm, o->part_f[0]);
    n_valid += o->part_i[0];
  }
  cl.sync();
  if (n_valid == 0 || !(bm < INFINITY)) return;  // keep the greedy pick (uniform per cluster)
  const Row r{row, lo, hi, bm, it};

  auto is_valid = [](float x, int) { return sf::valid(x); };
  uint64_t tk = 0;  // keys >= tk pass top_k
  if (top_k > 0 && top_k < n_valid) tk = radix_select<false, kThreads>(cl, r, is_valid, uint64_t(top_k), 1.f, sh);
  auto in_p = [&](float x, int i) {
    return sf::valid(x) && sf::order_key(x, i) >= tk && (min_p <= 0.f || sf::weight(x, bm, it) >= min_p);
  };
  uint64_t tp = 0;
  if (top_p < 1.f) tp = radix_select<true, kThreads>(cl, r, in_p, 0, top_p, sh);

  // Gumbel-max over the kept candidates; the softmax denominator of the raw logits for the log-prob.
  const uint64_t key = p.keys[s];
  float best = -INFINITY, z = 0.f;
  int id = 0x7fffffff;
  for (int i = lo + threadIdx.x; i < hi; i += kThreads) {
    const float x = sf::canon(row[i]);
    if (sf::valid(x)) z += expf(x - bm);
    if (!in_p(x, i) || sf::order_key(x, i) < tp) continue;
    const float sc = sf::gumbel_score(x, it, stream_uniform(key, i));
    if (sc > best) { best = sc; id = i; }  // ids increase per thread: the first max is kept
  }
  for (int o = 16; o; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (ob > best || (ob == best && oi < id)) { best = ob; id = oi; }
  }
  z = block_sum<kWarps>(z, sh.fred);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) { sh.fred[threadIdx.x >> 5] = best; sh.ired[threadIdx.x >> 5] = id; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w)
      if (sh.fred[w] > best || (sh.fred[w] == best && sh.ired[w] < id)) { best = sh.fred[w]; id = sh.ired[w]; }
    sh.part_f[0] = best;
    sh.part_f[1] = z;
    sh.part_i[0] = id;
  }
  cl.sync();
  if (rank == 0 && threadIdx.x == 0) {
    float zt = 0.f;
    for (int c = 0; c < ctas; ++c) {  // ranks hold increasing id ranges: strict > keeps the lowest id
      const Shared<kThreads>* o = cl.at(&sh, c);
      zt += o->part_f[1];
      if (c == 0 || o->part_f[0] > best) { best = o->part_f[0]; id = o->part_i[0]; }
    }
    if (id != 0x7fffffff) {
      p.tok[s] = id;
      p.logprob[s] = row[id] - bm - logf(zt);
    }
  }
  cl.sync();  // the other CTAs' shared memory stays alive until rank 0 has read it
}

template <int kThreads, int kN>
void launch(const SampleFilterParams& p, cudaStream_t s) {
  constexpr int ctas = kN;
  static std::atomic<unsigned long long> ready{0};
  once_per_device(ready, [] {
    MX_CUDA(cudaFuncSetAttribute(sample_filtered_k<kThreads, kN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(sizeof(Shared<kThreads>))));
  });
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p.S * ctas);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = sizeof(Shared<kThreads>);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = ctas;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = ctas > 1 ? 1 : 0;
  MX_CUDA(cudaLaunchKernelEx(&cfg, sample_filtered_k<kThreads, kN>, p));
}

}  // namespace

void sample_filtered(const SampleFilterParams& p, cudaStream_t s) {
  if (p.S <= 0) return;
  // Per device, asked once: 1 = clusters, 2 = one CTA per row (the attribute queries cost microseconds).
  static std::atomic<int> path[64];
  int dev = 0;
  MX_CUDA(cudaGetDevice(&dev));
  int how = dev < 64 ? path[dev].load(std::memory_order_relaxed) : 0;
  if (!how) {
    int major = 0, smem = 0;
    MX_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    MX_CUDA(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    how = major >= 9 && smem >= int(sizeof(Shared<1024>)) ? 1 : 2;
    if (dev < 64) path[dev].store(how, std::memory_order_relaxed);
  }
  if (how == 1 && !p.one_cta_per_row) launch<1024, kCtas>(p, s);
  else launch<512, 1>(p, s);
}

}  // namespace mx::cuda
