// The collectives of one tensor-parallel rank, as the forward calls them: sums of fp32 rows (the reduce
// points after the o-proj and after the experts) and the gather of the vocabulary slices' logits. Small
// sums go to the one-shot peer all-reduce (decode steps), the rest to NCCL. Everything is enqueued on the
// step's stream, so CUDA graphs capture it.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace mx::cuda {

class NcclComm;
class PeerAllReduce;
struct PeerRouterFold;

struct TpComm {
  int rank = 0, size = 1;
  NcclComm* nccl = nullptr;
  const PeerAllReduce* peer = nullptr;  // null: NCCL for every size (no peer access between the GPUs)
  // NCCL's sums of at least wire_min_elems values (and at most wire_elems) go as bf16 through `wire`
  // (bf16_wire.h): half the bytes of the prefill and widest decode steps' sums. Null: fp32 throughout.
  uint16_t* wire = nullptr;
  size_t wire_elems = 0, wire_min_elems = 0;

  // In place, buf[i] = the sum over ranks; every rank calls it with the same n in the same order.
  void all_reduce_sum_f32(float* buf, size_t n, cudaStream_t s) const;
  // out[i] = the sum over ranks of in[i] (in != out), and in[i] = 0 after: a rank's partial rows, zero
  // again for the next layer's partial without a memset of its own in the peer path.
  void reduce_into(float* in, float* out, size_t n, cudaStream_t s) const;
  // One token's row (n = H) with the router folded into the sum (peer_allreduce.h's PeerRouterFold): only
  // where folds_router says so (the peer path, H and E within its limits).
  bool folds_router(size_t H, int E) const;
  void reduce_into_router(float* in, float* out, size_t n, const PeerRouterFold& f, cudaStream_t s) const;
  // recv = every rank's `bytes`, in rank order; send may be recv + rank * bytes (in place).
  void all_gather(const void* send, void* recv, size_t bytes, cudaStream_t s) const;
};

}  // namespace mx::cuda
