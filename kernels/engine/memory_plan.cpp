// The memory plan: activation sizes, metadata layout, KV cache sizing from the free device memory.
#include "kernels/engine/memory_plan.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "kernels/attention_decode/attention_decode.h"
#include "kernels/comm/peer_allreduce.h"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/decode_gemv.h"
#include "kernels/decode/decode_kernels.h"
#include "kernels/moe_prefill/moe_prefill.h"

namespace mx {
namespace {
// cuBLASLt workspace, CUDA graphs and the context, beside the planned buffers.
constexpr size_t kReserve = 512ull << 20;
}  // namespace

MemoryPlan plan_memory(const CudaEngineOptions& opt, const DeviceModel& model) {
  const ModelConfig& c = model.cfg;
  const DeviceShape& d = model.shape;
  MemoryPlan p;
  // >= 64 also leaves room for the router's split-K partials (kRouterSplits x 8 tokens).
  p.T = std::max(opt.max_tokens_per_step, cuda::kDecodeMaxTokens * cuda::kRouterSplits);
  p.S = std::max(opt.max_num_seqs, cuda::kDecodeMaxTokens);
  const size_t T = size_t(p.T), S = size_t(p.S), H = size_t(d.H), V = size_t(d.V), E = size_t(d.E),
               I = size_t(d.I), k = size_t(d.top_k);
  p.moe_max_tiles = cuda::moe_prefill_tile_bound(p.T, d.top_k, d.E);
  // Decode attention runs on at most 8 tokens (decode path) or on the single-token rows of a prefill
  // step (at most one per sequence); only the flash-off cross-check sends it every prompt row.
  p.attn_rows = opt.flash_prefill_attention ? p.S : p.T;
  const size_t attn_part = cuda::attention_decode_scratch_floats(p.attn_rows, d.Hkv, d.D) * 4;
  p.activation_sizes = {
      // ysl also holds a prompt's log-prob rows after the forward (Activations::prompt_logits): at least 8
      T * H * 4, T * H * 4, T * d.qkv_dim() * 4, T * E * 4, T * k * 4,
      std::max(T * k * H, size_t(cuda::kDecodeMaxTokens) * V) * 4,  // xa .. ysl
      S * V * 4, S * 8, size_t(d.D) * 2, attn_part,
      T * H * 2, T * d.q_dim() * 2, T * d.q_dim() * 2, T * k * std::max(I * 2, cuda::moe_fp8_row_bytes(int(I))),
      S * H * 2,  // bf16 (act_bf also holds the FP8 MoE's hi/lo activation rows)
      T * k * 4, T * d.Hkv * cuda::kAttnDecodeGroup * 4,                         // eidx, tickets
      E * 4, (E + 1) * 4, T * k * 4, T * k * 4, size_t(p.moe_max_tiles) * 4, size_t(p.moe_max_tiles) * 4, 4,
      T * k * 4, cuda::argmax_scratch_floats(int(S), int(V), d.tp_size) * 4,      // moe routing, argmax
      cuda::decode_step_counter_words(d.layers) * 4, size_t(d.layers) * sizeof(cuda::DecodeStepLayer),
      size_t(d.layers) * E * 8,  // route_acc; ss_part: the fused o-proj's tiles or, under TP, the peer sum's CTAs
      size_t(std::max(cuda::oproj_router_tiles(d.H), d.tp_size > 1 ? cuda::kPeerMaxCtas : 0)) * 4,
      cuda::attention_decode_mma_scratch_words(std::max(cuda::kDecodeMaxTokens, p.S), d.Hkv) * 8, S * 4,
      dense_scratch_elems(d) * 2, d.tp_size > 1 ? S * V * 4 : 0,
      d.tp_size > 1 ? size_t(cuda::kDecodeMaxTokens) * H * 4 : 0};
  p.prompt_rows = int(std::min<size_t>({size_t(MemoryPlan::kPromptRows), S, p.activation_sizes[5] / (V * 4)}));
  for (size_t b : p.activation_sizes) p.activation_bytes += align256(b);

  const std::vector<int> kv_array = c.kv_array_of_layers();
  p.kv_arrays = *std::max_element(kv_array.begin(), kv_array.end()) + 1;
  const bool any_sliding =
      std::any_of(c.layer_is_sliding.begin(), c.layer_is_sliding.end(), [](uint8_t v) { return v != 0; });
  p.sliding_window = any_sliding ? c.sliding_window : 0;
  const int bs = opt.block_size;
  const int len_blocks = (opt.max_model_len + bs - 1) / bs;
  // The sliding pages one sequence holds at most: its window before the step plus the step's tokens.
  const int window_blocks =
      p.sliding_window > 0 ? std::min(len_blocks, (p.sliding_window - 1 + p.T + bs - 1) / bs + 1) : 0;
  p.bt_cap = p.S * len_blocks * (p.sliding_window > 0 ? 2 : 1) + p.T;
  static_assert(cuda::kAdjustWords == 5, "meta_mask_off() counts five words an adjustment");
  p.mask_words = (model.cfg.vocab_size + 31) / 32;
  p.meta_bytes = (size_t(p.meta_mask_off()) + 1 + size_t(p.mask_slots()) * (1 + size_t(p.mask_words))) * 4;
  p.kv_spec.dtype = opt.kv_fp8 ? cuda::KvDtype::kFp8E4m3 : cuda::KvDtype::kBf16;
  if (opt.kv_fp8) {
    int dev = 0, major = 0, minor = 0;
    MX_CUDA(cudaGetDevice(&dev));
    MX_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    MX_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major * 10 + minor < 89)
      fail("--kv-cache-dtype fp8 needs a GPU with FP8 conversion instructions (compute capability 8.9 or newer); "
           "this one is {}.{}: use bf16", major, minor);
  }
  p.kv_spec.block_size = bs;
  p.kv_spec.row_elems = d.kv_dim();
  p.kv_block_bytes = p.kv_spec.page_bytes() * 2 * size_t(p.kv_arrays);
  p.weight_bytes = model.arena_bytes();

