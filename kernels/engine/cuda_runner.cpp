// CUDA runner: memory plan (one weights arena, one activation arena, paged bf16 KV cache), weight
// upload through pinned staging; step() and the decode graphs are in step.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "kernels/attention_decode/attention_decode.h"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/decode_gemv.h"
#include "kernels/decode/decode_kernels.h"
#include "kernels/engine/runner_impl.h"
#include "kernels/moe_prefill/moe_prefill.h"
#include "model/checkpoint.h"
#include "model/rope.h"
#include "model/weights.h"

namespace mx {
namespace {
size_t align256(size_t n) { return (n + 255) & ~size_t(255); }
// Per-op step trace capacity: a one-token layer launches ~1,540 CTAs; later records are dropped.
constexpr size_t kOpTraceCtasPerLayer = 4096;
}  // namespace

LayerSizes::LayerSizes(const ModelConfig& c) {
  const size_t H = c.hidden_size, E = c.num_experts, I = c.intermediate_size;
  attn_norm = mlp_norm = H * 2;
  qkv_w = size_t(c.qkv_dim()) * H * 2;
  qkv_b = size_t(c.qkv_dim()) * 2;
  o_w = H * c.q_dim() * 2;
  o_b = H * 2;
  sinks = size_t(c.num_heads) * 2;
  router_w = E * H * 2;
  router_b = E * 2;
  up_blocks = E * 2 * I * H / 2;
  up_scales = E * 2 * I * H / 32;
  up_bias = E * 2 * I * 2;
  down_blocks = E * H * I / 2;
  down_scales = E * H * I / 32;
  down_bias = E * H * 2;
}
size_t LayerSizes::total() const {
  size_t t = 0;
  for (size_t s : {attn_norm, qkv_w, qkv_b, o_w, o_b, sinks, mlp_norm, router_w, router_b, up_blocks, up_scales,
                   up_bias, down_blocks, down_scales, down_bias})
    t += align256(s);
  return t;
}
size_t LayerSizes::expert_bytes() const {
  return up_blocks + up_scales + up_bias + down_blocks + down_scales + down_bias;
}

double expected_distinct_experts(const ModelConfig& c, int M) {
  const double E = c.num_experts;
  return E * (1.0 - std::pow(1.0 - double(c.experts_per_token) / E, M));
}

CudaRunner::CudaRunner(const CudaEngineOptions& opt) : opt_(opt) {
  std::unique_ptr<Checkpoint> ckpt;
  if (opt.dummy_weights) {
    cfg_ = preset_config(opt.preset);
  } else {
    cfg_ = load_model_config(opt.model_dir);
    ckpt = std::make_unique<Checkpoint>(Checkpoint::open(opt.model_dir));
  }
  if (cfg_.num_heads != cuda::kAttnDecodeGroup * cfg_.num_kv_heads)
    fail("CUDA engine: needs {} query heads per KV head, the model has {} / {}", cuda::kAttnDecodeGroup,
         cfg_.num_heads, cfg_.num_kv_heads);
  if (cfg_.head_dim != 64 && cfg_.head_dim != 16) fail("CUDA engine: head_dim {} not supported (64)", cfg_.head_dim);
  if (cfg_.experts_per_token != cuda::kDecodeTopK)
    fail("CUDA engine: experts_per_token must be {}, the model has {}", cuda::kDecodeTopK, cfg_.experts_per_token);
  if (cfg_.hidden_size % 32 || cfg_.intermediate_size % 32 || cfg_.num_experts > 128)
    fail("CUDA engine: hidden and intermediate sizes must be multiples of 32 and experts <= 128");
  vocab_limit_ = opt.vocab_limit > 0 && opt.vocab_limit < cfg_.vocab_size ? opt.vocab_limit : cfg_.vocab_size;
  MX_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MX_CUDA(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  plan_memory();
  if (opt.dummy_weights) fill_dummy();
  else upload(bind_weights(*ckpt, cfg_));
  check_scales();
  std::vector<float> inv(cfg_.head_dim / 2);
  concentration_ = yarn_inv_freq(cfg_, inv.data()).concentration;
  MX_CUDA(cudaMemcpy(inv_freq_, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  gemm_ = cuda::gemm_context_create();
  int dev = 0;
  MX_CUDA(cudaGetDevice(&dev));
  MX_CUDA(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, dev));
  mma_attention_ = cfg_.head_dim == 64 && cfg_.num_heads == 8 * cfg_.num_kv_heads;
  events_.resize(1024);
  for (auto& e : events_) MX_CUDA(cudaEventCreate(&e));
  for (auto& e : done_) MX_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (auto& e : copied_) MX_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

CudaRunner::~CudaRunner() {
  cudaStreamSynchronize(stream_);
  for (auto g : graphs_)
    if (g) cudaGraphExecDestroy(g);
  for (auto e : events_) cudaEventDestroy(e);
  for (auto e : done_) cudaEventDestroy(e);
  for (auto e : copied_) cudaEventDestroy(e);
  cudaStreamSynchronize(copy_stream_);
  cudaStreamDestroy(copy_stream_);
  if (gemm_) cuda::gemm_context_destroy(gemm_);
  cudaFree(weights_);
  if (step_trace_) cudaFree(step_trace_);
  cudaFree(act_);
  cudaFree(kv_);
  cudaFreeHost(hmeta_buf_[0].tok);
  cudaFreeHost(host_logits_);
  cudaFreeHost(host_res_);
  cudaStreamDestroy(stream_);
}

double CudaRunner::decode_weight_bytes(int M) const {
  const LayerSizes s(cfg_);
  const double touched = expected_distinct_experts(cfg_, M);
  const double expert = double(s.expert_bytes()) / cfg_.num_experts;
  const double dense = double(s.total()) - double(s.expert_bytes());
  return cfg_.num_layers * (dense + touched * expert) + double(cfg_.vocab_size) * cfg_.hidden_size * 2 +
         double(cfg_.hidden_size) * 2 * M;  // lm_head + embedding rows
}

std::span<const float> CudaRunner::last_logits(int index) const {
  if (!opt_.keep_logits || index < 0 || index >= last_sampled_) return {};
  return {host_logits_ + size_t(index) * cfg_.vocab_size, size_t(cfg_.vocab_size)};
}

void CudaRunner::plan_memory() {
  const ModelConfig& c = cfg_;
  const size_t H = c.hidden_size, V = c.vocab_size, E = c.num_experts, I = c.intermediate_size;
  const LayerSizes ls(c);
  const size_t wbytes = align256(V * H * 2) * 2 + align256(H * 2) + ls.total() * c.num_layers;
  // >= 64 also leaves room for the router's split-K partials (kRouterSplits x 8 tokens).
  T_ = std::max(opt_.max_tokens_per_step, cuda::kDecodeMaxTokens * cuda::kRouterSplits);
  S_ = std::max(opt_.max_num_seqs, cuda::kDecodeMaxTokens);
  const size_t T = T_, S = S_, k = c.experts_per_token;
  moe_max_tiles_ = cuda::moe_prefill_max_tiles(T_, int(k), int(E));
  // name, bytes: the activation arena in order (see the take() calls below).
  // Decode attention runs on at most 8 tokens (decode path) or on the single-token rows of a prefill
  // step (at most one per sequence); only the flash-off cross-check sends it every prompt row.
  attn_rows_ = opt_.flash_prefill_attention ? std::max(S_, cuda::kDecodeMaxTokens) : T_;
  const size_t attn_part = cuda::attention_decode_scratch_floats(attn_rows_, c.num_kv_heads, c.head_dim) * 4;
  const std::vector<size_t> abuf = {
      T * H * 4, T * H * 4, T * c.qkv_dim() * 4, T * E * 4, T * k * 4, T * k * H * 4, S * V * 4, S * 8,
      size_t(c.head_dim) * 2, attn_part,                                                  // floats
      T * H * 2, T * c.q_dim() * 2, T * c.q_dim() * 2, T * k * I * 2, S * H * 2,          // bf16
      T * k * 4, T * c.num_kv_heads * cuda::kAttnDecodeGroup * 4,                         // eidx, tickets
      E * 4, (E + 1) * 4, T * k * 4, T * k * 4, size_t(moe_max_tiles_) * 4, size_t(moe_max_tiles_) * 4, 4,
      T * k * 4, cuda::argmax_scratch_floats(int(S), int(V)) * 4,
      cuda::decode_step_counter_words(c.num_layers) * 4, c.num_layers * sizeof(cuda::DecodeStepLayer),
      size_t(c.num_layers) * E * 8, size_t(cuda::oproj_router_tiles(int(H))) * 4,  // one-token router sums
      cuda::attention_decode_mma_scratch_words(cuda::kDecodeMaxTokens, c.num_kv_heads) * 8,  // decode path only
      S * 4};  // the picks on the device (decode ahead)
  size_t abytes = 0;
  for (size_t b : abuf) abytes += align256(b);
  // KV: one K and one V array per (full, sliding) layer pair. A block is a page of the full layers
  // or of the sliding ones (model_runner.h), so the j-th full and the j-th sliding layer share array
  // j, and a sequence's sliding pages cover only its window: with gpt-oss's alternating layers the
  // cache holds twice the tokens of one array per layer.
  const std::vector<int> kv_array = c.kv_array_of_layers();
  const int kv_arrays = *std::max_element(kv_array.begin(), kv_array.end()) + 1;
  const bool any_sliding =
      std::any_of(c.layer_is_sliding.begin(), c.layer_is_sliding.end(), [](uint8_t v) { return v != 0; });
  sliding_window_ = any_sliding ? c.sliding_window : 0;
  const int len_blocks = (opt_.max_model_len + opt_.block_size - 1) / opt_.block_size;
  // The sliding pages one sequence holds at most: its window before the step plus the step's tokens.
  const int window_blocks =
      sliding_window_ > 0
          ? std::min(len_blocks, (sliding_window_ - 1 + T_ + opt_.block_size - 1) / opt_.block_size + 1)
          : 0;
  bt_cap_ = int(S) * len_blocks * (sliding_window_ > 0 ? 2 : 1) + T_;
  meta_bytes_ = size_t(meta_tail() + bt_cap_) * 4;
  const size_t per_block = size_t(opt_.block_size) * c.kv_dim() * 2 * 2 * kv_arrays;
  size_t free_b = 0, total_b = 0;
  MX_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const size_t fixed = wbytes + abytes + 2 * align256(meta_bytes_) + (512ull << 20);  // + cuBLASLt, graphs, context
  const size_t budget = size_t(double(total_b) * opt_.gpu_memory_utilization);
  const size_t min_blocks = size_t(len_blocks + window_blocks);
  if (opt_.num_kv_blocks > 0) num_blocks_ = opt_.num_kv_blocks;
  else num_blocks_ = budget > fixed ? int(std::min<size_t>((budget - fixed) / per_block, 1u << 30)) : 0;
  const size_t need = fixed + std::max<size_t>(num_blocks_, min_blocks) * per_block;
  if (num_blocks_ < int(min_blocks) || need > std::min(budget, free_b))
    fail("model does not fit: needs {:.2f} GiB (weights {:.2f}, activations {:.2f}, KV for max_model_len {} = {:.2f}), "
         "available {:.2f} GiB ({} x {:.2f} GiB total, {:.2f} GiB free)",
         need / 1073741824.0, wbytes / 1073741824.0, abytes / 1073741824.0, opt_.max_model_len,
         min_blocks * per_block / 1073741824.0, budget / 1073741824.0, opt_.gpu_memory_utilization,
         total_b / 1073741824.0, free_b / 1073741824.0);
  MX_CUDA(cudaMalloc(&weights_, wbytes));
  MX_CUDA(cudaMalloc(&act_, abytes + 2 * align256(meta_bytes_)));  // + two device metadata buffers (parity)
  MX_CUDA(cudaMalloc(&kv_, size_t(num_blocks_) * per_block));
  // Attention kernels zero the weight of keys they must not see, and 0 x NaN is NaN: a never-written
  // block (read through the rounding of a tile edge) must hold finite values.
  MX_CUDA(cudaMemset(kv_, 0, size_t(num_blocks_) * per_block));
  MX_CUDA(cudaMemset(act_, 0, abytes + 2 * align256(meta_bytes_)));  // tickets must start at zero
  stats_.weight_bytes = wbytes;
  stats_.activation_bytes = abytes;
  stats_.kv_bytes = size_t(num_blocks_) * per_block;

  uint8_t* w = weights_;
  auto take = [&](size_t n) { uint8_t* p = w; w += align256(n); return p; };
  auto t16 = [&](size_t n) { return reinterpret_cast<uint16_t*>(take(n)); };
  embed_ = t16(V * H * 2);
  lm_head_ = t16(V * H * 2);
  final_norm_ = t16(H * 2);
  const size_t kv_layer = size_t(num_blocks_) * opt_.block_size * c.kv_dim();
  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    DevLayer& d = layers_[l];
    d.attn_norm = t16(ls.attn_norm); d.qkv_w = t16(ls.qkv_w); d.qkv_b = t16(ls.qkv_b); d.o_w = t16(ls.o_w);
    d.o_b = t16(ls.o_b); d.sinks = t16(ls.sinks); d.mlp_norm = t16(ls.mlp_norm); d.router_w = t16(ls.router_w);
    d.router_b = t16(ls.router_b); d.up_blocks = take(ls.up_blocks); d.up_scales = take(ls.up_scales);
    d.up_bias = t16(ls.up_bias); d.down_blocks = take(ls.down_blocks); d.down_scales = take(ls.down_scales);
    d.down_bias = t16(ls.down_bias);
    d.k_cache = reinterpret_cast<uint16_t*>(kv_) + size_t(2 * kv_array[size_t(l)]) * kv_layer;
    d.v_cache = d.k_cache + kv_layer;
  }
  uint8_t* a = act_;
  size_t bi = 0;
  auto next = [&]() { uint8_t* p = a; a += align256(abuf[bi++]); return p; };
  auto f32 = [&]() { return reinterpret_cast<float*>(next()); };
  auto b16 = [&]() { return reinterpret_cast<uint16_t*>(next()); };
  auto i32 = [&]() { return reinterpret_cast<int32_t*>(next()); };
  xa_ = f32(); xb_ = f32(); qkv_ = f32(); router_ = f32(); ew_ = f32(); ysl_ = f32(); logits_ = f32(); dres_ = f32();
  inv_freq_ = f32(); attn_part_ = f32();
  xn_ = b16(); qbf_ = b16(); attn_ = b16(); act_bf_ = b16(); xs_ = b16();
  eidx_ = i32(); tickets_ = i32();
  moe_counts_ = i32(); moe_offsets_ = i32(); moe_sorted_tok_ = i32(); moe_sorted_slot_ = i32();
  moe_tile_expert_ = i32(); moe_tile_row0_ = i32(); moe_num_tiles_ = i32(); moe_sorted_w_ = f32();
  argmax_part_ = f32();
  step_counters_ = reinterpret_cast<unsigned*>(next());
  step_layers_ = reinterpret_cast<cuda::DecodeStepLayer*>(next());
  route_acc_ = reinterpret_cast<long long*>(next());
  ss_part_ = f32();
  attn_mma_part_ = reinterpret_cast<unsigned long long*>(next());
  dtok_ = i32();
  std::vector<cuda::DecodeStepLayer> sl(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const DevLayer& d = layers_[l];
    sl[l] = {d.attn_norm, d.qkv_w, d.qkv_b, d.o_w, d.o_b, d.sinks, d.mlp_norm, d.router_w, d.router_b,
             d.up_blocks, d.up_scales, d.down_blocks, d.down_scales, d.up_bias, d.down_bias, d.k_cache, d.v_cache,
             c.layer_is_sliding[l] ? c.sliding_window : 0};
  }
  MX_CUDA(cudaMemcpy(step_layers_, sl.data(), sl.size() * sizeof(sl[0]), cudaMemcpyHostToDevice));
  int32_t* dm = reinterpret_cast<int32_t*>(a);
  int32_t* hm = nullptr;
  // Two host buffers: decode ahead plans a step while the one before may not have been copied yet.
  MX_CUDA(cudaMallocHost(&hm, 2 * align256(meta_bytes_)));
  auto lay = [&](int32_t* base, StepMeta& m) {
    m.tok = base; m.pos = base + T_; m.slot = base + 2 * T_; m.bt_off = base + 3 * T_; m.srow = base + 4 * T_;
    m.srow_local = base + 5 * T_; m.decode_rows = base + 6 * T_; m.slot_sw = base + 7 * T_; m.bt_off_sw = base + 8 * T_;
    m.sample_key = reinterpret_cast<uint64_t*>(base + meta_key_off());
    m.inv_temp = reinterpret_cast<float*>(base + meta_key_off() + 2 * S_);
    m.top_p = reinterpret_cast<float*>(base + meta_key_off() + 3 * S_);
    m.min_p = reinterpret_cast<float*>(base + meta_key_off() + 4 * S_);
    m.top_k = base + meta_key_off() + 5 * S_;
    m.bt = base + meta_tail();
  };
  lay(hm, hmeta_buf_[0]);
  lay(hm + align256(meta_bytes_) / 4, hmeta_buf_[1]);
  hmeta_ = hmeta_buf_[0];
  lay(dm, dmeta_buf_[0]);
  lay(dm + align256(meta_bytes_) / 4, dmeta_buf_[1]);
  dmeta_ = dmeta_buf_[0];
  MX_CUDA(cudaMallocHost(&host_logits_, S * V * 4));
  // The sampled tokens and log-probs are written by the kernels straight into mapped host memory: no
  // copy-engine hop between the step's last kernel and the host's wake-up.
  MX_CUDA(cudaHostAlloc(&host_res_, 2 * S * 8, cudaHostAllocMapped));  // two slots (parity)
  MX_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&res_dev_), host_res_, 0));
}

