// The decode forward: M <= 8 tokens (any mix of sequences), six kernels per layer (five for one token
// on the FP8 expert path: the router inside the o-proj), or from decode_step_min_tokens on one
// persistent kernel (forward_decode_step).
// The residual stream ping-pongs between xa_ and xb_: each norm prologue reads x + the previous MoE's
// per-slot outputs, and its first CTA writes the sum to the other buffer, so no kernel adds the
// experts up.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/attention_decode/attention_decode.h"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/decode_gemv.h"
#include "kernels/decode/decode_kernels.h"
#include "kernels/engine/runner_impl.h"

namespace mx {

void CudaRunner::forward_decode(int t0, int M, int s0, int S, bool one_token_per_seq) {
  const ModelConfig& c = cfg_;
  const int H = c.hidden_size, E = c.num_experts, I = c.intermediate_size;
  const int D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads;
  const StepMeta& m = dmeta_;
  cudaStream_t s = stream_;
  if (!profiling_ && !skip_) {
    if (M >= opt_.decode_step_min_tokens) return forward_decode_step(t0, M, s0, S, one_token_per_seq);
  }
  const LayerSizes ls(c);
  // Bytes each kernel reads, for the profile (experts: distinct experts expected for M tokens).
  const double touched = expected_distinct_experts(c, M);
  const double fc1_bytes = touched * double(ls.up_blocks + ls.up_scales + ls.up_bias) / E;
  const double fc2_bytes = touched * double(ls.down_blocks + ls.down_scales + ls.down_bias) / E;

  if (step_trace_) {  // per-op CTA records (cta_trace.h): reset the cursor
    MX_CUDA(cudaMemsetAsync(step_trace_ + step_trace_words_, 0, 8, s));
    step_trace_kind_ = 2;
  }
  // One token on the FP8 expert path: the router runs inside the o-proj (bf16_o_proj_router_m1), whose
  // integer sums start from zero.
  const bool fused_router = cuda::mxfp4_moe_one_token_fp8(M);
  if (fused_router) MX_CUDA(cudaMemsetAsync(route_acc_, 0, size_t(c.num_layers) * E * sizeof(long long), s));
  cuda::launch_embed_bf16(embed_, m.tok + t0, xa_, M, H, s, dtok_ + t0);
  mark("embed", double(M) * H * 2);
  float *xin = xa_, *xout = xb_;
  const float* y = nullptr;
  for (int l = 0; l < c.num_layers; ++l) {
    const DevLayer& L = layers_[l];
    cuda::QkvRopeKvParams q;
    q.res = {xin, y, xout};
    q.norm_w = L.attn_norm; q.eps = c.rms_norm_eps; q.w = L.qkv_w; q.bias = L.qkv_b;
    q.pos = m.pos + t0; q.slot = (sliding(l) ? m.slot_sw : m.slot) + t0;
    q.inv_freq = inv_freq_; q.concentration = concentration_;
    q.q_out = qkv_; q.k_cache = L.k_cache; q.v_cache = L.v_cache;
    q.M = M; q.H = H; q.Hq = Hq; q.Hkv = Hkv; q.D = D;
    q.trace = op_trace(l);
    if (M == 1 && one_token_per_seq && !sliding(l)) {  // the older keys are final: see QkvRopeKvParams
      q.kv_prefetch = true;
      q.block_tables = m.bt; q.bt_off = m.bt_off + t0; q.block_size = opt_.block_size;
    }
    if (!(skip_ & kDecodeQkv)) cuda::bf16_qkv_rope_kv(q, s);
    mark("qkv_rope_kv", double(ls.qkv_w));

    cuda::AttnDecodeParams a;
    a.q = qkv_; a.q_stride = Hq * D; a.k_cache = L.k_cache; a.v_cache = L.v_cache;
    a.pos = m.pos + t0; a.bt_off = (sliding(l) ? m.bt_off_sw : m.bt_off) + t0; a.block_tables = m.bt;
    a.sinks = L.sinks; a.out = attn_;
    a.partials = attn_part_; a.tickets = tickets_; a.mma_partials = attn_mma_part_;
    a.M = M; a.Hq = Hq; a.Hkv = Hkv; a.D = D; a.block_size = opt_.block_size;
    a.window = c.layer_is_sliding[l] ? c.sliding_window : 0;
    a.kv_stable = one_token_per_seq;
    a.heads_per_cta = cuda::attention_decode_heads_per_cta(a.window);
    a.trace = op_trace(l);
    if (!(skip_ & kDecodeAttention)) {
      if (mma_attention_ && !a.window && !attn_long_) cuda::attention_decode_mma(a, s);
      else cuda::attention_decode(a, s);
    }
    if (profiling_) {
      double kv = 0;
      for (int i = 0; i < M; ++i) {
        const int pos = hmeta_.pos[t0 + i];
        kv += double(a.window ? std::min(pos + 1, a.window) : pos + 1) * Hkv * D * 2 * 2;
      }
      mark(a.window ? "attention_sliding" : "attention_full", kv);
    }

    const cuda::OProjParams op{attn_, L.o_w, L.o_b, xout, M, H, Hq * D, op_trace(l)};
    if (fused_router) {
      if (!(skip_ & kDecodeOProj))
        cuda::bf16_o_proj_router_m1({op, L.mlp_norm, L.router_w, route_acc_ + size_t(l) * E, ss_part_, E}, s);
      mark("o_proj_residual_router", double(ls.o_w + ls.router_w));
    } else {
      if (!(skip_ & kDecodeOProj)) cuda::bf16_o_proj_residual(op, s);
      mark("o_proj_residual", double(ls.o_w));
      cuda::RouterParams r;
      r.res = {xout, nullptr, nullptr};
      r.norm_w = L.mlp_norm; r.eps = c.rms_norm_eps; r.w = L.router_w; r.bias = L.router_b;
      r.logits = router_; r.xn = xn_; r.M = M; r.E = E; r.H = H;
      r.trace = op_trace(l);
      if (!(skip_ & kDecodeRouter)) cuda::bf16_router(r, s);
      mark("router", double(ls.router_w));
    }

    cuda::MoeDecodeParams e;
    e.router_logits = router_;
    e.router_splits = cuda::kRouterSplits;
    e.fc1_blocks = L.up_blocks; e.fc1_scales = L.up_scales; e.fc1_bias = L.up_bias;
    e.fc2_blocks = L.down_blocks; e.fc2_scales = L.down_scales; e.fc2_bias = L.down_bias;
    e.xn = xn_; e.act = act_bf_; e.y_slot = ysl_;
    e.M = M; e.E = E; e.H = H; e.I = I; e.alpha = c.swiglu_alpha; e.limit = c.swiglu_limit;
    if (fused_router) {
      e.route_acc = route_acc_ + size_t(l) * E;
      e.ss_part = ss_part_; e.ss_parts = cuda::oproj_router_tiles(H);
      e.router_bias = L.router_b; e.norm_w = L.mlp_norm; e.h = xout; e.eps = c.rms_norm_eps;
    }
    e.trace = op_trace(l);
    if (!(skip_ & kDecodeFc1)) cuda::mxfp4_moe_fc1_swiglu(e, s);
    mark("moe_fc1_swiglu", fc1_bytes);
    if (!(skip_ & kDecodeFc2)) cuda::mxfp4_moe_fc2(e, s);
    mark("moe_fc2", fc2_bytes);

    std::swap(xin, xout);
    y = ysl_;
  }
  if (S > 0 && !(skip_ & kDecodeHead)) final_logits(xin, y, m.srow_local + s0, s0, S);
}

void CudaRunner::forward_decode_step(int t0, int M, int s0, int S, bool one_token_per_seq) {
  const ModelConfig& c = cfg_;
  const StepMeta& m = dmeta_;
  cuda::launch_embed_bf16(embed_, m.tok + t0, xa_, M, c.hidden_size, stream_, dtok_ + t0);
  cuda::DecodeStepParams p;
  p.layers = step_layers_; p.num_layers = c.num_layers;
  p.xa = xa_; p.xb = xb_; p.y_slot = ysl_; p.q = qkv_; p.attn = attn_;
  p.attn_partials = attn_part_; p.attn_tickets = tickets_;
  p.router_logits = router_; p.xn = xn_; p.act = act_bf_; p.counters = step_counters_;
  p.pos = m.pos + t0; p.slot = m.slot + t0; p.bt_off = m.bt_off + t0; p.block_tables = m.bt;
  p.slot_sw = m.slot_sw + t0; p.bt_off_sw = m.bt_off_sw + t0;
  p.inv_freq = inv_freq_; p.concentration = concentration_; p.eps = c.rms_norm_eps;
  p.alpha = c.swiglu_alpha; p.limit = c.swiglu_limit;
  p.M = M; p.H = c.hidden_size; p.I = c.intermediate_size; p.E = c.num_experts;
  p.Hq = c.num_heads; p.Hkv = c.num_kv_heads; p.D = c.head_dim; p.block_size = opt_.block_size;
  p.kv_stable = one_token_per_seq;
  p.trace = step_trace_;
  if (step_trace_) {
    step_trace_items_ = cuda::decode_step_items(M, c.num_layers, p.H, p.I, p.E, p.Hq, p.Hkv, p.D);
    step_trace_kind_ = 0;
  }
  cuda::decode_step(p, stream_);
  if (S > 0) final_logits(cuda::decode_step_output(xa_, xb_, c.num_layers), ysl_, m.srow_local + s0, s0, S);
}

// Final norm + lm_head + greedy pick for S rows of the current token block (x [*, H], y_slot).
void CudaRunner::final_logits(const float* x, const float* y_slot, const int32_t* rows, int s0, int S) {
  const ModelConfig& c = cfg_;
  const int H = c.hidden_size, V = c.vocab_size;
  cuda::final_rmsnorm_bf16({x, y_slot, nullptr}, rows, final_norm_, c.rms_norm_eps, xs_ + size_t(s0) * H, S, H,
                           stream_);
  mark("final_norm", 0);
  float* logits = logits_ + size_t(s0) * V;
  if (S <= cuda::kDecodeMaxTokens) {
    cuda::bf16_lm_head(xs_ + size_t(s0) * H, lm_head_, logits, S, V, H, stream_);
  } else {  // many rows: one tensor-core GEMM reads the 1.16 GB head once
    cuda::GemmBf16Params g;
    g.x = xs_ + size_t(s0) * H; g.w = lm_head_; g.y = logits; g.M = S; g.N = V; g.K = H; g.y_f32 = true;
    cuda::gemm_bf16(gemm_, g, stream_);
  }
  mark("lm_head", double(V) * H * 2);
  cuda::launch_argmax_logprob(logits, S, V, vocab_limit_, reinterpret_cast<int32_t*>(res_cur_) + s0,
                              res_cur_ + last_sampled_ + s0, argmax_part_, stream_, dmeta_.inv_temp + s0,
                              dmeta_.sample_key + s0, dtok_ + s0);
  mark("argmax", double(S) * V * 4);
}

}  // namespace mx
