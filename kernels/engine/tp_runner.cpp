// The CUDA side of the tensor-parallel group: checks, NCCL's id, the peer all-reduce, and each rank's
// set-up on its own thread (device, communicator, warm collectives, the runner over its shard).
#include "kernels/engine/tp_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/decode_gemv.h"
#include "kernels/engine/runner.h"

namespace mx {
namespace {
constexpr double kJoinTimeoutS = 120;  // NCCL's set-up: every rank joins within this
// A wide step's rows summed over peer memory: at two GPUs up to 1024, at more 256 / (ranks - 1) (docs/perf.md,
// sessions 34 and 36: the one-shot push moves ranks - 1 times the ring's bytes).
constexpr int kPeerSumRowsTwoGpus = 1024, kPeerSumRowsMore = 256;
// NCCL's sums from this size on go as bf16 (a pack and an unpack launch cost less than the bytes saved).
constexpr size_t kWireMinElems = size_t(256) << 10;

// What every node must agree on (the same steps, shapes and paths); the model path may differ by host.
std::string agreed_flags(const CudaEngineOptions& o) {
  return fmt::format(
      "weights {} {}, max-model-len {}, max-num-seqs {}, max-tokens-per-step {}, block-size {}, kv {}, dense {}, "
      "vocab-limit {}, prefill-min-tokens {}, flash {}, decode-step-min-tokens {}, decode-ahead {}, graphs {}, "
      "tensor-parallel-size {}, nnodes {}, moe split {}, keep-logits {}",
      o.dummy_weights ? "dummy" : "checkpoint", o.dummy_weights ? o.preset : "", o.max_model_len, o.max_num_seqs,
      o.max_tokens_per_step, o.block_size, o.kv_fp8 ? "fp8" : "bf16", o.dense.describe(), o.vocab_limit,
      o.prefill_min_tokens, int(o.flash_prefill_attention), o.decode_step_min_tokens, int(o.decode_ahead),
      int(o.use_graphs), o.tp.size, o.tp.nnodes, o.tp.moe == MoeSplit::kExperts ? "experts" : "intermediate",
      int(o.keep_logits));
}
}  // namespace

TpRunner::TpRunner(const CudaEngineOptions& opt) : opt_(opt) {
  const TensorParallel& tp = opt.tp;
  const int local = tp.ranks_per_node();
  const ModelConfig cfg = opt.dummy_weights ? preset_config(opt.preset) : load_model_config(opt.model_dir);
  check_tensor_parallel(tp, cfg);
  int gpus = 0;
  MX_CUDA(cudaGetDeviceCount(&gpus));
  if (gpus < local)
    fail("--tensor-parallel-size {} over --nnodes {}: this host has {} GPU{}, {} ranks run on it", tp.size, tp.nnodes,
         gpus, gpus == 1 ? "" : "s", local);
  std::string why;
  if (!cuda::nccl_available(&why)) fail("--tensor-parallel-size {}: {}", tp.size, why);
  // NCCL connects its channels at init rather than on a collective's first use, which may come inside a
  // CUDA graph capture (the warm-up below covers the sizes too); a value set by the user wins.
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  std::string id;
  if (tp.node_rank == 0) {
    const cuda::NcclId u = cuda::nccl_unique_id();
    id.assign(u.bytes, sizeof(u.bytes));
  }
  bool peers = tp.nnodes == 1 && opt.tp_peer_allreduce;  // peer memory reaches this host's GPUs only
  for (int a = 0; peers && a < local; ++a)
    for (int b = 0; b < local; ++b) {
      int ok = 1;
      if (a != b) MX_CUDA(cudaDeviceCanAccessPeer(&ok, a, b));
      peers = peers && ok;
    }
  // The sums over peer memory: the one-token path's residual (8 rows) and per-slot expert outputs (8 x top-k
  // rows), and the wide steps' rows up to a size where NCCL's ring, which moves fewer bytes than a one-shot
  // push to every peer, catches up (docs/perf.md, session 34).
  const size_t decode_sum = size_t(cuda::kDecodeMaxTokens) * cfg.experts_per_token * cfg.hidden_size;
  const size_t wide_rows =
      local == 2 ? size_t(kPeerSumRowsTwoGpus) : size_t(kPeerSumRowsMore) / size_t(std::max(1, local - 1));
  const size_t wide_sum = wide_rows * cfg.hidden_size;
  if (peers) peer_ = std::make_unique<cuda::PeerAllReduce>(local, std::max(decode_sum, wide_sum), decode_sum);
  nccl_.resize(size_t(local));
  comms_.resize(size_t(local));
  wires_.assign(size_t(local), nullptr);
  wire_elems_ = size_t(std::max(opt.max_tokens_per_step, opt.max_num_seqs)) * size_t(cfg.hidden_size);
  group_ = std::make_unique<RankGroup>(
      RankGroupOptions{tp, agreed_flags(opt), opt.tp_step_timeout_s}, id,
      [this](int r, const std::string& secret) { return set_up(r, secret); },
      [this](int r) { nccl_[size_t(r)].reset(); },
      [this] {
        if (peer_) peer_->abandon();
      });
  log::info("tensor parallel: rank{} {}..{} of {} on this node, {} for the decode sums", local > 1 ? "s" : "",
            tp.first_rank(), tp.first_rank() + local - 1, tp.size, peer_ ? "peer memory" : "NCCL");
}

TpRunner::~TpRunner() {
  group_.reset();
  for (size_t r = 0; r < wires_.size(); ++r)
    if (wires_[r]) {
      cudaSetDevice(int(r));
      cudaFree(wires_[r]);
    }
}

// On local rank r's thread: its device, the collectives (warmed up outside any graph capture), its runner.
std::unique_ptr<ModelRunner> TpRunner::set_up(int r, const std::string& nccl_id) {
  const int rank = opt_.tp.first_rank() + r, size = opt_.tp.size;
  cuda::NcclId id;
  if (nccl_id.size() != sizeof(id.bytes)) fail("tensor parallelism: node 0's NCCL id has {} bytes", nccl_id.size());
  std::memcpy(id.bytes, nccl_id.data(), sizeof(id.bytes));
  MX_CUDA(cudaSetDevice(r));
  nccl_[size_t(r)] = std::make_unique<cuda::NcclComm>(id, rank, size, kJoinTimeoutS);
  if (peer_) peer_->join(r);
  comms_[size_t(r)] = cuda::TpComm{rank, size, nccl_[size_t(r)].get(), peer_.get()};
  MX_CUDA(cudaMalloc(&wires_[size_t(r)], wire_elems_ * 2));  // the bf16 wire of NCCL's large sums
  comms_[size_t(r)].wire = wires_[size_t(r)];
  comms_[size_t(r)].wire_elems = wire_elems_;
  comms_[size_t(r)].wire_min_elems = kWireMinElems;
  // Each collective at the sizes the steps use, eagerly: NCCL makes a protocol's connections on its first
  // use, which must not happen inside a graph capture.
  constexpr size_t kWarmFloats = size_t(2) << 20;  // 8 MB a rank: as large as any protocol switch
  float* buf = nullptr;
  cudaStream_t s = nullptr;
  MX_CUDA(cudaMalloc(&buf, kWarmFloats * 4 * size_t(size)));
  MX_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  MX_CUDA(cudaMemsetAsync(buf, 0, kWarmFloats * 4 * size_t(size), s));
  for (size_t n = 1; n <= kWarmFloats; n *= 8) {
    comms_[size_t(r)].all_reduce_sum_f32(buf, n, s);  // the peer path for small n (or NCCL)
    nccl_[size_t(r)]->all_reduce_sum_f32(buf, n, s);
    nccl_[size_t(r)]->all_reduce_sum_bf16(reinterpret_cast<uint16_t*>(buf), n, s);
    nccl_[size_t(r)]->all_gather(buf + size_t(rank) * n, buf, n * 4, s);
  }
  nccl_[size_t(r)]->sync(s, kJoinTimeoutS);
  cudaStreamDestroy(s);
  cudaFree(buf);
  return std::make_unique<CudaRunner>(opt_, rank, &comms_[size_t(r)]);
}

CudaRunner& TpRunner::rank(int local) { return static_cast<CudaRunner&>(group_->rank(local)); }

KvCacheShape TpRunner::kv_shape() const {
  KvCacheShape k = group_->rank(0).kv_shape();
  k.num_blocks = group_->kv_blocks();
  return k;
}

CudaLoadStats TpRunner::load_stats() const {
  CudaLoadStats s;
  for (int r = 0; r < group_->local_ranks(); ++r) {
    const CudaLoadStats x = static_cast<const CudaRunner&>(group_->rank(r)).load_stats();
    s.upload_seconds = std::max(s.upload_seconds, x.upload_seconds);
    s.upload_gbps += x.upload_gbps;
    s.weight_bytes += x.weight_bytes;
    s.kv_bytes += x.kv_bytes;
    s.activation_bytes += x.activation_bytes;
  }
  return s;
}

DecodeAheadStats TpRunner::decode_ahead_stats() const {
  return static_cast<const CudaRunner&>(group_->rank(0)).decode_ahead_stats();
}

void run_remote_steps(CudaRunnerBase& runner) {
  auto* tp = dynamic_cast<TpRunner*>(&runner);
  if (!tp) fail("--node-rank: only a tensor-parallel group across nodes has remote steps");
  tp->run_remote_steps();
}

}  // namespace mx
