// CUDA runner construction: checks the model's shape, plans and allocates the device memory, fills the
// weights (checkpoint upload or dummy weights) and builds the forward. step() is in step.cpp.
#include <cuda_runtime.h>

#include <chrono>
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "kernels/attention_decode/attention_decode.h"
#include "kernels/common/cuda_check.h"
#include "kernels/engine/runner.h"
#include "kernels/engine/tp_runner.h"
#include "kernels/moe_prefill/moe_prefill.h"
#include "kernels/sampling/token_logprobs.h"
#include "model/checkpoint.h"
#include "model/shard_weights.h"
#include "model/weights.h"

namespace mx {
namespace {


ModelConfig load_config(const CudaEngineOptions& opt) {
  ModelConfig c = opt.dummy_weights ? preset_config(opt.preset) : load_model_config(opt.model_dir);
  if (c.num_heads != cuda::kAttnDecodeGroup * c.num_kv_heads)
    fail("CUDA engine: needs {} query heads per KV head, the model has {} / {}", cuda::kAttnDecodeGroup,
         c.num_heads, c.num_kv_heads);
  if (c.head_dim != 64 && c.head_dim != 16) fail("CUDA engine: head_dim {} not supported (64)", c.head_dim);
  if (c.experts_per_token != cuda::kDecodeTopK)
    fail("CUDA engine: experts_per_token must be {}, the model has {}", cuda::kDecodeTopK, c.experts_per_token);
  if (c.hidden_size % 32 || c.intermediate_size % 32 || c.num_experts > 128)
    fail("CUDA engine: hidden and intermediate sizes must be multiples of 32 and experts <= 128");
  return c;
}

}  // namespace

CudaRunner::CudaRunner(const CudaEngineOptions& opt, int rank, const cuda::TpComm* tp)
    : opt_(opt),
      cfg_(load_config(opt)),
      model_(cfg_, DeviceShape::shard(cfg_, opt.dense, rank, opt.tp.size, opt.tp.moe)) {
  std::unique_ptr<Checkpoint> ckpt;
  if (!opt.dummy_weights) ckpt = std::make_unique<Checkpoint>(Checkpoint::open(opt.model_dir));
  MX_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MX_CUDA(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  if (opt_.prefill_min_tokens <= 0) opt_.prefill_min_tokens = cuda::moe_fp8_available() ? 5 : 9;
  plan_ = plan_memory(opt_, model_);
  allocate();
  const auto t0 = std::chrono::steady_clock::now();
  size_t bytes = 0;
  const size_t scratch = dense_scratch_elems(model_.shape);
  if (opt.dummy_weights) model_.fill_dummy(opt.seed, stream_, act_.wdq, scratch);
  else if (opt.tp.size == 1) bytes = model_.upload(bind_weights(*ckpt, cfg_), stream_, act_.wdq, scratch);
  else {  // this rank's slices, cut on the host (shard_weights.h)
    const ShardWeights sw = shard_weights(bind_weights(*ckpt, cfg_), cfg_,
                                          shard_dims(cfg_, rank, opt.tp.size, opt.tp.moe), opt.tp.moe,
                                          rank == 0);
    bytes = model_.upload(sw.weights, stream_, act_.wdq, scratch);
  }
  stats_.upload_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (bytes) {
    stats_.upload_gbps = bytes / stats_.upload_seconds / 1e9;
    log::info("uploaded {:.2f} GB of weights in {:.2f} s ({:.2f} GB/s)", bytes / 1e9, stats_.upload_seconds,
              stats_.upload_gbps);
  }
  model_.check_scales(reinterpret_cast<unsigned long long*>(act_.scratch), stream_);
  model_.find_row_scales(stream_);
  ForwardOptions fo;
  fo.decode_step_min_tokens = opt.decode_step_min_tokens;
  fo.flash_prefill_attention = opt.flash_prefill_attention;
  vocab_limit_ = opt.vocab_limit > 0 && opt.vocab_limit < cfg_.vocab_size ? opt.vocab_limit : cfg_.vocab_size;
  fo.vocab_limit = vocab_limit_;
  fo.tp = tp;
  forward_ = std::make_unique<Forward>(model_, kv_, act_, fo, stream_, probe_);
  for (auto& e : done_) MX_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (auto& e : copied_) MX_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (auto& e : began_) MX_CUDA(cudaEventCreate(&e));
  for (auto& e : ended_) MX_CUDA(cudaEventCreate(&e));
}

void CudaRunner::allocate() {
  const MemoryPlan& p = plan_;
  const size_t kv_bytes = p.kv_bytes();
  const size_t meta = align256(p.meta_bytes);
  MX_CUDA(cudaMalloc(&weights_arena_, p.weight_bytes));
  MX_CUDA(cudaMalloc(&act_arena_, p.activation_bytes + 2 * meta));  // + two device metadata buffers (parity)
  MX_CUDA(cudaMalloc(&kv_arena_, kv_bytes));
  // Attention kernels zero the weight of keys they must not see, and 0 x NaN is NaN: a never-written
  // block (read through the rounding of a tile edge) must hold finite values.
  MX_CUDA(cudaMemset(kv_arena_, 0, kv_bytes));
  MX_CUDA(cudaMemset(act_arena_, 0, p.activation_bytes + 2 * meta));  // tickets and counters start at zero
  stats_.weight_bytes = p.weight_bytes;
  stats_.activation_bytes = p.activation_bytes;
  stats_.kv_bytes = kv_bytes;
  model_.bind(weights_arena_);
  act_ = bind_activations(act_arena_, p);
  kv_ = bind_kv_cache(kv_arena_, p, cfg_);
  // Two host buffers: decode ahead plans a step while the one before may not have been copied yet.
  MX_CUDA(cudaMallocHost(&hmeta_block_, 2 * meta));
  for (int i = 0; i < 2; ++i) {
    hmeta_[i] = bind_step_meta(hmeta_block_ + i * meta / 4, p);
    dmeta_[i] = bind_step_meta(reinterpret_cast<int32_t*>(act_arena_ + p.activation_bytes + i * meta), p);
  }
  MX_CUDA(cudaMallocHost(&host_logits_, size_t(p.S) * cfg_.vocab_size * 4));
  // The picks and log-probs are written by the kernels straight into mapped host memory: no
  // copy-engine hop between the step's last kernel and the host's wake-up.
  MX_CUDA(cudaHostAlloc(&host_res_, 2 * size_t(p.S) * 8, cudaHostAllocMapped));
  MX_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&res_dev_), host_res_, 0));
  MX_CUDA(cudaHostAlloc(&prompt_targets_, size_t(p.T) * 4, cudaHostAllocMapped));
  MX_CUDA(cudaHostAlloc(&prompt_res_, size_t(p.T) * cuda::kTokenLogprobFloats * 4, cudaHostAllocMapped));
  MX_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&prompt_targets_dev_), prompt_targets_, 0));
  MX_CUDA(cudaHostAlloc(&prompt_rows_, size_t(p.T) * 4, cudaHostAllocMapped));
  MX_CUDA(cudaHostAlloc(&top_rows_, size_t(p.S) * 4, cudaHostAllocMapped));
  MX_CUDA(cudaHostAlloc(&top_res_, size_t(p.S) * cuda::kTokenLogprobFloats * 4, cudaHostAllocMapped));
  MX_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&top_rows_dev_), top_rows_, 0));
  MX_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&top_res_dev_), top_res_, 0));
  MX_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&prompt_rows_dev_), prompt_rows_, 0));
  MX_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&prompt_res_dev_), prompt_res_, 0));
}