  size_t free_b = 0, total_b = 0;
  MX_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const size_t fixed = p.weight_bytes + p.activation_bytes + 2 * align256(p.meta_bytes) + kReserve;
  const size_t budget = size_t(double(total_b) * opt.gpu_memory_utilization);
  const size_t min_blocks = size_t(len_blocks + window_blocks);
  // The budget's blocks but one: the scratch block (KvCache::scratch_block).
  const int fit = budget > fixed ? int(std::min<size_t>((budget - fixed) / p.kv_block_bytes, 1u << 30)) : 0;
  p.num_blocks = opt.num_kv_blocks > 0 ? opt.num_kv_blocks : std::max(0, fit - 1);
  const size_t need = fixed + (std::max<size_t>(size_t(p.num_blocks), min_blocks) + 1) * p.kv_block_bytes;
  if (p.num_blocks < int(min_blocks) || need > std::min(budget, free_b))
    fail("model does not fit: needs {:.2f} GiB (weights {:.2f}, activations {:.2f}, KV for max_model_len {} = {:.2f}), "
         "available {:.2f} GiB ({} x {:.2f} GiB total, {:.2f} GiB free)",
         need / 1073741824.0, p.weight_bytes / 1073741824.0, p.activation_bytes / 1073741824.0, opt.max_model_len,
         min_blocks * p.kv_block_bytes / 1073741824.0, budget / 1073741824.0, opt.gpu_memory_utilization,
         total_b / 1073741824.0, free_b / 1073741824.0);
  return p;
}

Activations bind_activations(uint8_t* arena, const MemoryPlan& plan) {
  uint8_t* a = arena;
  size_t i = 0;
  auto next = [&]() { uint8_t* q = a; a += align256(plan.activation_sizes[i++]); return q; };
  auto f32 = [&]() { return reinterpret_cast<float*>(next()); };
  auto b16 = [&]() { return reinterpret_cast<uint16_t*>(next()); };
  auto i32 = [&]() { return reinterpret_cast<int32_t*>(next()); };
  Activations x{};
  x.xa = f32(); x.xb = f32(); x.qkv = f32(); x.router = f32(); x.ew = f32(); x.ysl = f32();
  x.logits = f32(); x.scratch = f32(); x.inv_freq = f32(); x.attn_part = f32();
  x.xn = b16(); x.qbf = b16(); x.attn = b16(); x.act_bf = b16(); x.xs = b16();
  x.eidx = i32(); x.tickets = i32();
  x.moe_counts = i32(); x.moe_offsets = i32(); x.moe_sorted_tok = i32(); x.moe_sorted_slot = i32();
  x.moe_tile_expert = i32(); x.moe_tile_row0 = i32(); x.moe_num_tiles = i32(); x.moe_sorted_w = f32();
  x.argmax_part = f32();
  x.step_counters = reinterpret_cast<unsigned*>(next());
  x.step_layers = reinterpret_cast<cuda::DecodeStepLayer*>(next());
  x.route_acc = reinterpret_cast<long long*>(next());
  x.ss_part = f32();
  x.attn_mma_part = reinterpret_cast<unsigned long long*>(next());
  x.picked = i32();
  x.wdq = b16();
  x.logits_tp = f32();
  x.tp_part = f32();
  x.prompt_logits = x.ysl;
  if (i != plan.activation_sizes.size())
    fail("activation arena: {} buffers bound, {} planned", i, plan.activation_sizes.size());
  return x;
}

StepMeta bind_step_meta(int32_t* base, const MemoryPlan& plan) {
  const int T = plan.T, S = plan.S, k = plan.meta_key_off();
  StepMeta m;
  m.tok = base; m.pos = base + T; m.slot = base + 2 * T; m.bt_off = base + 3 * T; m.srow = base + 4 * T;
  m.srow_local = base + 5 * T; m.decode_rows = base + 6 * T; m.slot_sw = base + 7 * T; m.bt_off_sw = base + 8 * T;
  m.sample_key = reinterpret_cast<uint64_t*>(base + k);
  m.inv_temp = reinterpret_cast<float*>(base + k + 2 * S);
  m.top_p = reinterpret_cast<float*>(base + k + 3 * S);
  m.min_p = reinterpret_cast<float*>(base + k + 4 * S);
  m.top_k = base + k + 5 * S;
  m.bt = base + plan.meta_tail();
  m.adj = base + plan.meta_adj_off();
  m.mask = base + plan.meta_mask_off();
  return m;
}

KvCache bind_kv_cache(uint8_t* arena, const MemoryPlan& plan, const ModelConfig& c) {
  KvCache kv;
  kv.spec = plan.kv_spec;
  kv.num_blocks = plan.num_blocks;
  kv.scratch_block = plan.num_blocks;
  kv.sliding_window = plan.sliding_window;
  const size_t array_bytes = size_t(plan.num_blocks + 1) * plan.kv_spec.page_bytes();
  const std::vector<int> kv_array = c.kv_array_of_layers();
  for (int l = 0; l < c.num_layers; ++l) {
    cuda::KvLayer L;
    L.dtype = plan.kv_spec.dtype;
    L.block_size = plan.kv_spec.block_size;
    L.k = arena + size_t(2 * kv_array[size_t(l)]) * array_bytes;
    L.v = static_cast<uint8_t*>(L.k) + array_bytes;
    kv.layers.push_back(L);
  }
  return kv;
}

}  // namespace mx
