// The tensor-parallel group on one host: set-up per rank (device, NCCL, peer buffers, the runner over its
// shard), the step fanned out to the ranks' threads, failures turned into one line.
#include "kernels/engine/tp_runner.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "core/log.h"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/decode_gemv.h"
#include "kernels/engine/runner.h"

namespace mx {
namespace {
constexpr double kJoinTimeoutS = 120;  // NCCL's set-up: every rank joins within this
}  // namespace

TpRunner::TpRunner(const CudaEngineOptions& opt)
    : opt_(opt), size_(opt.tp.size), nccl_(size_t(opt.tp.size)), comms_(size_t(opt.tp.size)),
      runners_(size_t(opt.tp.size)), rank_out_(size_t(opt.tp.size)), errors_(size_t(opt.tp.size)) {
  if (opt.tp.nnodes > 1)
    fail("--nnodes {}: tensor parallelism across hosts is not built yet; use the GPUs of one host (--nnodes 1)",
         opt.tp.nnodes);
  int gpus = 0;
  MX_CUDA(cudaGetDeviceCount(&gpus));
  if (gpus < size_)
    fail("--tensor-parallel-size {}: this host has {} GPU{} (one rank a GPU)", size_, gpus, gpus == 1 ? "" : "s");
  const ModelConfig cfg = opt.dummy_weights ? preset_config(opt.preset) : load_model_config(opt.model_dir);
  check_tensor_parallel(opt.tp, cfg);
  std::string why;
  if (!cuda::nccl_available(&why)) fail("--tensor-parallel-size {}: {}", size_, why);
  id_ = cuda::nccl_unique_id();
  bool peers = true;
  for (int a = 0; a < size_; ++a)
    for (int b = 0; b < size_; ++b) {
      int ok = 1;
      if (a != b) MX_CUDA(cudaDeviceCanAccessPeer(&ok, a, b));
      peers = peers && ok;
    }
  // The decode path's sums: the residual (8 rows) and the per-slot expert outputs (8 x top-k rows).
  const size_t decode_sum = size_t(cuda::kDecodeMaxTokens) * cfg.experts_per_token * cfg.hidden_size;
  if (peers) peer_ = std::make_unique<cuda::PeerAllReduce>(size_, decode_sum);
  for (int r = 0; r < size_; ++r) threads_.emplace_back([this, r] { rank_main(r); });
  std::unique_lock lk(mu_);
  done_.wait(lk, [&] { return ready_ == size_; });
  std::string first;
  for (int r = 0; r < size_; ++r)
    if (!errors_[size_t(r)].empty() && first.empty()) first = fmt::format("rank {}: {}", r, errors_[size_t(r)]);
  lk.unlock();
  if (!first.empty()) {
    shutdown();
    throw Error("tensor parallelism: " + first);
  }
  log::info("tensor parallel: {} ranks, {} for the decode sums", size_, peer_ ? "peer memory" : "NCCL");
}

TpRunner::~TpRunner() { shutdown(); }

void TpRunner::shutdown() {
  {
    std::lock_guard lk(mu_);
    if (stop_) return;
    stop_ = true;
  }
  go_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

// On rank r's thread: its device, the collectives (warmed up outside any graph capture), its runner.
void TpRunner::set_up(int r) {
  MX_CUDA(cudaSetDevice(r));
  nccl_[size_t(r)] = std::make_unique<cuda::NcclComm>(id_, r, size_, kJoinTimeoutS);
  if (peer_) peer_->join(r);
  comms_[size_t(r)] = cuda::TpComm{r, size_, nccl_[size_t(r)].get(), peer_.get()};
  float* buf = nullptr;
  cudaStream_t s = nullptr;
  MX_CUDA(cudaMalloc(&buf, size_t(2 + size_) * 4));
  MX_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  MX_CUDA(cudaMemsetAsync(buf, 0, size_t(2 + size_) * 4, s));
  comms_[size_t(r)].all_reduce_sum_f32(buf, 1, s);                    // the peer path
  nccl_[size_t(r)]->all_reduce_sum_f32(buf, 2, s);                    // NCCL's channels
  nccl_[size_t(r)]->all_gather(buf + 2 + r, buf + 2, 4, s);           // and its gather
  nccl_[size_t(r)]->sync(s, kJoinTimeoutS);
  cudaStreamDestroy(s);
  cudaFree(buf);
  runners_[size_t(r)] = std::make_unique<CudaRunner>(opt_, r, &comms_[size_t(r)]);
}

void TpRunner::rank_main(int r) {
  try {
    set_up(r);
  } catch (const std::exception& e) {
    errors_[size_t(r)] = e.what();
    if (peer_) peer_->abandon();
  }
  std::unique_lock lk(mu_);
  ++ready_;
  done_.notify_all();
  unsigned long long seen = 0;
  for (;;) {
    go_.wait(lk, [&] { return stop_ || gen_ != seen; });
    if (stop_) break;
    seen = gen_;
    const std::span<const SeqStep> seqs = seqs_;
    const std::span<SampleResult> out = r == 0 ? out_ : std::span<SampleResult>(rank_out_[size_t(r)]);
    lk.unlock();
    std::string err;
    try {
      if (!runners_[size_t(r)]) fail("rank {} was not set up", r);
      runners_[size_t(r)]->step(seqs, out);
    } catch (const std::exception& e) {
      err = e.what();
    }
    lk.lock();
    errors_[size_t(r)] = err;
    ++finished_;
    done_.notify_all();
  }
  lk.unlock();
  // Torn down on the rank's own device.
  cudaSetDevice(r);
  runners_[size_t(r)].reset();
  nccl_[size_t(r)].reset();
}

void TpRunner::step(std::span<const SeqStep> seqs, std::span<SampleResult> out) {
  std::unique_lock lk(mu_);
  seqs_ = seqs;
  out_ = out;
  for (int r = 1; r < size_; ++r) rank_out_[size_t(r)].resize(out.size());
  finished_ = 0;
  ++gen_;
  go_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(opt_.tp_step_timeout_s));
  if (!done_.wait_until(lk, deadline, [&] { return finished_ == size_; }))
    fatal(fmt::format("{} of {} ranks did not finish a step within {:.0f} s: a GPU or a rank hangs", size_ - finished_,
                      size_, opt_.tp_step_timeout_s));
  int failed = 0;
  for (const auto& e : errors_) failed += !e.empty();
  if (failed == 0) return;
  // Every rank refused the step alike (its input) before any collective: nothing waits, go on.
  bool same = failed == size_;
  for (const auto& e : errors_) same = same && e == errors_[0];
  if (same) throw Error(errors_[0]);
  for (int r = 0; r < size_; ++r)
    if (!errors_[size_t(r)].empty())
      fatal(fmt::format("rank {} failed a step: {}; the other ranks cannot go on", r, errors_[size_t(r)]));
  fatal("a rank failed");
}

// The other ranks' kernels wait on the failed one's collectives and cannot be stopped from here.
void TpRunner::fatal(const std::string& why) const {
  log::error("tensor parallelism: {}; exiting", why);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

const ModelConfig& TpRunner::config() const { return runners_[0]->config(); }

KvCacheShape TpRunner::kv_shape() const {
  KvCacheShape k = runners_[0]->kv_shape();
  for (const auto& r : runners_) k.num_blocks = std::min(k.num_blocks, r->kv_shape().num_blocks);
  return k;
}

CudaLoadStats TpRunner::load_stats() const {
  CudaLoadStats s;
  for (const auto& r : runners_) {
    const CudaLoadStats x = r->load_stats();
    s.upload_seconds = std::max(s.upload_seconds, x.upload_seconds);
    s.upload_gbps += x.upload_gbps;
    s.weight_bytes += x.weight_bytes;
    s.kv_bytes += x.kv_bytes;
    s.activation_bytes += x.activation_bytes;
  }
  return s;
}

DecodeAheadStats TpRunner::decode_ahead_stats() const { return runners_[0]->decode_ahead_stats(); }

std::span<const float> TpRunner::last_logits(int index) const { return runners_[0]->last_logits(index); }

}  // namespace mx
