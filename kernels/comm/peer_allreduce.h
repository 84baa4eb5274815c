// A one-shot all-reduce over peer memory (NVLink) for the messages of decode steps: each rank pushes its
// input into every peer's staging buffer, polls its own staging until every peer's values landed (the
// values are their own flags), and sums its own input and the staged copies (in rank order, so every rank
// gets the same bits) into its output. One kernel, no NCCL call: a decode step's all-reduces are 10 KB to a few MB, where
// NCCL's ring pays its protocol; larger messages go to NCCL (nccl_comm.h). Ranks are threads of one process,
// one device each, with peer access between all of them. Enqueued on a stream; CUDA graphs capture it (its
// state lives in device memory). Two channels, each with its own staging and call counts: sums up to
// small_elems (one token's messages, up to 32 rows of a decode step) run on kPeerMaxCtas CTAs, larger ones
// on kPeerWideCtas, whose pushes fill the link (32 CTAs move ~150 GB/s: docs/perf.md, session 36).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace mx::cuda {

constexpr int kPeerMaxRanks = 8;
constexpr int kPeerMaxCtas = 32;    // the small channel's CTAs (the router fold's slices)
constexpr int kPeerWideCtas = 128;  // the wide channel's
constexpr int kPeerStageBufs = 3;  // staging buffers a rank, in turn by call (peer_allreduce.cu says why three)

// What one rank's kernel reads (pointers of every rank's buffers, usable through peer access).
struct PeerAllReduceView {
  float* stage[kPeerMaxRanks][kPeerStageBufs] = {};  // each rank's staging: world x max_elems each
  unsigned* epoch = nullptr;                         // this rank's per-CTA call counters [the channel's CTAs]
  int rank = 0, world = 1;
  size_t max_elems = 0;
};

// The one-token router folded into the sum after the o-proj (as dense_o_proj_router_m1 folds it into the
// o-proj on one GPU, decode_gemv.h): each CTA, over its slice r of the summed row h,
//   route_acc[e] += round(2^28 * sum_r W[e, r] * gamma[r] * h[r])   (int64, exact adds)
//   ss_part[cta] = sum_r h[r]^2                                        (every CTA, 0 for an empty slice)
// so the expert kernels route without a router kernel. Every rank computes the same bits (the same h,
// the same slices), so every rank routes the same.
struct PeerRouterFold {
  const uint16_t* norm_w = nullptr;    // the MoE's RMSNorm gamma, bf16 [H]
  const uint16_t* router_w = nullptr;  // bf16 [E, H]
  long long* route_acc = nullptr;      // [E], zero before the launch
  float* ss_part = nullptr;            // [kPeerMaxCtas]
  int E = 0;
};
constexpr int kPeerFoldMaxSlice = 128;  // a CTA's rows of h (H <= 32 x 128) and experts (E <= 128)

// The buffers of all ranks; every rank's thread calls join() (a barrier), then all_reduce_sum_f32.
class PeerAllReduce {
 public:
  // Sums of up to small_elems values on the small channel, up to max_elems on the wide one.
  PeerAllReduce(int world, size_t max_elems, size_t small_elems);
  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;
  // On rank `rank`'s device: allocates its buffers, waits for the other ranks, enables peer access to
  // theirs. Fails with one line when two devices cannot reach each other.
  void join(int rank);
  // A rank that will never join (it failed): the ranks waiting in join() fail instead of waiting on.
  void abandon();
  size_t max_elems() const { return std::max(elems_[0], elems_[1]); }
  size_t small_elems() const { return elems_[0]; }
  // In place, buf[i] = sum over ranks, n <= max_elems; every rank calls it with the same n in the same order.
  void all_reduce_sum_f32(int rank, float* buf, size_t n, cudaStream_t s) const;
  // out[i] = sum over ranks of in[i]; in != out is left zeroed (a rank's partial rows, ready for the next
  // layer's partial: no memset between).
  void reduce_into(int rank, float* in, float* out, size_t n, cudaStream_t s) const;
  // reduce_into for one token's row (n = H <= small_elems) with the router folded in (PeerRouterFold).
  static bool folds_router(size_t H, int E) { return H <= size_t(kPeerMaxCtas) * kPeerFoldMaxSlice && E <= kPeerFoldMaxSlice; }
  void reduce_into_router(int rank, float* in, float* out, size_t n, const PeerRouterFold& f, cudaStream_t s) const;

 private:
  void launch(int rank, float* in, float* out, size_t n, const PeerRouterFold* fold, cudaStream_t s) const;
  static constexpr int kCtas[2] = {kPeerMaxCtas, kPeerWideCtas};
  int world_;
  size_t elems_[2];                            // per channel (small, wide); 0: no such channel
  std::vector<PeerAllReduceView> views_[2];  // per channel, per rank
  std::vector<int> devices_;
  std::mutex mu_;
  std::condition_variable cv_;
  int joined_ = 0, failed_ = 0;
};

}  // namespace mx::cuda
