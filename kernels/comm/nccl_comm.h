// NCCL for tensor parallelism, loaded at run time (dlopen of libnccl.so.2): a one-GPU run never needs it,
// and on the GPU machines it ships with PyTorch's Python packages rather than the toolkit
// (scripts/device-env.sh puts that directory on LD_LIBRARY_PATH). The toolkit's nccl.h gives the types.
// Communicators are non-blocking: init and every wait poll NCCL's asynchronous error with a deadline, so a
// rank that died or hangs ends every process with one line instead of a collective waiting forever.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace mx::cuda {

// NCCL's unique id (ncclUniqueId, 128 bytes): made by one rank, handed to the others (core/rendezvous.h
// across nodes, memory within a process).
struct NcclId {
  char bytes[128];
};

// Whether libnccl.so.2 can be loaded; on false, `why` says what to do.
bool nccl_available(std::string* why);
NcclId nccl_unique_id();

class NcclComm {
 public:
  // Rank `rank` of `size` on the current device; waits up to timeout_s for every rank to join.
  NcclComm(const NcclId& id, int rank, int size, double timeout_s);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // In place: buf[i] = sum over ranks (fp32). Enqueued on s (graph-capturable).
  void all_reduce_sum_f32(float* buf, size_t n, cudaStream_t s);
  void all_reduce_sum_f32(const float* in, float* out, size_t n, cudaStream_t s);  // out of place
  // In place over bf16 values (bf16_wire.h), summed by NCCL in bf16.
  void all_reduce_sum_bf16(uint16_t* buf, size_t n, cudaStream_t s);
  // recv = the ranks' `bytes` each, in rank order.
  void all_gather(const void* send, void* recv, size_t bytes, cudaStream_t s);
  // Waits for s, polling NCCL's asynchronous error; a failed peer or a wait past timeout_s aborts the
  // communicator and fails with one line.
  void sync(cudaStream_t s, double timeout_s);

 private:
  void ready(int nccl_result, const char* what);
  void* comm_ = nullptr;  // ncclComm_t
  int rank_ = 0, size_ = 1;
};

}  // namespace mx::cuda
