#include "model/shard_weights.h"

#include <cstring>

#include "core/error.h"

namespace mx {
namespace {

// Copies of row and column ranges, kept in `storage`.
struct Cutter {
  std::vector<std::vector<uint8_t>>& storage;
  template <class T>
  T* take(size_t n) {
    storage.emplace_back(n * sizeof(T));
    return reinterpret_cast<T*>(storage.back().data());
  }
  // Rows [r0, r0 + n) of a [rows, row_elems] tensor, each repeated over `outer` leading blocks of
  // `rows` rows (e.g. every expert's rows).
  template <class T>
  const T* rows(const T* src, size_t outer, size_t rows, size_t r0, size_t n, size_t row_elems) {
    T* dst = take<T>(outer * n * row_elems);
    for (size_t o = 0; o < outer; ++o)
      std::memcpy(dst + o * n * row_elems, src + (o * rows + r0) * row_elems, n * row_elems * sizeof(T));
    return dst;
  }
  // Columns [c0, c0 + n) of every one of `rows` rows of `cols` elements.
  template <class T>
  const T* cols(const T* src, size_t rows, size_t cols, size_t c0, size_t n) {
    T* dst = take<T>(rows * n);
    for (size_t r = 0; r < rows; ++r) std::memcpy(dst + r * n, src + r * cols + c0, n * sizeof(T));
    return dst;
  }
  const uint16_t* zeros(size_t n) {
    uint16_t* z = take<uint16_t>(n);
    std::memset(z, 0, n * 2);
    return z;
  }
};

}  // namespace

ShardWeights shard_weights(const ModelWeights& w, const ModelConfig& cfg, const ShardDims& d, MoeSplit moe,
                           bool bias_owner) {
  ShardWeights s;
  s.cfg = cfg;
  s.cfg.num_heads = d.q_heads.count;
  s.cfg.num_kv_heads = d.kv_heads.count;
  s.cfg.vocab_size = d.vocab.count;
  if (moe == MoeSplit::kExperts) s.cfg.num_experts = d.experts.count;
  else s.cfg.intermediate_size = d.inter.count;
  if (d.inter.begin % 32 || d.inter.count % 32) fail("shard: intermediate slice not in whole MXFP4 blocks");
  Cutter c{s.storage};
  const size_t H = size_t(cfg.hidden_size), D = size_t(cfg.head_dim), I = size_t(cfg.intermediate_size);
  const size_t E = size_t(cfg.num_experts), q_dim = size_t(cfg.num_heads) * D;
  const size_t q0 = size_t(d.q_heads.begin) * D, qn = size_t(d.q_heads.count) * D;
  const size_t k0 = size_t(d.kv_heads.begin) * D, kn = size_t(d.kv_heads.count) * D;
  s.weights.embed = w.embed;
  s.weights.final_norm = w.final_norm;
  s.weights.lm_head = c.rows(w.lm_head, 1, size_t(cfg.vocab_size), size_t(d.vocab.begin), size_t(d.vocab.count), H);
  for (const LayerWeights& L : w.layers) {
    LayerWeights o = L;
    o.q_w = c.rows(L.q_w, 1, q_dim, q0, qn, H);
    o.q_b = c.rows(L.q_b, 1, q_dim, q0, qn, 1);
    o.k_w = c.rows(L.k_w, 1, size_t(cfg.kv_dim()), k0, kn, H);
    o.k_b = c.rows(L.k_b, 1, size_t(cfg.kv_dim()), k0, kn, 1);
    o.v_w = c.rows(L.v_w, 1, size_t(cfg.kv_dim()), k0, kn, H);
    o.v_b = c.rows(L.v_b, 1, size_t(cfg.kv_dim()), k0, kn, 1);
    o.sinks = c.rows(L.sinks, 1, size_t(cfg.num_heads), size_t(d.q_heads.begin), size_t(d.q_heads.count), 1);
    o.o_w = c.cols(L.o_w, H, q_dim, q0, qn);
    o.o_b = bias_owner ? L.o_b : c.zeros(H);
    if (moe == MoeSplit::kExperts) {
      const size_t e0 = size_t(d.experts.begin), en = size_t(d.experts.count);
      o.gate_up_blocks = c.rows(L.gate_up_blocks, 1, E, e0, en, 2 * I * H / 2);
      o.gate_up_scales = c.rows(L.gate_up_scales, 1, E, e0, en, 2 * I * H / 32);
      o.gate_up_bias = c.rows(L.gate_up_bias, 1, E, e0, en, 2 * I);
      o.down_blocks = c.rows(L.down_blocks, 1, E, e0, en, H * I / 2);
      o.down_scales = c.rows(L.down_scales, 1, E, e0, en, H * I / 32);
      o.down_bias = c.rows(L.down_bias, 1, E, e0, en, H);
    } else {
      const size_t i0 = size_t(d.inter.begin), in = size_t(d.inter.count);
      // gate / up rows 2i, 2i + 1 of activation i: rows [2 i0, 2 (i0 + in)) of each expert.
      o.gate_up_blocks = c.rows(L.gate_up_blocks, E, 2 * I, 2 * i0, 2 * in, H / 2);
      o.gate_up_scales = c.rows(L.gate_up_scales, E, 2 * I, 2 * i0, 2 * in, H / 32);
      o.gate_up_bias = c.rows(L.gate_up_bias, E, 2 * I, 2 * i0, 2 * in, 1);
      // The down-projection's columns [i0, i0 + in): bytes [i0 / 2, ...) of each row, blocks [i0 / 32, ...).
      o.down_blocks = c.cols(L.down_blocks, E * H, I / 2, i0 / 2, in / 2);
      o.down_scales = c.cols(L.down_scales, E * H, I / 32, i0 / 32, in / 32);
      o.down_bias = bias_owner ? L.down_bias : c.zeros(E * H);
    }
    s.weights.layers.push_back(o);
  }
  return s;
}

}  // namespace mx
