// CUDA runner: memory plan (one weights arena, one activation arena, paged bf16 KV cache),
// weight upload through pinned staging, the forward pass as named kernel calls, sampling.
#include "kernels/engine/cuda_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "kernels/decode/decode_kernels.h"
#include "model/checkpoint.h"
#include "model/rope.h"
#include "model/sampler.h"
#include "model/weights.h"

namespace mx {
namespace {

#define MX_CUDA(x)                                                                       \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) fail("CUDA error {} at {}:{}", cudaGetErrorString(e_), __FILE__, __LINE__); \
  } while (0)

size_t align256(size_t n) { return (n + 255) & ~size_t(255); }

struct DevLayer {
  uint16_t *attn_norm, *qkv_w, *qkv_b, *o_w, *o_b, *sinks, *mlp_norm, *router_w, *router_b;
  uint8_t *up_blocks, *up_scales, *down_blocks, *down_scales;
  uint16_t *up_bias, *down_bias;
  uint16_t *k_cache, *v_cache;
};

// Byte sizes of every tensor of one layer, in arena order.
struct LayerSizes {
  size_t attn_norm, qkv_w, qkv_b, o_w, o_b, sinks, mlp_norm, router_w, router_b, up_blocks, up_scales, up_bias,
      down_blocks, down_scales, down_bias;
  explicit LayerSizes(const ModelConfig& c) {
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
  size_t total() const {
    size_t t = 0;
    for (size_t s : {attn_norm, qkv_w, qkv_b, o_w, o_b, sinks, mlp_norm, router_w, router_b, up_blocks, up_scales,
                     up_bias, down_blocks, down_scales, down_bias})
      t += align256(s);
    return t;
  }
};

class CudaRunner final : public CudaRunnerBase {
 public:
  explicit CudaRunner(const CudaEngineOptions& opt) : opt_(opt) {
    std::unique_ptr<Checkpoint> ckpt;
    if (opt.dummy_weights) {
      cfg_ = preset_config(opt.preset);
    } else {
      cfg_ = load_model_config(opt.model_dir);
      ckpt = std::make_unique<Checkpoint>(Checkpoint::open(opt.model_dir));
    }
    MX_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    plan_memory();
    if (opt.dummy_weights) fill_dummy();
    else upload(bind_weights(*ckpt, cfg_));
    std::vector<float> inv(cfg_.head_dim / 2);
    concentration_ = yarn_inv_freq(cfg_, inv.data()).concentration;
    MX_CUDA(cudaMemcpy(inv_freq_, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  }
  ~CudaRunner() override {
    cudaStreamSynchronize(stream_);
    cudaFree(weights_);
    cudaFree(act_);
    cudaFree(kv_);
    cudaFreeHost(host_meta_);
    cudaFreeHost(host_logits_);
    cudaStreamDestroy(stream_);
  }

  const ModelConfig& config() const override { return cfg_; }
  KvCacheShape kv_shape() const override { return {opt_.block_size, num_blocks_}; }
  CudaLoadStats load_stats() const override { return stats_; }
  double decode_weight_bytes(int M) const override {
    const LayerSizes s(cfg_);
    const double E = cfg_.num_experts, k = cfg_.experts_per_token;
    // Expected distinct experts touched by M tokens with uniform routing.
    const double touched = E * (1.0 - std::pow(1.0 - k / E, M));
    const double expert = double(s.up_blocks + s.up_scales + s.up_bias + s.down_blocks + s.down_scales + s.down_bias) / E;
    const double dense = double(s.total()) - expert * E;
    return cfg_.num_layers * (dense + touched * expert) + double(cfg_.vocab_size) * cfg_.hidden_size * 2 * M / M +
           double(cfg_.hidden_size) * 2 * M;  // lm_head + embedding rows
  }

  std::span<const float> last_logits(int index) const override {
    if (!opt_.keep_logits || index < 0 || index >= last_sampled_) return {};
    return {host_logits_ + size_t(index) * cfg_.vocab_size, size_t(cfg_.vocab_size)};
  }

  void step(std::span<const SeqStep> seqs, std::span<SampleResult> out) override {
    MX_CHECK(out.size() == seqs.size(), "step: out.size() {} != seqs.size() {}", out.size(), seqs.size());
    int32_t* tok = host_meta_;
    int32_t* pos = tok + T_;
    int32_t* slot = pos + T_;
    int32_t* bto = slot + T_;
    int32_t* srow = bto + T_;
    int32_t* bt = srow + T_;
    int M = 0, S = 0, nbt = 0;
    std::vector<int> sample_seq;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const SeqStep& q = seqs[i];
      const int n = int(q.tokens.size());
      if (M + n > T_) fail("step has more than max_tokens_per_step={} tokens", T_);
      if (nbt + int(q.block_table.size()) > bt_cap_) fail("step block tables exceed {} entries", bt_cap_);
      const int need = (q.start_pos + n + opt_.block_size - 1) / opt_.block_size;
      if (int(q.block_table.size()) < need) fail("sequence {} block table covers {} blocks, needs {}", q.seq_id, q.block_table.size(), need);
      std::memcpy(bt + nbt, q.block_table.data(), q.block_table.size() * 4);
      for (int j = 0; j < n; ++j) {
        const int p = q.start_pos + j;
        const int blk = q.block_table[p / opt_.block_size];
        if (blk < 0 || blk >= num_blocks_) fail("block id {} out of range [0, {})", blk, num_blocks_);
        tok[M + j] = q.tokens[j];
        if (tok[M + j] < 0 || tok[M + j] >= cfg_.vocab_size) fail("token id {} out of range", tok[M + j]);
        pos[M + j] = p;
        slot[M + j] = blk * opt_.block_size + p % opt_.block_size;
        bto[M + j] = nbt;
      }
      nbt += int(q.block_table.size());
      M += n;
      if (q.sample && n > 0) {
        srow[S++] = M - 1;
        sample_seq.push_back(int(i));
      }
    }
    if (M == 0) return;
    MX_CUDA(cudaMemcpyAsync(dmeta_, host_meta_, size_t(5 * T_ + nbt) * 4, cudaMemcpyHostToDevice, stream_));
    forward(M, S);
    last_sampled_ = S;
    if (S == 0) {
      MX_CUDA(cudaStreamSynchronize(stream_));
      return;
    }
    bool need_logits = opt_.keep_logits;
    for (int i : sample_seq)
      need_logits |= seqs[i].sampling.temperature > 0.f || seqs[i].sampling.top_logprobs > 0;
    MX_CUDA(cudaMemcpyAsync(host_res_, dres_, size_t(S) * 8, cudaMemcpyDeviceToHost, stream_));
    if (need_logits)
      MX_CUDA(cudaMemcpyAsync(host_logits_, logits_, size_t(S) * cfg_.vocab_size * 4, cudaMemcpyDeviceToHost, stream_));
    MX_CUDA(cudaStreamSynchronize(stream_));
    const int32_t* rtok = reinterpret_cast<const int32_t*>(host_res_);
    const float* rlp = reinterpret_cast<const float*>(host_res_) + S;
    for (int s = 0; s < S; ++s) {
      const SeqStep& q = seqs[sample_seq[s]];
      if (q.sampling.temperature > 0.f || q.sampling.top_logprobs > 0) {
        // TODO(gpu sampling): temperature/top-k/top-p still sample on the host from copied logits.
        out[sample_seq[s]] = sample_token(host_logits_ + size_t(s) * cfg_.vocab_size, cfg_.vocab_size, q.sampling,
                                          q.rng_step, scratch_);
      } else {
        out[sample_seq[s]].token = rtok[s];
        out[sample_seq[s]].logprob = rlp[s];
        out[sample_seq[s]].top.clear();
      }
    }
  }

 private:
  void plan_memory() {
    const ModelConfig& c = cfg_;
    const size_t H = c.hidden_size, V = c.vocab_size;
    const LayerSizes ls(c);
    const size_t wbytes = align256(V * H * 2) * 2 + align256(H * 2) + ls.total() * c.num_layers;
    T_ = opt_.max_tokens_per_step;
    const int S = std::max(opt_.max_num_seqs, 1);
    const size_t k = c.experts_per_token;
    const size_t abytes = align256(T_ * H * 4) * 2 + align256(size_t(T_) * c.qkv_dim() * 4) +
                          align256(size_t(T_) * c.q_dim() * 4) + align256(size_t(T_) * c.num_experts * 4) +
                          align256(T_ * k * 8) + align256(T_ * k * c.intermediate_size * 4) +
                          align256(size_t(S) * H * 4) + align256(size_t(S) * V * 4) + align256(S * 8) +
                          align256(size_t(c.head_dim) * 2);
    bt_cap_ = S * ((opt_.max_model_len + opt_.block_size - 1) / opt_.block_size) + T_;
    const size_t meta = size_t(5 * T_ + bt_cap_) * 4;
    const size_t per_block = size_t(opt_.block_size) * c.kv_dim() * 2 * 2 * c.num_layers;
    size_t free_b = 0, total_b = 0;
    MX_CUDA(cudaMemGetInfo(&free_b, &total_b));
    const size_t fixed = wbytes + abytes + align256(meta) + (256ull << 20);  // + CUDA context / graph slack
    const size_t budget = size_t(double(total_b) * opt_.gpu_memory_utilization);
    const size_t min_blocks = (opt_.max_model_len + opt_.block_size - 1) / opt_.block_size;
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
    MX_CUDA(cudaMalloc(&act_, abytes + align256(meta)));
    MX_CUDA(cudaMalloc(&kv_, size_t(num_blocks_) * per_block));
    stats_.weight_bytes = wbytes;
    stats_.activation_bytes = abytes;
    stats_.kv_bytes = size_t(num_blocks_) * per_block;
    uint8_t* w = weights_;
    auto take = [&](size_t n) { uint8_t* p = w; w += align256(n); return p; };
    embed_ = reinterpret_cast<uint16_t*>(take(V * H * 2));
    lm_head_ = reinterpret_cast<uint16_t*>(take(V * H * 2));
    final_norm_ = reinterpret_cast<uint16_t*>(take(H * 2));
    const size_t kv_layer = size_t(num_blocks_) * opt_.block_size * c.kv_dim();
    layers_.resize(c.num_layers);
    for (int l = 0; l < c.num_layers; ++l) {
      DevLayer& d = layers_[l];
      auto t16 = [&](size_t n) { return reinterpret_cast<uint16_t*>(take(n)); };
      d.attn_norm = t16(ls.attn_norm); d.qkv_w = t16(ls.qkv_w); d.qkv_b = t16(ls.qkv_b); d.o_w = t16(ls.o_w);
      d.o_b = t16(ls.o_b); d.sinks = t16(ls.sinks); d.mlp_norm = t16(ls.mlp_norm); d.router_w = t16(ls.router_w);
      d.router_b = t16(ls.router_b); d.up_blocks = take(ls.up_blocks); d.up_scales = take(ls.up_scales);
      d.up_bias = t16(ls.up_bias); d.down_blocks = take(ls.down_blocks); d.down_scales = take(ls.down_scales);
      d.down_bias = t16(ls.down_bias);
      d.k_cache = reinterpret_cast<uint16_t*>(kv_) + size_t(2 * l) * kv_layer;
      d.v_cache = d.k_cache + kv_layer;
    }
    uint8_t* a = act_;
    auto af = [&](size_t n) { uint8_t* p = a; a += align256(n); return reinterpret_cast<float*>(p); };
    x_ = af(T_ * H * 4); t_ = af(T_ * H * 4); qkv_ = af(size_t(T_) * c.qkv_dim() * 4); attn_ = af(size_t(T_) * c.q_dim() * 4);
    router_ = af(size_t(T_) * c.num_experts * 4);
    float* iw = af(T_ * k * 8);
    eidx_ = reinterpret_cast<int32_t*>(iw); ew_ = iw + T_ * k;
    moe_act_ = af(T_ * k * c.intermediate_size * 4);
    xs_ = af(size_t(S) * H * 4); logits_ = af(size_t(S) * V * 4); dres_ = af(S * 8);
    inv_freq_ = af(size_t(c.head_dim) * 2);
    dmeta_ = reinterpret_cast<int32_t*>(a);
    MX_CUDA(cudaMallocHost(&host_meta_, meta));
    MX_CUDA(cudaMallocHost(&host_logits_, size_t(S) * V * 4));
    MX_CUDA(cudaMallocHost(&host_res_, size_t(S) * 8));
  }

  void fill_dummy() {
    const auto t0 = std::chrono::steady_clock::now();
    const ModelConfig& c = cfg_;
    const size_t H = c.hidden_size, V = c.vocab_size;
    uint64_t seed = opt_.seed * 1000003;
    auto bf = [&](uint16_t* p, size_t n, float sc, float off = 0.f) { cuda::launch_fill_random_bf16(p, n, sc, off, ++seed, stream_); };
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
  void upload(const ModelWeights& w) {
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
    log::info("uploaded {:.2f} GB of weights in {:.2f} s ({:.2f} GB/s)", total / 1e9, stats_.upload_seconds, stats_.upload_gbps);
  }

  // The forward pass over M tokens; logits + greedy pick for the S sampled rows.
  void forward(int M, int S) {
    const ModelConfig& c = cfg_;
    const int H = c.hidden_size, E = c.num_experts, k = c.experts_per_token, I = c.intermediate_size;
    int32_t* tok = dmeta_; int32_t* pos = tok + T_; int32_t* slot = pos + T_; int32_t* bto = slot + T_;
    int32_t* srow = bto + T_; int32_t* bt = srow + T_;
    cudaStream_t s = stream_;
    cuda::launch_embed_bf16(embed_, tok, x_, M, H, s);
    for (int l = 0; l < c.num_layers; ++l) {
      const DevLayer& L = layers_[l];
      cuda::launch_rmsnorm_f32(x_, nullptr, L.attn_norm, t_, M, H, c.rms_norm_eps, s);
      cuda::launch_gemv_bf16(L.qkv_w, L.qkv_b, t_, qkv_, M, c.qkv_dim(), H, c.qkv_dim(), false, s);
      cuda::launch_rope_kv({qkv_, pos, slot, inv_freq_, concentration_, L.k_cache, L.v_cache, M, c.num_heads,
                            c.num_kv_heads, c.head_dim}, s);
      cuda::launch_attention({qkv_, L.k_cache, L.v_cache, pos, bto, bt, L.sinks, attn_, M, c.num_heads,
                              c.num_kv_heads, c.head_dim, opt_.block_size, c.layer_is_sliding[l] ? c.sliding_window : 0}, s);
      cuda::launch_gemv_bf16(L.o_w, L.o_b, attn_, x_, M, H, c.q_dim(), H, true, s);
      cuda::launch_rmsnorm_f32(x_, nullptr, L.mlp_norm, t_, M, H, c.rms_norm_eps, s);
      cuda::launch_gemv_bf16(L.router_w, L.router_b, t_, router_, M, E, H, E, false, s);
      cuda::launch_topk_softmax(router_, eidx_, ew_, M, E, k, s);
      cuda::launch_moe_fc1_swiglu({L.up_blocks, L.up_scales, L.up_bias, t_, eidx_, moe_act_, M, k, H, I,
                                   c.swiglu_alpha, c.swiglu_limit}, s);
      cuda::launch_moe_fc2_combine({L.down_blocks, L.down_scales, L.down_bias, moe_act_, eidx_, ew_, x_, M, k, H, I}, s);
    }
    if (S == 0) return;
    cuda::launch_rmsnorm_f32(x_, srow, final_norm_, xs_, S, H, c.rms_norm_eps, s);
    cuda::launch_gemv_bf16(lm_head_, nullptr, xs_, logits_, S, c.vocab_size, H, c.vocab_size, false, s);
    cuda::launch_argmax_logprob(logits_, S, c.vocab_size, reinterpret_cast<int32_t*>(dres_), dres_ + S, s);
    MX_CUDA(cudaGetLastError());
  }

  CudaEngineOptions opt_;
  ModelConfig cfg_;
  cudaStream_t stream_ = nullptr;
  CudaLoadStats stats_;
  int T_ = 0, bt_cap_ = 0, num_blocks_ = 0, last_sampled_ = 0;
  uint8_t *weights_ = nullptr, *act_ = nullptr, *kv_ = nullptr;
  uint16_t *embed_ = nullptr, *lm_head_ = nullptr, *final_norm_ = nullptr;
  std::vector<DevLayer> layers_;
  float *x_, *t_, *qkv_, *attn_, *router_, *ew_, *moe_act_, *xs_, *logits_, *dres_, *inv_freq_;
  int32_t *eidx_, *dmeta_;
  float concentration_ = 1.f;
  int32_t* host_meta_ = nullptr;
  float* host_logits_ = nullptr;
  void* host_res_ = nullptr;
  std::vector<float> scratch_;
};

}  // namespace

std::unique_ptr<CudaRunnerBase> make_cuda_runner(const CudaEngineOptions& opt) {
  return std::make_unique<CudaRunner>(opt);
}

}  // namespace mx
