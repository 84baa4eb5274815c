#include "kernels/comm/nccl_comm.h"

#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "kernels/common/cuda_check.h"

namespace mx::cuda {
namespace {

// The entry points this engine uses, from the loaded library.
struct NcclLib {
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*init_rank_config)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
  ncclResult_t (*destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*abort)(ncclComm_t) = nullptr;
  ncclResult_t (*async_error)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
  std::string error;  // why it did not load
};

const NcclLib& lib() {
  static NcclLib l;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      l.error = std::string("libnccl.so.2 not found (") + dlerror() +
                "); on a machine with PyTorch, add its nvidia/nccl/lib directory to LD_LIBRARY_PATH "
                "(scripts/device-env.sh does)";
      return;
    }
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(h, name));
      if (!f && l.error.empty()) l.error = std::string("libnccl.so.2 lacks ") + name + " (NCCL 2.14 or newer needed)";
    };
    sym(l.get_unique_id, "ncclGetUniqueId");
    sym(l.init_rank_config, "ncclCommInitRankConfig");
    sym(l.destroy, "ncclCommDestroy");
    sym(l.abort, "ncclCommAbort");
    sym(l.async_error, "ncclCommGetAsyncError");
    sym(l.all_reduce, "ncclAllReduce");
    sym(l.all_gather, "ncclAllGather");
    sym(l.error_string, "ncclGetErrorString");
  });
  return l;
}

const NcclLib& need_lib() {
  const NcclLib& l = lib();
  if (!l.error.empty()) fail("tensor parallelism: {}", l.error);
  return l;
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress) fail("NCCL {}: {}", what, need_lib().error_string(r));
}

using Clock = std::chrono::steady_clock;

}  // namespace

bool nccl_available(std::string* why) {
  const NcclLib& l = lib();
  if (why) *why = l.error;
  return l.error.empty();
}

NcclId nccl_unique_id() {
  static_assert(sizeof(ncclUniqueId) == sizeof(NcclId), "NCCL's unique id is 128 bytes");
  ncclUniqueId u;
  check(need_lib().get_unique_id(&u), "unique id");
  NcclId id;
  std::memcpy(id.bytes, &u, sizeof(u));
  return id;
}

NcclComm::NcclComm(const NcclId& id, int rank, int size, double timeout_s) : rank_(rank), size_(size) {
  const NcclLib& l = need_lib();
  ncclUniqueId u;
  std::memcpy(&u, id.bytes, sizeof(u));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;  // init and collectives return at once; sync() polls with a deadline
  ncclComm_t c = nullptr;
  check(l.init_rank_config(&c, size, u, rank, &cfg), "init");
  comm_ = c;
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  for (;;) {
    ncclResult_t st = ncclSuccess;
    l.async_error(c, &st);
    if (st == ncclSuccess) break;
    if (st != ncclInProgress || Clock::now() > end) {
      l.abort(c);
      comm_ = nullptr;
      if (st != ncclInProgress) fail("NCCL init of rank {} of {}: {}", rank, size, l.error_string(st));
      fail("NCCL init of rank {} of {}: the other ranks did not join within {:.0f} s", rank, size, timeout_s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

NcclComm::~NcclComm() {
  if (comm_) lib().destroy(static_cast<ncclComm_t>(comm_));
}

// A non-blocking communicator may answer a call with ncclInProgress (connecting its channels on first
// use); no further call may be made on it until it is ready.
void NcclComm::ready(int r, const char* what) {
  if (!comm_) fail("tensor parallelism: rank {} of {}: the communicator was aborted after an earlier failure", rank_, size_);
  check(ncclResult_t(r), what);
  if (r != ncclInProgress) return;
  const NcclLib& l = need_lib();
  const auto end = Clock::now() + std::chrono::seconds(120);
  for (;;) {
    ncclResult_t st = ncclSuccess;
    l.async_error(static_cast<ncclComm_t>(comm_), &st);
    if (st == ncclSuccess) return;
    if (st != ncclInProgress || Clock::now() > end) {
      l.abort(static_cast<ncclComm_t>(comm_));
      comm_ = nullptr;
      if (st != ncclInProgress) fail("NCCL {} on rank {} of {}: {}", what, rank_, size_, l.error_string(st));
      fail("NCCL {} on rank {} of {}: not ready after 120 s; a peer has died or hangs", what, rank_, size_);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclComm::all_reduce_sum_f32(float* buf, size_t n, cudaStream_t s) { all_reduce_sum_f32(buf, buf, n, s); }

void NcclComm::all_reduce_sum_f32(const float* in, float* out, size_t n, cudaStream_t s) {
  if (!comm_) ready(0, "all-reduce");
  ready(lib().all_reduce(in, out, n, ncclFloat32, ncclSum, static_cast<ncclComm_t>(comm_), s), "all-reduce");
}

void NcclComm::all_reduce_sum_bf16(uint16_t* buf, size_t n, cudaStream_t s) {
  if (!comm_) ready(0, "all-reduce");
  ready(lib().all_reduce(buf, buf, n, ncclBfloat16, ncclSum, static_cast<ncclComm_t>(comm_), s), "all-reduce");
}

void NcclComm::all_gather(const void* send, void* recv, size_t bytes, cudaStream_t s) {
  if (!comm_) ready(0, "all-gather");
  ready(lib().all_gather(send, recv, bytes, ncclUint8, static_cast<ncclComm_t>(comm_), s), "all-gather");
}

void NcclComm::sync(cudaStream_t s, double timeout_s) {
  const NcclLib& l = need_lib();
  if (!comm_) ready(0, "sync");
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  for (;;) {
    const cudaError_t q = cudaStreamQuery(s);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) MX_CUDA(q);
    ncclResult_t st = ncclSuccess;
    l.async_error(static_cast<ncclComm_t>(comm_), &st);
    const bool late = Clock::now() > end;
    if ((st != ncclSuccess && st != ncclInProgress) || late) {
      l.abort(static_cast<ncclComm_t>(comm_));
      comm_ = nullptr;
      if (late) fail("tensor parallelism: rank {} of {} waited {:.0f} s for a step; a peer has died or hangs", rank_,
                     size_, timeout_s);
      fail("tensor parallelism: rank {} of {}: NCCL reports {}", rank_, size_, l.error_string(st));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace mx::cuda
