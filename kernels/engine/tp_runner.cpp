// The tensor-parallel group: the nodes' meeting, set-up per rank (device, NCCL, peer buffers, the runner
// over its shard), each step fanned out to the ranks' threads (and first sent to the other nodes), and
// failures turned into one line.
#include "kernels/engine/tp_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/decode_gemv.h"
#include "kernels/engine/runner.h"

namespace mx {
namespace {
constexpr double kJoinTimeoutS = 120;   // NCCL's set-up: every rank joins within this
constexpr double kMeetTimeoutS = 600;   // the nodes' rendezvous: every node starts within this
using Clock = std::chrono::steady_clock;

// What every node must agree on (the same steps, shapes and paths); the model path may differ by host.
std::string agreed_flags(const CudaEngineOptions& o) {
  return fmt::format(
      "weights {} {}, max-model-len {}, max-num-seqs {}, max-tokens-per-step {}, block-size {}, kv {}, dense {}, "
      "vocab-limit {}, prefill-min-tokens {}, flash {}, decode-step-min-tokens {}, decode-ahead {}, graphs {}, "
      "tensor-parallel-size {}, nnodes {}, moe split {}",
      o.dummy_weights ? "dummy" : "checkpoint", o.dummy_weights ? o.preset : "", o.max_model_len, o.max_num_seqs,
      o.max_tokens_per_step, o.block_size, o.kv_fp8 ? "fp8" : "bf16", o.dense.describe(), o.vocab_limit,
      o.prefill_min_tokens, int(o.flash_prefill_attention), o.decode_step_min_tokens, int(o.decode_ahead),
      int(o.use_graphs), o.tp.size, o.tp.nnodes, o.tp.moe == MoeSplit::kExperts ? "experts" : "intermediate");
}
}  // namespace

TpRunner::TpRunner(const CudaEngineOptions& opt)
    : opt_(opt), size_(opt.tp.size), local_(opt.tp.ranks_per_node()), first_(opt.tp.first_rank()),
      nccl_(size_t(local_)), comms_(size_t(local_)), runners_(size_t(local_)), rank_out_(size_t(local_)),
      errors_(size_t(local_)) {
  const ModelConfig cfg = opt.dummy_weights ? preset_config(opt.preset) : load_model_config(opt.model_dir);
  check_tensor_parallel(opt.tp, cfg);
  int gpus = 0;
  MX_CUDA(cudaGetDeviceCount(&gpus));
  if (gpus < local_)
    fail("--tensor-parallel-size {} over --nnodes {}: this host has {} GPU{}, {} ranks run on it", size_, opt.tp.nnodes,
         gpus, gpus == 1 ? "" : "s", local_);
  std::string why;
  if (!cuda::nccl_available(&why)) fail("--tensor-parallel-size {}: {}", size_, why);
  if (opt.tp.node_rank == 0) id_ = cuda::nccl_unique_id();
  if (opt.tp.nnodes > 1) meet_nodes(cfg);
  bool peers = opt.tp.nnodes == 1;  // peer memory reaches this host's GPUs only
  for (int a = 0; peers && a < local_; ++a)
    for (int b = 0; b < local_; ++b) {
      int ok = 1;
      if (a != b) MX_CUDA(cudaDeviceCanAccessPeer(&ok, a, b));
      peers = peers && ok;
    }
  // The decode path's sums: the residual (8 rows) and the per-slot expert outputs (8 x top-k rows).
  const size_t decode_sum = size_t(cuda::kDecodeMaxTokens) * cfg.experts_per_token * cfg.hidden_size;
  if (peers) peer_ = std::make_unique<cuda::PeerAllReduce>(local_, decode_sum);
  for (int r = 0; r < local_; ++r) threads_.emplace_back([this, r] { rank_main(r); });
  {
    std::unique_lock lk(mu_);
    done_.wait(lk, [&] { return ready_ == local_; });
  }
  std::string first;
  for (int r = 0; r < local_; ++r)
    if (!errors_[size_t(r)].empty() && first.empty()) first = fmt::format("rank {}: {}", first_ + r, errors_[size_t(r)]);
  if (!first.empty()) {
    shutdown();
    throw Error("tensor parallelism: " + first);
  }
  // Every node's KV pool takes the same block ids: node 0 learns the fewest any node holds.
  int blocks = runners_[0]->kv_shape().num_blocks;
  for (const auto& r : runners_) blocks = std::min(blocks, r->kv_shape().num_blocks);
  if (to_node0_) to_node0_->send("kv " + std::to_string(blocks));
  for (size_t n = 1; n < links_.size(); ++n) {
    std::string msg;
    try {
      links_[n]->recv(msg, -1);
    } catch (const Error&) {
      shutdown();
      fail("tensor parallelism: node {} ended while loading the model (its log says why)", n);
    }
    if (msg.rfind("kv ", 0) != 0) fail("tensor parallelism: node {} sent '{}' instead of its KV blocks", n, msg.substr(0, 40));
    remote_blocks_ = std::min(remote_blocks_, std::atoi(msg.c_str() + 3));
  }
  if (links_.size() > 1) watcher_ = std::thread([this] { watch_nodes(); });
  log::info("tensor parallel: rank{} {}..{} of {} on this node, {} for the decode sums", local_ > 1 ? "s" : "", first_,
            first_ + local_ - 1, size_, peer_ ? "peer memory" : "NCCL");
}

// Node 0 listens on --master-port and hands NCCL's id and its flags to the other nodes, which check theirs.
void TpRunner::meet_nodes(const ModelConfig& cfg) {
  (void)cfg;
  const TensorParallel& tp = opt_.tp;
  const std::string flags = agreed_flags(opt_);
  if (tp.node_rank == 0) {
    RendezvousServer server(tp.master_port);
    log::info("tensor parallel: waiting on port {} for {} other node(s)", server.port(), tp.nnodes - 1);
    links_ = server.serve(tp.nnodes, std::string(id_.bytes, sizeof(id_.bytes)) + flags, kMeetTimeoutS);
    return;
  }
  Rendezvous r = rendezvous_connect(tp.master_addr, tp.master_port, tp.node_rank, kMeetTimeoutS);
  if (r.blob.size() < sizeof(id_.bytes)) fail("--master-addr {}: not an mxserve node 0", tp.master_addr);
  const std::string theirs = r.blob.substr(sizeof(id_.bytes));
  if (theirs != flags)
    fail("--node-rank {}: this node's flags differ from node 0's (node 0: {}; here: {})", tp.node_rank, theirs, flags);
  std::memcpy(id_.bytes, r.blob.data(), sizeof(id_.bytes));
  to_node0_ = std::move(r.link);
}

TpRunner::~TpRunner() {
  {  // first the watcher: the other nodes leave once they read "quit"
    std::lock_guard lk(mu_);
    unwatch_ = true;
  }
  done_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  for (size_t n = 1; n < links_.size(); ++n) {
    try {
      links_[n]->send("quit");
    } catch (const Error&) {
    }
  }
  shutdown();
}

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

// Between steps nothing else would notice: a server idle when another node ends must not wait for the
// next request to say so.
void TpRunner::watch_nodes() {
  std::unique_lock lk(mu_);
  while (!done_.wait_for(lk, std::chrono::milliseconds(200), [&] { return unwatch_; })) {
    for (size_t n = 1; n < links_.size(); ++n)
      if (links_[n]->closed()) fatal(fmt::format("node {} has ended (its log says why)", n));
  }
}

// On local rank r's thread: its device, the collectives (warmed up outside any graph capture), its runner.
void TpRunner::set_up(int r) {
  const int rank = first_ + r;
  MX_CUDA(cudaSetDevice(r));
  nccl_[size_t(r)] = std::make_unique<cuda::NcclComm>(id_, rank, size_, kJoinTimeoutS);
  if (peer_) peer_->join(r);
  comms_[size_t(r)] = cuda::TpComm{rank, size_, nccl_[size_t(r)].get(), peer_.get()};
  float* buf = nullptr;
  cudaStream_t s = nullptr;
  MX_CUDA(cudaMalloc(&buf, size_t(2 + size_) * 4));
  MX_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  MX_CUDA(cudaMemsetAsync(buf, 0, size_t(2 + size_) * 4, s));
  comms_[size_t(r)].all_reduce_sum_f32(buf, 1, s);           // the peer path (or NCCL)
  nccl_[size_t(r)]->all_reduce_sum_f32(buf, 2, s);           // NCCL's channels
  nccl_[size_t(r)]->all_gather(buf + 2 + rank, buf + 2, 4, s);  // and its gather
  nccl_[size_t(r)]->sync(s, kJoinTimeoutS);
  cudaStreamDestroy(s);
  cudaFree(buf);
  runners_[size_t(r)] = std::make_unique<CudaRunner>(opt_, rank, &comms_[size_t(r)]);
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
      if (!runners_[size_t(r)]) fail("rank {} was not set up", first_ + r);
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
  if (to_node0_) fail("tensor parallelism: steps come from node 0 on node {}", opt_.tp.node_rank);
  if (links_.size() > 1) {
    encode_step(seqs, out.size(), wire_);
    for (size_t n = 1; n < links_.size(); ++n) {
      try {
        links_[n]->send(wire_);
      } catch (const Error&) {
        fatal(fmt::format("node {} has ended (its log says why)", n));
      }
    }
  }
  run_local(seqs, out);
}

void TpRunner::run_remote_steps() {
  if (!to_node0_) fail("tensor parallelism: only a node other than 0 runs node 0's steps");
  WireStep w;
  std::vector<SampleResult> out;
  std::string msg;
  for (;;) {
    try {
      to_node0_->recv(msg, -1);
    } catch (const Error&) {
      fatal("node 0 has ended without saying so (its log says why)");
    }
    if (msg == "quit") return;
    decode_step(msg, w);
    out.resize(w.num_results);
    try {
      run_local(w.seqs, out);
    } catch (const Error& e) {  // refused alike on every rank, node 0 too: it goes on, so do we
      log::warn("tensor parallel: a step refused: {}", e.what());
    }
  }
}

// This node's ranks run the step; waits for them, watching the other nodes' connections.
void TpRunner::run_local(std::span<const SeqStep> seqs, std::span<SampleResult> out) {
  std::unique_lock lk(mu_);
  seqs_ = seqs;
  out_ = out;
  for (int r = 1; r < local_; ++r) rank_out_[size_t(r)].resize(out.size());
  finished_ = 0;
  ++gen_;
  go_.notify_all();
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(opt_.tp_step_timeout_s));
  const bool remote = links_.size() > 1 || to_node0_;
  for (;;) {
    const auto until = remote ? std::min(deadline, Clock::now() + std::chrono::milliseconds(100)) : deadline;
    if (done_.wait_until(lk, until, [&] { return finished_ == local_; })) break;
    if (Clock::now() >= deadline)
      fatal(fmt::format("{} of this node's {} ranks did not finish a step within {:.0f} s: a GPU or a rank hangs",
                        local_ - finished_, local_, opt_.tp_step_timeout_s));
    for (size_t n = 1; n < links_.size(); ++n)
      if (links_[n]->closed()) fatal(fmt::format("node {} ended during a step (its log says why)", n));
    if (to_node0_ && to_node0_->closed()) fatal("node 0 ended during a step (its log says why)");
  }
  int failed = 0;
  for (const auto& e : errors_) failed += !e.empty();
  if (failed == 0) return;
  // Every rank refused the step alike (its input) before any collective: nothing waits, go on.
  bool same = failed == local_;
  for (const auto& e : errors_) same = same && e == errors_[0];
  if (same) throw Error(errors_[0]);
  for (int r = 0; r < local_; ++r)
    if (!errors_[size_t(r)].empty())
      fatal(fmt::format("rank {} failed a step: {}; the other ranks cannot go on", first_ + r, errors_[size_t(r)]));
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
  k.num_blocks = std::min(k.num_blocks, remote_blocks_);
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

void run_remote_steps(CudaRunnerBase& runner) {
  auto* tp = dynamic_cast<TpRunner*>(&runner);
  if (!tp) fail("--node-rank: only a tensor-parallel group across nodes has remote steps");
  tp->run_remote_steps();
}

}  // namespace mx
