// The decode forward (forward.h): M <= 8 tokens, any mix of sequences. The residual stream ping-pongs
// between xa and xb: each norm prologue reads x + the previous layer's per-slot expert outputs and
// its first CTA writes the sum to the other buffer, so no kernel adds the experts up.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/attention_decode/attention_decode.h"
#include "kernels/comm/peer_allreduce.h"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/decode_gemv.h"
#include "kernels/decode/decode_kernels.h"
#include "kernels/dense_quant/dense_quant.h"
#include "kernels/engine/forward.h"
#include "model/rope.h"

namespace mx {

Forward::Forward(const DeviceModel& model, const KvCache& kv, const Activations& act, const ForwardOptions& opt,
                 cudaStream_t stream, Probe& probe)
    : model_(model), shape_(model.shape), sizes_(model.shape), kv_(kv), act_(act), opt_(opt), stream_(stream),
      probe_(probe) {
  std::vector<float> inv(size_t(shape_.D / 2));
  concentration_ = yarn_inv_freq(model.cfg, inv.data()).concentration;
  MX_CUDA(cudaMemcpy(act_.inv_freq, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  gemm_ = cuda::gemm_context_create();
  mma_attention_ = shape_.D == 64 && shape_.Hq == 8 * shape_.Hkv;
  // The persistent step's per-layer pointers, read by its work items on the device.
  std::vector<cuda::DecodeStepLayer> sl(size_t(shape_.layers));
  for (int l = 0; l < shape_.layers; ++l) {
    const DeviceLayer& d = model.layers[size_t(l)];
    sl[size_t(l)] = {d.qkv.data, d.qkv.scales, d.o.data, d.o.scales, d.attn_norm, d.qkv_b, d.o_b, d.sinks, d.mlp_norm,
                     d.router_w, d.router_b,
                     d.up_blocks, d.up_scales, d.down_blocks, d.down_scales, d.up_bias, d.down_bias,
                     kv.layers[size_t(l)], model.window(l)};
    cuda::require_kv(kv.layers[size_t(l)], "decode_step");
  }
  MX_CUDA(cudaMemcpy(act_.step_layers, sl.data(), sl.size() * sizeof(sl[0]), cudaMemcpyHostToDevice));
}

Forward::~Forward() {
  if (gemm_) cuda::gemm_context_destroy(gemm_);
}

void Forward::decode(const StepView& st, int t0, int M, int s0, int S, bool one_token_per_seq) {
  // The profile and the skipped kinds need the per-op launches; the persistent step takes one format for
  // qkv and o-proj, and has no reduce points.
  if (M >= opt_.decode_step_min_tokens && !probe_.profiling && !probe_.skip && shape_.dense.qkv == shape_.dense.o &&
      !tp()) {
    decode_persistent(st, t0, M, one_token_per_seq);
    if (S > 0) final_logits(st, cuda::decode_step_output(act_.xa, act_.xb, shape_.layers), act_.ysl,
                            st.dev->srow_local + s0, s0, S);
    return;
  }
  probe_.reset_op_cursor(stream_);
  if (probe_.trace) probe_.trace_kind = 2;
  // One token on the FP8 expert path: the router runs inside the o-proj (dense_o_proj_router_m1), or under
  // tensor parallelism inside the peer sum after it, which holds the summed row; its integer sums start
  // from zero.
  const DecodeRows r{&st, t0, M, one_token_per_seq,
                     cuda::mxfp4_moe_one_token_fp8(M) && (!tp() || opt_.tp->folds_router(shape_.H, shape_.E))};
  if (r.fused_router)
    MX_CUDA(cudaMemsetAsync(act_.route_acc, 0, size_t(shape_.layers) * shape_.E * sizeof(long long), stream_));
  cuda::launch_embed_bf16(model_.embed, st.dev->tok + t0, act_.xa, M, shape_.H, stream_, act_.picked);
  mark("embed", double(M) * shape_.H * 2);
  decode_layers(r);
  const float* x = cuda::decode_step_output(act_.xa, act_.xb, shape_.layers);  // the last layer's output
  if (S > 0 && !probe_.skips(kDecodeHead)) final_logits(st, x, act_.ysl, st.dev->srow_local + s0, s0, S);
}

// The layer loop of the per-op path.
void Forward::decode_layers(const DecodeRows& r) {
  float *x = act_.xa, *x_next = act_.xb;
  const float* y = nullptr;  // the previous layer's expert outputs, added by this layer's norm
  for (int l = 0; l < shape_.layers; ++l) {
    qkv_rope_kv(r, l, x, y, x_next);
    attention(r, l);
    o_proj(r, l, x_next);
    if (r.fused_router && tp()) reduce_with_router(l, o_proj_rows(x_next), x_next);
    else reduce_after_attention(o_proj_rows(x_next), x_next, size_t(r.M) * shape_.H);
    if (!r.fused_router) router(r, l, x_next);
    experts(r, l, x_next);
    reduce_after_experts(act_.ysl, size_t(r.M) * shape_.top_k * shape_.H);
    std::swap(x, x_next);
    y = act_.ysl;
  }
}

void Forward::qkv_rope_kv(const DecodeRows& r, int l, const float* x, const float* y, float* x_next) {
  const DeviceLayer& L = model_.layers[size_t(l)];
  const StepMeta& m = *r.st->dev;
  cuda::QkvRopeKvParams q;
  q.res = {x, y, x_next};
  q.norm_w = L.attn_norm; q.eps = model_.cfg.rms_norm_eps; q.w = L.qkv; q.bias = L.qkv_b;
  q.pos = m.pos + r.t0; q.slot = (model_.sliding(l) ? m.slot_sw : m.slot) + r.t0;
  q.inv_freq = act_.inv_freq; q.concentration = concentration_;
  q.q_out = act_.qkv; q.kv = kv_.layers[size_t(l)];
  q.M = r.M; q.H = shape_.H; q.Hq = shape_.Hq; q.Hkv = shape_.Hkv; q.D = shape_.D;
  q.trace = probe_.op_trace(l);
  if (r.M == 1 && r.one_token_per_seq && !model_.sliding(l)) {  // the older keys are final: see QkvRopeKvParams
    q.kv_prefetch = true;
    q.block_tables = m.bt; q.bt_off = m.bt_off + r.t0;
  }
  if (!probe_.skips(kDecodeQkv)) cuda::dense_qkv_rope_kv(q, stream_);
  mark("qkv_rope_kv", double(sizes_.qkv_w + sizes_.qkv_sc));
}

void Forward::attention(const DecodeRows& r, int l) {
  const DeviceLayer& L = model_.layers[size_t(l)];
  const StepMeta& m = *r.st->dev;
  cuda::AttnDecodeParams a;
  a.q = act_.qkv; a.q_stride = shape_.q_dim(); a.kv = kv_.layers[size_t(l)];
  a.pos = m.pos + r.t0; a.bt_off = (model_.sliding(l) ? m.bt_off_sw : m.bt_off) + r.t0; a.block_tables = m.bt;
  a.sinks = L.sinks; a.out = act_.attn;
  a.partials = act_.attn_part; a.tickets = act_.tickets; a.mma_partials = act_.attn_mma_part;
  a.M = r.M; a.Hq = shape_.Hq; a.Hkv = shape_.Hkv; a.D = shape_.D;
  a.window = model_.window(l);
  a.kv_stable = r.one_token_per_seq;
  a.heads_per_cta = cuda::attention_decode_heads_per_cta(a.window);
  a.trace = probe_.op_trace(l);
  if (!probe_.skips(kDecodeAttention)) {
    if (mma_attention_ && !a.window && !r.st->attn_long) cuda::attention_decode_mma(a, stream_);
    else cuda::attention_decode(a, stream_);
  }
  if (probe_.profiling) {
    double kv = 0;
    for (int i = 0; i < r.M; ++i) {
      const int pos = r.st->host->pos[r.t0 + i];
      kv += double(a.window ? std::min(pos + 1, a.window) : pos + 1) * kv_.spec.row_bytes() * 2;
    }
    mark(a.window ? "attention_sliding" : "attention_full", kv);
  }
}

void Forward::o_proj(const DecodeRows& r, int l, float* x_next) {
  const DeviceLayer& L = model_.layers[size_t(l)];
  const LayerSizes& ls = sizes_;
  const cuda::OProjParams op{act_.attn, L.o, L.o_b, o_proj_rows(x_next), r.M, shape_.H, shape_.q_dim(),
                             probe_.op_trace(l)};
  if (r.fused_router && !tp()) {
    if (!probe_.skips(kDecodeOProj))
      cuda::dense_o_proj_router_m1(
          {op, L.mlp_norm, L.router_w, act_.route_acc + size_t(l) * shape_.E, act_.ss_part, shape_.E}, stream_);
    mark("o_proj_residual_router", double(ls.o_w + ls.o_sc + ls.router_w));
  } else {
    if (!probe_.skips(kDecodeOProj)) cuda::dense_o_proj_residual(op, stream_);
    mark("o_proj_residual", double(ls.o_w + ls.o_sc));
  }
}

void Forward::router(const DecodeRows& r, int l, float* x_next) {
  const DeviceLayer& L = model_.layers[size_t(l)];
  cuda::RouterParams p;
  p.res = {x_next, nullptr, nullptr};
  p.norm_w = L.mlp_norm; p.eps = model_.cfg.rms_norm_eps; p.w = L.router_w; p.bias = L.router_b;
  p.logits = act_.router; p.xn = act_.xn; p.M = r.M; p.E = shape_.E; p.H = shape_.H;
  p.trace = probe_.op_trace(l);
  if (!probe_.skips(kDecodeRouter)) cuda::bf16_router(p, stream_);
  mark("router", double(sizes_.router_w));
}

void Forward::experts(const DecodeRows& r, int l, float* x_next) {
  const DeviceLayer& L = model_.layers[size_t(l)];
  const ModelConfig& c = model_.cfg;
  const ExpertWeights w = expert_weights(l);
  cuda::MoeDecodeParams e;
  e.router_logits = act_.router;
  e.router_splits = cuda::kRouterSplits;
  e.fc1_blocks = w.up_blocks; e.fc1_scales = w.up_scales; e.fc1_bias = w.up_bias;
  e.fc2_blocks = w.down_blocks; e.fc2_scales = w.down_scales; e.fc2_bias = w.down_bias;
  e.expert_lo = shape_.expert0; e.expert_hi = shape_.expert0 + shape_.experts_held;
  e.xn = act_.xn; e.act = act_.act_bf; e.y_slot = act_.ysl;
  e.M = r.M; e.E = shape_.E; e.H = shape_.H; e.I = shape_.I; e.alpha = c.swiglu_alpha; e.limit = c.swiglu_limit;
  if (r.fused_router) {
    e.route_acc = act_.route_acc + size_t(l) * shape_.E;
    e.ss_part = act_.ss_part; e.ss_parts = tp() ? cuda::kPeerMaxCtas : cuda::oproj_router_tiles(shape_.H);
    e.router_bias = L.router_b; e.norm_w = L.mlp_norm; e.h = x_next; e.eps = c.rms_norm_eps;
  }
  e.trace = probe_.op_trace(l);
  // Bytes each reads, for the profile: the distinct experts expected for M tokens.
  const LayerSizes& ls = sizes_;
  const double touched = expected_distinct_experts(shape_, r.M) / shape_.E;
  if (!shape_.holds_all_experts())  // the slots of other GPUs' experts stay zero in this GPU's sum
    MX_CUDA(cudaMemsetAsync(act_.ysl, 0, size_t(r.M) * shape_.top_k * shape_.H * 4, stream_));
  if (!probe_.skips(kDecodeFc1)) cuda::mxfp4_moe_fc1_swiglu(e, stream_);
  mark("moe_fc1_swiglu", touched * double(ls.up_blocks + ls.up_scales + ls.up_bias));
  if (!probe_.skips(kDecodeFc2)) cuda::mxfp4_moe_fc2(e, stream_);
  mark("moe_fc2", touched * double(ls.down_blocks + ls.down_scales + ls.down_bias));
}

// logits [S, V] of rows s0.. (act_.xs): this GPU's vocabulary rows, then on a tensor-parallel rank every
// rank's slice gathered (in place into logits_tp, [ranks][S][slice]) and laid out row by row.
float* Forward::lm_head(float* logits, int s0, int S, bool gather) {
  const int H = shape_.H, V = shape_.V, R = shape_.head_rows;
  float* out = tp() ? act_.logits_tp + size_t(opt_.tp->rank) * S * R : logits;  // [S, R]
  if (S <= cuda::kDecodeMaxTokens) {
    cuda::dense_lm_head(act_.xs + size_t(s0) * H, model_.lm_head, out, S, R, H, stream_);
  } else {  // many rows: tensor-core GEMMs read the head once
    cuda::GemmBf16Params g;
    g.x = act_.xs + size_t(s0) * H; g.y_f32 = true; g.M = S; g.K = H;
    if (model_.lm_head.fmt == DenseFormat::kBf16) {
      g.w = model_.lm_head.bf16(); g.y = out; g.N = R;
      cuda::gemm_bf16(gemm_, g, stream_);
    } else {  // a quantized head: slices of vocabulary rows widened to bf16 in the scratch, each a GEMM
      const int step = std::max(8, int(dense_scratch_elems(shape_) / size_t(H)) & ~7);  // N % 8 for cuBLASLt
      g.w = act_.wdq; g.ldy = R;
      for (int v0 = 0; v0 < R; v0 += step) {
        g.N = std::min(step, R - v0);
        g.y = out + v0;
        cuda::dequantize_dense_rows(model_.lm_head, size_t(v0), g.N, H, act_.wdq, stream_);
        cuda::gemm_bf16(gemm_, g, stream_);
      }
    }
  }
  if (!tp() || !gather) return out;
  const size_t slice = size_t(S) * R;
  opt_.tp->all_gather(out, act_.logits_tp, slice * 4, stream_);
  for (int q = 0; q < opt_.tp->size; ++q)
    MX_CUDA(cudaMemcpy2DAsync(logits + size_t(q) * R, size_t(V) * 4, act_.logits_tp + size_t(q) * slice, size_t(R) * 4,
                              size_t(R) * 4, size_t(S), cudaMemcpyDeviceToDevice, stream_));
  return out;
}

Forward::ExpertWeights Forward::expert_weights(int l) const {
  const DeviceLayer& L = model_.layers[size_t(l)];
  const size_t H = shape_.H, I = shape_.I, x0 = size_t(shape_.expert0);
  // Offsets before the arrays' starts: only ids of held experts ever index them (the kernels skip the rest).
  return {L.up_blocks - x0 * I * H, L.up_scales - x0 * 2 * I * H / 32, L.down_blocks - x0 * H * I / 2,
          L.down_scales - x0 * H * I / 32, L.up_bias - x0 * 2 * I, L.down_bias - x0 * H,
          L.up_smax - x0 * 2 * I, L.down_smax - x0 * H};
}

void Forward::zero_unless_rank0(float* rows, size_t n) {
  if (tp() && opt_.tp->rank != 0) MX_CUDA(cudaMemsetAsync(rows, 0, n * 4, stream_));
}

void Forward::reduce_after_attention(float* rows, float* x, size_t n) {
  if (!tp()) return;
  if (rows == x) opt_.tp->all_reduce_sum_f32(x, n, stream_);
  else opt_.tp->reduce_into(rows, x, n, stream_);
  mark("all_reduce", 0);
}

// One token under tensor parallelism: the sum after the o-proj also leaves the router's sums (PeerRouterFold).
void Forward::reduce_with_router(int l, float* rows, float* x) {
  const DeviceLayer& L = model_.layers[size_t(l)];
  const cuda::PeerRouterFold f{L.mlp_norm, L.router_w, act_.route_acc + size_t(l) * shape_.E, act_.ss_part, shape_.E};
  opt_.tp->reduce_into_router(rows, x, size_t(shape_.H), f, stream_);
  mark("all_reduce_router", double(sizes_.router_w));
}

void Forward::reduce_after_experts(float* y, size_t n) {
  if (!tp()) return;
  opt_.tp->all_reduce_sum_f32(y, n, stream_);
  mark("all_reduce", 0);
}

// The whole step in one cooperative kernel (decode_step.h). It has no reduce points between its
// layers, so a tensor-parallel engine runs the per-op path.
void Forward::decode_persistent(const StepView& st, int t0, int M, bool one_token_per_seq) {
  const ModelConfig& c = model_.cfg;
  const StepMeta& m = *st.dev;
  cuda::launch_embed_bf16(model_.embed, m.tok + t0, act_.xa, M, shape_.H, stream_, act_.picked);
  cuda::DecodeStepParams p;
  p.layers = act_.step_layers; p.num_layers = shape_.layers;
  p.xa = act_.xa; p.xb = act_.xb; p.y_slot = act_.ysl; p.q = act_.qkv; p.attn = act_.attn;
  p.attn_partials = act_.attn_part; p.attn_tickets = act_.tickets;
  p.router_logits = act_.router; p.xn = act_.xn; p.act = act_.act_bf; p.counters = act_.step_counters;
  p.pos = m.pos + t0; p.slot = m.slot + t0; p.bt_off = m.bt_off + t0; p.block_tables = m.bt;
  p.slot_sw = m.slot_sw + t0; p.bt_off_sw = m.bt_off_sw + t0;
  p.inv_freq = act_.inv_freq; p.concentration = concentration_; p.eps = c.rms_norm_eps;
  p.alpha = c.swiglu_alpha; p.limit = c.swiglu_limit;
  p.M = M; p.H = shape_.H; p.I = shape_.I; p.E = shape_.E;
  p.Hq = shape_.Hq; p.Hkv = shape_.Hkv; p.D = shape_.D;
  p.kv_stable = one_token_per_seq;
  p.kv_fp8 = kv_.spec.dtype == cuda::KvDtype::kFp8E4m3;
  p.dense = shape_.dense.qkv;
  p.trace = probe_.trace;
  if (probe_.trace) {
    probe_.trace_items = cuda::decode_step_items(M, p.num_layers, p.H, p.I, p.E, p.Hq, p.Hkv, p.D);
    probe_.trace_kind = 0;
  }
  cuda::decode_step(p, stream_);
}

void Forward::row_logits(const float* x, const float* y_slot, const int32_t* rows, int n, float* logits) {
  cuda::final_rmsnorm_bf16({x, y_slot, nullptr}, rows, model_.final_norm, model_.cfg.rms_norm_eps, act_.xs, n, shape_.H,
                           stream_);
  lm_head(logits, 0, n, true);
}

// Final norm + lm_head + pick for S rows of the current token block (x [*, H] + y_slot).
void Forward::final_logits(const StepView& st, const float* x, const float* y_slot, const int32_t* rows, int s0,
                           int S) {
  const int H = shape_.H, V = shape_.V;
  cuda::final_rmsnorm_bf16({x, y_slot, nullptr}, rows, model_.final_norm, model_.cfg.rms_norm_eps,
                           act_.xs + size_t(s0) * H, S, H, stream_);
  mark("final_norm", 0);
  float* logits = act_.logits + size_t(s0) * V;
  // Tensor parallel: each rank picks over its vocabulary slice and the ranks' partials are gathered,
  // unless the step reads the whole logits afterwards.
  const bool split = tp() && !st.full_logits;
  float* own = lm_head(logits, s0, S, !split);
  mark("lm_head", double(lm_head_bytes(shape_)));
  if (st.adjust) {  // on this rank's slice when split; every rank reads the same lists
    const int slots = st.mask_slots, words = st.mask_words;
    if (split) {
      cuda::launch_adjust_logits(own, shape_.head_rows, shape_.vocab0, shape_.head_rows, st.dev->adj, s0, S, stream_);
      cuda::launch_mask_logits(own, shape_.head_rows, shape_.vocab0, shape_.head_rows, st.dev->mask, slots, words, s0, S, stream_);
    } else {
      cuda::launch_adjust_logits(logits, V, 0, V, st.dev->adj, s0, S, stream_);
      cuda::launch_mask_logits(logits, V, 0, V, st.dev->mask, slots, words, s0, S, stream_);
    }
  }
  int32_t* tok = reinterpret_cast<int32_t*>(st.results) + s0;
  float* lp = st.results + st.num_sampled + s0;
  if (split) {
    const int R = shape_.head_rows, rank = opt_.tp->rank, id0 = shape_.vocab0, ranks = opt_.tp->size;
    const int n = cuda::argmax_chunks_split((V + ranks - 1) / ranks, ranks);  // the same on every rank
    const size_t part = size_t(S) * n * cuda::kArgmaxPartFloats;
    cuda::launch_argmax_parts(own, S, R, std::clamp(opt_.vocab_limit - id0, 0, R), id0, n,
                              act_.argmax_part + rank * part, stream_, st.dev->inv_temp + s0, st.dev->sample_key + s0);
    opt_.tp->all_gather(act_.argmax_part + rank * part, act_.argmax_part, part * 4, stream_);
    cuda::launch_argmax_merge(act_.argmax_part, ranks, S, n, tok, lp, stream_, act_.picked + s0);
  } else {
    cuda::launch_argmax_logprob(logits, S, V, opt_.vocab_limit, tok, lp, act_.argmax_part, stream_,
                                st.dev->inv_temp + s0, st.dev->sample_key + s0, act_.picked + s0);
  }
  mark("argmax", double(S) * V * 4);
}

}  // namespace mx
