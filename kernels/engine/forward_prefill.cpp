// The prefill forward (forward.h): a step with more than 8 tokens (prompt chunks mixed with decodes).
// Tensor-core GEMMs (cuBLASLt) for the dense projections, the grouped MXFP4 MoE, flash attention per
// prompt chunk, and the decode attention kernel for all single-token sequences in one launch.
#include "kernels/attention_decode/attention_decode.h"
#include "kernels/attention_prefill/attention_prefill.h"
#include "kernels/decode/decode_kernels.h"
#include "kernels/dense_quant/dense_quant.h"
#include "kernels/engine/forward.h"
#include "kernels/moe_prefill/moe_prefill.h"

namespace mx {

void Forward::prefill(const StepView& st, int M, int S, const std::vector<SeqRows>& seqs, int n_decode) {
  const ModelConfig& c = model_.cfg;
  const DeviceShape& d = shape_;
  const Activations& a = act_;
  const StepMeta& m = *st.dev;
  const int H = d.H, E = d.E, I = d.I, k = d.top_k, QKV = d.qkv_dim();
  cudaStream_t s = stream_;
  const LayerSizes& ls = sizes_;
  // Profile marks count weight and KV bytes (wide decode steps are bandwidth-bound); the experts'
  // bytes are those of the experts each layer routed to (Probe::record_routing).
  // A quantized matrix is widened to bf16 in the scratch first (exact; a few microseconds a layer).
  auto gemm = [&](const uint16_t* x, const cuda::DenseWeight& w, const uint16_t* b, void* y, int N, int K, bool acc) {
    cuda::GemmBf16Params g;
    g.x = x; g.w = w.bf16(); g.bias = b; g.y = y; g.M = M; g.N = N; g.K = K; g.y_f32 = true; g.accumulate = acc;
    if (w.fmt != DenseFormat::kBf16) {
      cuda::dequantize_dense_rows(w, 0, N, K, a.wdq, s);
      g.w = a.wdq;
    }
    cuda::gemm_bf16(gemm_, g, s);
  };

  // The MoE's tiles for this step's M (the grids stay as small as the step allows).
  // The experts run on FP8 tensor cores where the GPU has wgmma (both tile heights).
  const bool fp8_moe = cuda::moe_fp8_available();
  const int tile_rows = cuda::moe_prefill_tile_rows(M, k, E, fp8_moe);
  const int tiles = cuda::moe_prefill_max_tiles(M, k, E, fp8_moe);
  const DecodeRowSplits mma_splits = decode_row_splits(st, seqs, n_decode);
  // A wide decode step enqueued ahead (step.cpp) has token -(j + 1): the step before's pick of its sampled row j.
  cuda::launch_embed_bf16(model_.embed, m.tok, a.xa, M, H, s, a.picked);
  mark("embed", 0);
  for (int l = 0; l < d.layers; ++l) {
    const DeviceLayer& L = model_.layers[size_t(l)];
    const cuda::KvLayer& kv = kv_.layers[size_t(l)];
    const bool sw = model_.sliding(l);
    if (!probe_.skips(kWideNorms)) cuda::launch_rmsnorm_bf16(a.xa, nullptr, L.attn_norm, a.xn, M, H, c.rms_norm_eps, s);
    mark("attn_norm", 0);
    if (!probe_.skips(kWideQkv)) gemm(a.xn, L.qkv, L.qkv_b, a.qkv, QKV, H, false);
    mark("qkv_gemm", double(ls.qkv_w + ls.qkv_sc));
    if (!probe_.skips(kWideRopeKv))
      cuda::launch_rope_kv({a.qkv, m.pos, sw ? m.slot_sw : m.slot, a.inv_freq, concentration_, kv, a.qbf, M, d.Hq,
                            d.Hkv, d.D}, s);
    mark("rope_kv", 0);
    for (const SeqRows& q : seqs) {
      if (q.n == 1 || !opt_.flash_prefill_attention || probe_.skips(kWideAttention)) continue;
      cuda::AttnPrefillParams p;
      p.q = a.qbf + size_t(q.row) * d.q_dim(); p.q_stride = d.q_dim();
      p.kv = kv;
      p.block_table = m.bt + (sw ? q.bt_off_sw : q.bt_off);
      p.sinks = L.sinks; p.out = a.attn + size_t(q.row) * d.q_dim();
      p.T = q.n; p.start = st.host->pos[q.row]; p.Hq = d.Hq; p.Hkv = d.Hkv;
      p.window = model_.window(l); p.scale = 1.0f / 8.0f;
      cuda::attention_prefill_bf16(p, s);
    }
    if (n_decode > 0 && !probe_.skips(kWideAttention)) {
      cuda::AttnDecodeParams p;
      p.q = a.qkv; p.q_stride = QKV; p.rows = m.decode_rows;
      p.kv = kv; p.pos = m.pos; p.bt_off = sw ? m.bt_off_sw : m.bt_off; p.block_tables = m.bt;
      p.sinks = L.sinks; p.out = a.attn; p.partials = a.attn_part; p.tickets = a.tickets;
      p.mma_partials = a.attn_mma_part;
      p.M = n_decode; p.Hq = d.Hq; p.Hkv = d.Hkv; p.D = d.D; p.window = model_.window(l);
      // Many single-token rows: the tensor-core kernel, all 8 heads of a KV head per CTA, with only
      // the splits the longest context needs (sliding layers: 1 or 2).
      const int splits = sw ? mma_splits.sliding : mma_splits.full;
      if (splits > 0) {
        p.splits = splits;
        p.pass_keys = sw ? mma_splits.sliding_keys : mma_splits.full_keys;
        cuda::attention_decode_mma(p, s);
      } else {
        p.heads_per_cta = cuda::attention_decode_heads_per_cta(p.window);
        cuda::attention_decode(p, s);
      }
    }
    if (probe_.profiling) mark(sw ? "attention_sliding" : "attention_full", kv_bytes_read(st, seqs, l));
    zero_unless_rank0(a.xa, size_t(M) * H);
    if (!probe_.skips(kWideOProj)) gemm(a.attn, L.o, L.o_b, a.xa, H, d.q_dim(), true);
    mark("o_gemm_residual", double(ls.o_w + ls.o_sc));
    reduce_after_attention(a.xa, a.xa, size_t(M) * H);
    if (!probe_.skips(kWideNorms)) cuda::launch_rmsnorm_bf16(a.xa, nullptr, L.mlp_norm, a.xn, M, H, c.rms_norm_eps, s);
    mark("mlp_norm", 0);
    if (!probe_.skips(kWideRouter)) {
      gemm(a.xn, cuda::bf16_weight(L.router_w), L.router_b, a.router, E, H, false);
      cuda::launch_topk_softmax(a.router, a.eidx, a.ew, M, E, k, s);
    }
    mark("router_topk", double(ls.router_w));

    cuda::MoeRouteParams r;
    r.topk_idx = a.eidx; r.topk_w = a.ew; r.T = M; r.k = k; r.E = E;
    r.counts = a.moe_counts; r.offsets = a.moe_offsets; r.sorted_tok = a.moe_sorted_tok;
    r.sorted_slot = a.moe_sorted_slot; r.sorted_w = a.moe_sorted_w; r.tile_expert = a.moe_tile_expert;
    r.tile_row0 = a.moe_tile_row0; r.num_tiles = a.moe_num_tiles; r.max_tiles = tiles; r.tile_rows = tile_rows;
    r.expert_lo = d.expert0; r.expert_hi = d.expert0 + d.experts_held;
    if (!probe_.skips(kWideRoute)) cuda::moe_route_prefill(r, s);
    probe_.record_routing(a.moe_counts, E, l, s);
    mark("moe_route", 0);
    cuda::MoeGemmPrefillParams g;
    g.sorted_tok = a.moe_sorted_tok; g.sorted_slot = a.moe_sorted_slot; g.sorted_w = a.moe_sorted_w;
    g.offsets = a.moe_offsets; g.tile_expert = a.moe_tile_expert; g.tile_row0 = a.moe_tile_row0;
    g.num_tiles = a.moe_num_tiles; g.max_tiles = tiles; g.tile_rows = tile_rows;
    g.alpha = c.swiglu_alpha; g.limit = c.swiglu_limit;
    const ExpertWeights w = expert_weights(l);
    g.blocks = w.up_blocks; g.scales = w.up_scales; g.bias = w.up_bias; g.x = a.xn; g.act = a.act_bf;
    g.row_smax = w.up_smax;
    g.N = 2 * I; g.K = H;
    if (fp8_moe) {  // FC1's hi/lo operand in y_slot's scratch (free until FC2), the activation in act_bf's
      uint8_t* xq = reinterpret_cast<uint8_t*>(a.ysl);
      float* xinv = reinterpret_cast<float*>(xq + align256(size_t(M) * cuda::moe_fp8_row_bytes(H)));
      g.xq = xq; g.xinv = xinv; g.act_q = reinterpret_cast<uint8_t*>(a.act_bf);
      if (!probe_.skips(kWideFc1)) {
        cuda::moe_quant_fp8(a.xn, M, H, xq, xinv, s);
        cuda::moe_fc1_fp8(g, s);
      }
    } else if (!probe_.skips(kWideFc1)) {
      cuda::moe_fc1_prefill(g, s);
    }
    probe_.mark_experts("moe_fc1_prefill", double(ls.up_blocks + ls.up_scales + ls.up_bias) / E, l, s);
    g.blocks = w.down_blocks; g.scales = w.down_scales; g.bias = w.down_bias; g.x = a.act_bf; g.y_slot = a.ysl;
    g.row_smax = w.down_smax;
    g.N = H; g.K = I; g.xq = g.act_q;
    if (!probe_.skips(kWideFc2)) {
      if (fp8_moe) cuda::moe_fc2_fp8(g, s);
      else cuda::moe_fc2_prefill(g, s);
    }
    probe_.mark_experts("moe_fc2_prefill", double(ls.down_blocks + ls.down_scales + ls.down_bias) / E, l, s);
    zero_unless_rank0(a.xa, size_t(M) * H);
    if (!probe_.skips(kWideCombine)) {
      if (d.holds_all_experts()) cuda::moe_combine_prefill(a.ysl, a.xa, M, k, H, s);
      else cuda::moe_combine_prefill(a.ysl, a.xa, M, k, H, s, a.eidx, d.expert0, d.expert0 + d.experts_held);
    }
    mark("moe_combine", 0);
    reduce_after_experts(a.xa, size_t(M) * H);
  }
  if (S > 0 && !probe_.skips(kWideHead)) final_logits(st, a.xa, nullptr, m.srow, 0, S);
}

// The tensor-core decode attention serves a prefill step's single-token rows (flash prefill on: the
// rows are one a sequence, as many as the scratch holds) unless a full-layer context is past
// attention_decode_mma_max_keys() (0: the register kernel); the splits are the most any of those rows
// uses at the wide step's cap (a capped split may take several passes; timed to depth ~2k only, see
// docs/perf.md session 32).
Forward::DecodeRowSplits Forward::decode_row_splits(const StepView& st, const std::vector<SeqRows>& seqs,
                                                    int n_decode) const {
  DecodeRowSplits r;
  if (!mma_attention_ || !opt_.flash_prefill_attention || n_decode == 0) return r;
  const int window = model_.cfg.sliding_window;
  // Many rows fill the GPU without splitting each: fewer, longer splits (attention_decode_mma_wide_splits).
  const int most = cuda::attention_decode_mma_wide_splits(n_decode, shape_.Hkv);
  for (const SeqRows& q : seqs) {
    if (q.n != 1) continue;
    const int keys = st.host->pos[q.row] + 1, sw_keys = std::min(keys, window);
    r.full = std::max(r.full, cuda::attention_decode_mma_splits(keys, most));
    r.full_keys = std::max(r.full_keys, cuda::attention_decode_mma_keys_per_split(keys, most));
    if (window > 0) {
      r.sliding = std::max(r.sliding, cuda::attention_decode_mma_splits(sw_keys, most));
      r.sliding_keys = std::max(r.sliding_keys, cuda::attention_decode_mma_keys_per_split(sw_keys, most));
    }
  }
  if (st.attn_long) r.full = 0;  // a context past one pass: the register kernel's 32 splits
  // A pass holds the longest split (whole chunks, at most kAttnMmaKeys: longer ones take more passes).
  r.full_keys = std::min(r.full_keys, cuda::kAttnMmaKeys);
  r.sliding_keys = std::min(r.sliding_keys, cuda::kAttnMmaKeys);
  return r;
}

// K and V bytes layer l's attention reads in this step: each sequence its context (its window on a
// sliding layer) up to its last token.
double Forward::kv_bytes_read(const StepView& st, const std::vector<SeqRows>& seqs, int l) const {
  const int window = model_.window(l);
  const double row = double(kv_.spec.row_bytes()) * 2;
  double b = 0;
  for (const SeqRows& q : seqs) {
    const int end = st.host->pos[q.row + q.n - 1] + 1;
    b += double(window ? std::min(end, window + q.n - 1) : end) * row;
  }
  return b;
}

}  // namespace mx