void CudaRunner::fill_dummy() {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& c = cfg_;
  const size_t H = c.hidden_size, V = c.vocab_size;
  uint64_t seed = opt_.seed * 1000003;
  auto bf = [&](uint16_t* p, size_t n, float sc, float off = 0.f) {
    cuda::launch_fill_random_bf16(p, n, sc, off, ++seed, stream_);
  };
  bf(embed_, V * H, 1.0f);
  bf(lm_head_, V * H, 0.05f);
  bf(final_norm_, H, 0.1f, 1.0f);
  const LayerSizes ls(c);
  for (auto& d : layers_) {
    bf(d.attn_norm, H, 0.1f, 1.0f); bf(d.mlp_norm, H, 0.1f, 1.0f);
    bf(d.qkv_w, ls.qkv_w / 2, 0.03f); bf(d.qkv_b, ls.qkv_b / 2, 0.1f);
    bf(d.o_w, ls.o_w / 2, 0.03f); bf(d.o_b, H, 0.1f); bf(d.sinks, c.num_heads, 1.0f);
    bf(d.router_w, ls.router_w / 2, 0.05f); bf(d.router_b, c.num_experts, 0.1f);
    cuda::launch_fill_random_u8(d.up_blocks, ls.up_blocks, 0, 0, ++seed, stream_);
    cuda::launch_fill_random_u8(d.up_scales, ls.up_scales, 118, 4, ++seed, stream_);
    bf(d.up_bias, ls.up_bias / 2, 0.1f);
    cuda::launch_fill_random_u8(d.down_blocks, ls.down_blocks, 0, 0, ++seed, stream_);
    cuda::launch_fill_random_u8(d.down_scales, ls.down_scales, 118, 4, ++seed, stream_);
    bf(d.down_bias, ls.down_bias / 2, 0.1f);
  }
  MX_CUDA(cudaStreamSynchronize(stream_));
  stats_.upload_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Host -> device through two pinned staging buffers so the memcpy into one overlaps the DMA of the other.
void CudaRunner::upload(const ModelWeights& w) {
  const auto t0 = std::chrono::steady_clock::now();
  constexpr size_t kStage = 64ull << 20;
  uint8_t* stage[2];
  cudaEvent_t ev[2];
  for (int i = 0; i < 2; ++i) {
    MX_CUDA(cudaMallocHost(&stage[i], kStage));
    MX_CUDA(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
    MX_CUDA(cudaEventRecord(ev[i], stream_));
  }
  int cur = 0;
  size_t total = 0;
  auto put = [&](void* dst, const void* src, size_t n) {
    const uint8_t* s = static_cast<const uint8_t*>(src);
    uint8_t* d = static_cast<uint8_t*>(dst);
    for (size_t off = 0; off < n; off += kStage) {
      const size_t len = std::min(kStage, n - off);
      MX_CUDA(cudaEventSynchronize(ev[cur]));
      std::memcpy(stage[cur], s + off, len);
      MX_CUDA(cudaMemcpyAsync(d + off, stage[cur], len, cudaMemcpyHostToDevice, stream_));
      MX_CUDA(cudaEventRecord(ev[cur], stream_));
      cur ^= 1;
    }
    total += n;
  };
  const ModelConfig& c = cfg_;
  const size_t H = c.hidden_size, V = c.vocab_size;
  const LayerSizes ls(c);
  put(embed_, w.embed, V * H * 2);
  put(lm_head_, w.lm_head, V * H * 2);
  put(final_norm_, w.final_norm, H * 2);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    DevLayer& d = layers_[l];
    const size_t qr = size_t(c.q_dim()), kr = size_t(c.kv_dim());
    put(d.attn_norm, L.attn_norm, ls.attn_norm);
    // q, k, v concatenated by rows: one GEMV for the three projections.
    put(d.qkv_w, L.q_w, qr * H * 2);
    put(d.qkv_w + qr * H, L.k_w, kr * H * 2);
    put(d.qkv_w + (qr + kr) * H, L.v_w, kr * H * 2);
    put(d.qkv_b, L.q_b, qr * 2);
    put(d.qkv_b + qr, L.k_b, kr * 2);
    put(d.qkv_b + qr + kr, L.v_b, kr * 2);
    put(d.o_w, L.o_w, ls.o_w); put(d.o_b, L.o_b, ls.o_b); put(d.sinks, L.sinks, ls.sinks);
    put(d.mlp_norm, L.mlp_norm, ls.mlp_norm); put(d.router_w, L.router_w, ls.router_w);
    put(d.router_b, L.router_b, ls.router_b);
    put(d.up_blocks, L.gate_up_blocks, ls.up_blocks); put(d.up_scales, L.gate_up_scales, ls.up_scales);
    put(d.up_bias, L.gate_up_bias, ls.up_bias);
    put(d.down_blocks, L.down_blocks, ls.down_blocks); put(d.down_scales, L.down_scales, ls.down_scales);
    put(d.down_bias, L.down_bias, ls.down_bias);
  }
  MX_CUDA(cudaStreamSynchronize(stream_));
  for (int i = 0; i < 2; ++i) {
    cudaEventDestroy(ev[i]);
    cudaFreeHost(stage[i]);
  }
  stats_.upload_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats_.upload_gbps = total / stats_.upload_seconds / 1e9;
  log::info("uploaded {:.2f} GB of weights in {:.2f} s ({:.2f} GB/s)", total / 1e9, stats_.upload_seconds,
            stats_.upload_gbps);
}

// The decode kernels fold the E8M0 scale into one bf16 multiply, which covers scales up to 2^1.
void CudaRunner::check_scales() {
  unsigned long long* bad = reinterpret_cast<unsigned long long*>(dres_);
  MX_CUDA(cudaMemsetAsync(bad, 0, 8, stream_));
  const LayerSizes ls(cfg_);
  for (const auto& d : layers_) {
    cuda::mxfp4_count_bad_scales(d.up_scales, ls.up_scales, bad, stream_);
    cuda::mxfp4_count_bad_scales(d.down_scales, ls.down_scales, bad, stream_);
  }
  unsigned long long n = 0;
  MX_CUDA(cudaMemcpyAsync(&n, bad, 8, cudaMemcpyDeviceToHost, stream_));
  MX_CUDA(cudaStreamSynchronize(stream_));
  if (n) fail("checkpoint has {} MXFP4 expert scales above 2^1 (E8M0 > 128); the CUDA engine does not support them", n);
}

bool CudaRunner::prefill_path_supported() const { return cfg_.head_dim == 64; }


void CudaRunner::set_step_trace(bool on) {
  if (on == (step_trace_ != nullptr)) return;
  ahead_.active = false;
  const ModelConfig& c = cfg_;
  if (on) {
    const size_t n = cuda::decode_step_items(cuda::kDecodeMaxTokens, c.num_layers, c.hidden_size, c.intermediate_size,
                                             c.num_experts, c.num_heads, c.num_kv_heads, c.head_dim);
    step_trace_words_ = std::max(n * 4, size_t(c.num_layers) * kOpTraceCtasPerLayer * 4);
    MX_CUDA(cudaMalloc(&step_trace_, step_trace_words_ * 8 + 8));  // + the per-op cursor
  } else {
    MX_CUDA(cudaFree(step_trace_));
    step_trace_ = nullptr;
    step_trace_words_ = 0;
  }
  step_trace_items_ = 0;
  for (auto& g : graphs_)  // captured with the old trace pointer
    if (g) {
      MX_CUDA(cudaGraphExecDestroy(g));
      g = nullptr;
    }
}

cuda::CtaTrace CudaRunner::op_trace(int layer) const {
  cuda::CtaTrace t;
  if (!step_trace_) return t;
  t.buf = step_trace_;
  t.cursor = reinterpret_cast<unsigned*>(step_trace_ + step_trace_words_);
  t.cap = unsigned(step_trace_words_ / 4);
  t.layer = layer;
  return t;
}

std::vector<uint64_t> CudaRunner::last_step_trace() const {
  size_t items = step_trace_items_;
  if (step_trace_kind_ == 2 && step_trace_) {  // per-op records: as many as the cursor says
    unsigned n = 0;
    MX_CUDA(cudaMemcpy(&n, step_trace_ + step_trace_words_, sizeof n, cudaMemcpyDeviceToHost));
    items = std::min<size_t>(n, step_trace_words_ / 4);
  }
  std::vector<uint64_t> v(items * 4);
  if (!v.empty()) MX_CUDA(cudaMemcpy(v.data(), step_trace_, v.size() * 8, cudaMemcpyDeviceToHost));
  return v;
}

void CudaRunner::mark(const char* name, double bytes) {
  if (!profiling_ || marks_.size() + 1 >= events_.size()) return;
  marks_.push_back({name, bytes});
  MX_CUDA(cudaEventRecord(events_[marks_.size()], stream_));
}

std::unique_ptr<CudaRunnerBase> make_cuda_runner(const CudaEngineOptions& opt) {
  return std::make_unique<CudaRunner>(opt);
}

}  // namespace mx
