// The prefill forward: a step with more than 8 tokens (prompt chunks mixed with decodes). Tensor-core
// GEMMs (cuBLASLt) for the dense projections, the grouped MXFP4 MoE, flash attention per prompt
// chunk, and the decode attention kernel for all single-token sequences in one launch.
#include "kernels/attention_decode/attention_decode.h"
#include "kernels/attention_prefill/attention_prefill.h"
#include "kernels/decode/decode_kernels.h"
#include "kernels/engine/runner_impl.h"
#include "kernels/moe_prefill/moe_prefill.h"

namespace mx {

void CudaRunner::forward_prefill(int M, int S, const std::vector<std::array<int, 4>>& seqs, int n_decode) {
  const ModelConfig& c = cfg_;
  const int H = c.hidden_size, E = c.num_experts, I = c.intermediate_size, k = c.experts_per_token;
  const int D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads, QKV = c.qkv_dim();
  const StepMeta& m = dmeta_;
  cudaStream_t s = stream_;
  // Profile marks carry no byte counts here: prefill is compute-bound.
  auto gemm = [&](const uint16_t* x, const uint16_t* w, const uint16_t* b, void* y, int N, int K, bool acc) {
    cuda::GemmBf16Params g;
    g.x = x; g.w = w; g.bias = b; g.y = y; g.M = M; g.N = N; g.K = K; g.y_f32 = true; g.accumulate = acc;
    cuda::gemm_bf16(gemm_, g, s);
  };

  cuda::launch_embed_bf16(embed_, m.tok, xa_, M, H, s);
  mark("embed", 0);
  for (int l = 0; l < c.num_layers; ++l) {
    const DevLayer& L = layers_[l];
    const int window = c.layer_is_sliding[l] ? c.sliding_window : 0;
    cuda::launch_rmsnorm_bf16(xa_, nullptr, L.attn_norm, xn_, M, H, c.rms_norm_eps, s);
    mark("attn_norm", 0);
    gemm(xn_, L.qkv_w, L.qkv_b, qkv_, QKV, H, false);
    mark("qkv_gemm", 0);
    const bool sw = sliding(l);
    cuda::launch_rope_kv(
        {qkv_, m.pos, sw ? m.slot_sw : m.slot, inv_freq_, concentration_, L.k_cache, L.v_cache, qbf_, M, Hq, Hkv, D}, s);
    mark("rope_kv", 0);
    for (const auto& [row, n, bt_off, bt_off_sw] : seqs) {
      if (n == 1 || !opt_.flash_prefill_attention) continue;
      cuda::AttnPrefillParams a;
      a.q = qbf_ + size_t(row) * Hq * D; a.q_stride = Hq * D;
      a.k_cache = L.k_cache; a.v_cache = L.v_cache;
      a.block_table = m.bt + (sw ? bt_off_sw : bt_off);
      a.sinks = L.sinks; a.out = attn_ + size_t(row) * Hq * D;
      a.T = n; a.start = hmeta_.pos[row]; a.Hq = Hq; a.Hkv = Hkv; a.block_size = opt_.block_size;
      a.window = window; a.scale = 1.0f / 8.0f;
      cuda::attention_prefill_bf16(a, s);
    }
    if (n_decode > 0) {
      cuda::AttnDecodeParams a;
      a.q = qkv_; a.q_stride = QKV; a.rows = m.decode_rows;
      a.k_cache = L.k_cache; a.v_cache = L.v_cache; a.pos = m.pos; a.bt_off = sw ? m.bt_off_sw : m.bt_off;
      a.block_tables = m.bt;
      a.sinks = L.sinks; a.out = attn_; a.partials = attn_part_; a.tickets = tickets_;
      a.M = n_decode; a.Hq = Hq; a.Hkv = Hkv; a.D = D; a.block_size = opt_.block_size; a.window = window;
      a.heads_per_cta = cuda::attention_decode_heads_per_cta(window);
      cuda::attention_decode(a, s);
    }
    mark("attention", 0);
    gemm(attn_, L.o_w, L.o_b, xa_, H, Hq * D, true);
    mark("o_gemm_residual", 0);
    cuda::launch_rmsnorm_bf16(xa_, nullptr, L.mlp_norm, xn_, M, H, c.rms_norm_eps, s);
    mark("mlp_norm", 0);
    gemm(xn_, L.router_w, L.router_b, router_, E, H, false);
    cuda::launch_topk_softmax(router_, eidx_, ew_, M, E, k, s);
    mark("router_topk", 0);

    cuda::MoeRouteParams r;
    r.topk_idx = eidx_; r.topk_w = ew_; r.T = M; r.k = k; r.E = E;
    r.counts = moe_counts_; r.offsets = moe_offsets_; r.sorted_tok = moe_sorted_tok_; r.sorted_slot = moe_sorted_slot_;
    r.sorted_w = moe_sorted_w_; r.tile_expert = moe_tile_expert_; r.tile_row0 = moe_tile_row0_;
    r.num_tiles = moe_num_tiles_; r.max_tiles = moe_max_tiles_;
    cuda::moe_route_prefill(r, s);
    cuda::MoeGemmPrefillParams g;
    g.sorted_tok = moe_sorted_tok_; g.sorted_slot = moe_sorted_slot_; g.sorted_w = moe_sorted_w_;
    g.offsets = moe_offsets_; g.tile_expert = moe_tile_expert_; g.tile_row0 = moe_tile_row0_;
    g.num_tiles = moe_num_tiles_; g.max_tiles = moe_max_tiles_;
    g.alpha = c.swiglu_alpha; g.limit = c.swiglu_limit;
    g.blocks = L.up_blocks; g.scales = L.up_scales; g.bias = L.up_bias; g.x = xn_; g.act = act_bf_;
    g.N = 2 * I; g.K = H;
    cuda::moe_fc1_prefill(g, s);
    mark("moe_fc1_prefill", 0);
    g.blocks = L.down_blocks; g.scales = L.down_scales; g.bias = L.down_bias; g.x = act_bf_; g.y_slot = ysl_;
    g.N = H; g.K = I;
    cuda::moe_fc2_prefill(g, s);
    mark("moe_fc2_prefill", 0);
    cuda::moe_combine_prefill(ysl_, xa_, M, k, H, s);
    mark("moe_combine", 0);
  }
  if (S > 0) final_logits(xa_, nullptr, m.srow, 0, S);
}

}  // namespace mx