CudaRunner::~CudaRunner() {
  cudaStreamSynchronize(stream_);
  cudaStreamSynchronize(copy_stream_);
  graphs_.clear();
  wide_graphs_.clear();
  forward_.reset();
  for (auto e : done_) cudaEventDestroy(e);
  for (auto e : copied_) cudaEventDestroy(e);
  for (auto e : began_) cudaEventDestroy(e);
  for (auto e : ended_) cudaEventDestroy(e);
  cudaStreamDestroy(copy_stream_);
  cudaFree(weights_arena_);
  cudaFree(act_arena_);
  cudaFree(kv_arena_);
  cudaFreeHost(hmeta_block_);
  cudaFreeHost(prompt_targets_);
  cudaFreeHost(prompt_rows_);
  cudaFreeHost(top_rows_);
  cudaFreeHost(top_res_);
  cudaFreeHost(prompt_res_);
  cudaFreeHost(host_logits_);
  cudaFreeHost(host_res_);
  cudaStreamDestroy(stream_);
}

std::span<const float> CudaRunner::last_logits(int index) const {
  if (!opt_.keep_logits || index < 0 || index >= last_sampled_) return {};
  return {host_logits_ + size_t(index) * cfg_.vocab_size, size_t(cfg_.vocab_size)};
}

void DecodeGraphs::clear() {
  for (auto& g : g_)
    if (g) {
      cudaGraphExecDestroy(g);
      g = nullptr;
    }
}

cudaGraphExec_t WideGraphs::find(const WideGraphKey& k) {
  for (Entry& e : e_)
    if (e.key == k) {
      e.used = ++clock_;
      return e.exec;
    }
  return nullptr;
}

bool WideGraphs::repeats(const WideGraphKey& k) {
  WideGraphKey a = k;
  a.parity = last_.parity;
  const bool same = a == last_;
  last_ = k;
  return same;
}

void WideGraphs::add(const WideGraphKey& k, cudaGraphExec_t g) {
  if (int(e_.size()) >= kMax) {
    auto lru = std::min_element(e_.begin(), e_.end(), [](const Entry& a, const Entry& b) { return a.used < b.used; });
    cudaGraphExecDestroy(lru->exec);
    e_.erase(lru);
  }
  e_.push_back({k, g, ++clock_});
}

void WideGraphs::clear() {
  for (Entry& e : e_) cudaGraphExecDestroy(e.exec);
  e_.clear();
  last_ = {};
}

std::unique_ptr<CudaRunnerBase> make_cuda_runner(const CudaEngineOptions& opt) {
  if (opt.tp.size > 1 || opt.tp.nnodes > 1) return std::make_unique<TpRunner>(opt);
  return std::make_unique<CudaRunner>(opt);
}

}  // namespace mx
