#include "kernels/comm/tp_comm.h"

#include "kernels/comm/bf16_wire.h"
#include "kernels/common/cuda_check.h"
#include "kernels/comm/nccl_comm.h"
#include "kernels/comm/peer_allreduce.h"

namespace mx::cuda {

namespace {
bool on_wire(const TpComm& c, size_t n) { return c.wire && n >= c.wire_min_elems && n <= c.wire_elems; }
}  // namespace

void TpComm::all_reduce_sum_f32(float* buf, size_t n, cudaStream_t s) const {
  if (size == 1 || n == 0) return;
  if (peer && n <= peer->max_elems()) return peer->all_reduce_sum_f32(rank, buf, n, s);
  if (on_wire(*this, n)) {
    launch_pack_bf16(buf, wire, n, false, s);
    nccl->all_reduce_sum_bf16(wire, n, s);
    return launch_unpack_bf16(wire, buf, n, s);
  }
  nccl->all_reduce_sum_f32(buf, n, s);
}

void TpComm::reduce_into(float* in, float* out, size_t n, cudaStream_t s) const {
  if (size == 1 || n == 0) return;
  if (peer && n <= peer->max_elems()) return peer->reduce_into(rank, in, out, n, s);
  if (on_wire(*this, n)) {
    launch_pack_bf16(in, wire, n, true, s);
    nccl->all_reduce_sum_bf16(wire, n, s);
    return launch_unpack_bf16(wire, out, n, s);
  }
  nccl->all_reduce_sum_f32(in, out, n, s);
  MX_CUDA(cudaMemsetAsync(in, 0, n * 4, s));
}

bool TpComm::folds_router(size_t H, int E) const {
  return size > 1 && peer && H <= peer->small_elems() && PeerAllReduce::folds_router(H, E);
}

void TpComm::reduce_into_router(float* in, float* out, size_t n, const PeerRouterFold& f, cudaStream_t s) const {
  peer->reduce_into_router(rank, in, out, n, f, s);
}

void TpComm::all_gather(const void* send, void* recv, size_t bytes, cudaStream_t s) const {
  if (size == 1 || bytes == 0) return;
  nccl->all_gather(send, recv, bytes, s);
}

}  // namespace mx::cuda
