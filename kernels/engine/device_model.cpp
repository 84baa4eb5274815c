// The weights arena: layout, dummy fill, checkpoint upload, scale check.
#include "kernels/engine/device_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/common/cuda_check.h"
#include "kernels/decode/decode_gemv.h"
#include "kernels/decode/decode_kernels.h"
#include "kernels/dense_quant/dense_quant.h"
#include "kernels/moe_prefill/moe_prefill.h"
#include "model/weights.h"

namespace mx {
namespace {
using cuda::dense_scale_bytes;
using cuda::dense_value_bytes;

cuda::DenseWeightOut writable(const cuda::DenseWeight& w) {
  return {w.fmt, const_cast<uint8_t*>(w.bytes()), const_cast<uint8_t*>(w.mx_scales()), const_cast<float*>(w.row_scale())};
}
}  // namespace

DeviceShape DeviceShape::of(const ModelConfig& c, const DenseQuant& dense) {
  DeviceShape s;
  s.dense = dense;
  s.layers = c.num_layers; s.H = c.hidden_size; s.V = c.vocab_size;
  s.Hq = c.num_heads; s.Hkv = c.num_kv_heads; s.D = c.head_dim;
  s.E = c.num_experts; s.I = c.intermediate_size; s.top_k = c.experts_per_token;
  s.head_rows = c.vocab_size;
  s.experts_held = c.num_experts;
  return s;
}

DeviceShape DeviceShape::shard(const ModelConfig& c, const DenseQuant& dense, int rank, int size, MoeSplit moe) {
  DeviceShape s = of(c, dense);
  if (size == 1) return s;
  const ShardDims d = shard_dims(c, rank, size, moe);
  s.Hq = d.q_heads.count; s.Hkv = d.kv_heads.count; s.I = d.inter.count;
  s.expert0 = d.experts.begin; s.experts_held = d.experts.count;
  s.head_rows = d.vocab.count;
  s.vocab0 = d.vocab.begin;
  s.tp_size = size;
  return s;
}

LayerSizes::LayerSizes(const DeviceShape& s) {
  const size_t H = s.H, E = s.experts_held, I = s.I;
  attn_norm = mlp_norm = H * 2;
  qkv_w = dense_value_bytes(s.dense.qkv, size_t(s.qkv_dim()), H);
  qkv_sc = dense_scale_bytes(s.dense.qkv, size_t(s.qkv_dim()), H);
  qkv_b = size_t(s.qkv_dim()) * 2;
  o_w = dense_value_bytes(s.dense.o, H, size_t(s.q_dim()));
  o_sc = dense_scale_bytes(s.dense.o, H, size_t(s.q_dim()));
  o_b = H * 2;
  sinks = size_t(s.Hq) * 2;
  router_w = size_t(s.E) * H * 2;  // the router scores every expert
  router_b = size_t(s.E) * 2;
  up_blocks = E * 2 * I * H / 2;
  up_scales = E * 2 * I * H / 32;
  up_bias = E * 2 * I * 2;
  down_blocks = E * H * I / 2;
  down_scales = E * H * I / 32;
  down_bias = E * H * 2;
  up_smax = E * 2 * I;
  down_smax = E * H;
}
size_t LayerSizes::total() const {
  size_t t = 0;
  for (size_t s : {attn_norm, qkv_w, qkv_sc, qkv_b, o_w, o_sc, o_b, sinks, mlp_norm, router_w, router_b, up_blocks, up_scales,
                   up_bias, down_blocks, down_scales, down_bias, up_smax, down_smax})
    t += align256(s);
  return t;
}
size_t LayerSizes::expert_bytes() const {
  return up_blocks + up_scales + up_bias + down_blocks + down_scales + down_bias + up_smax + down_smax;
}

size_t lm_head_bytes(const DeviceShape& s) {
  return dense_value_bytes(s.dense.lm_head, size_t(s.head_rows), size_t(s.H)) +
         dense_scale_bytes(s.dense.lm_head, size_t(s.head_rows), size_t(s.H));
}

size_t dense_scratch_elems(const DeviceShape& s) {
  if (!s.dense.any()) return 0;
  return std::max(size_t(s.qkv_dim()) * s.H, size_t(s.H) * s.q_dim());
}

double expected_distinct_experts(const DeviceShape& s, int M) {
  const double E = s.E;
  return E * (1.0 - std::pow(1.0 - double(s.top_k) / E, M));
}

double decode_weight_bytes(const DeviceShape& s, int M) {
  return step_weight_bytes(s, s.layers * expected_distinct_experts(s, M), M);
}

double step_weight_bytes(const DeviceShape& s, double experts_read, int M) {
  const LayerSizes ls(s);
  const double expert = double(ls.expert_bytes()) / s.experts_held;
  const double dense = double(ls.total()) - double(ls.expert_bytes());
  return s.layers * dense + experts_read * expert + double(lm_head_bytes(s)) + double(s.H) * 2 * M;
}

DeviceModel::DeviceModel(const ModelConfig& c, const DeviceShape& s) : cfg(c), shape(s) {}

size_t DeviceModel::arena_bytes() const {
  const size_t V = shape.V, H = shape.H, HR = shape.head_rows;
  const DenseFormat f = shape.dense.lm_head;
  return align256(V * H * 2) + align256(dense_value_bytes(f, HR, H)) + align256(dense_scale_bytes(f, HR, H)) +
         align256(H * 2) + LayerSizes(shape).total() * shape.layers;
}

void DeviceModel::bind(uint8_t* arena) {
  const size_t V = shape.V, H = shape.H, HR = shape.head_rows;
  const LayerSizes ls(shape);
  uint8_t* w = arena;
  auto take = [&](size_t n) { uint8_t* p = w; w += align256(n); return p; };
  auto t16 = [&](size_t n) { return reinterpret_cast<uint16_t*>(take(n)); };
  // Values, then the scales of the format (none for bf16).
  auto dense = [&](DenseFormat f, size_t values, size_t scales) {
    cuda::DenseWeight w{f, take(values), nullptr};
    if (f != DenseFormat::kBf16) w.scales = take(scales);
    return w;
  };
  const DenseFormat hf = shape.dense.lm_head;
  embed = t16(V * H * 2);
  lm_head = dense(hf, dense_value_bytes(hf, HR, H), dense_scale_bytes(hf, HR, H));
  final_norm = t16(H * 2);
  layers.resize(size_t(shape.layers));
  for (DeviceLayer& d : layers) {
    d.attn_norm = t16(ls.attn_norm); d.qkv = dense(shape.dense.qkv, ls.qkv_w, ls.qkv_sc); d.qkv_b = t16(ls.qkv_b);
    d.o = dense(shape.dense.o, ls.o_w, ls.o_sc); d.o_b = t16(ls.o_b); d.sinks = t16(ls.sinks); d.mlp_norm = t16(ls.mlp_norm); d.router_w = t16(ls.router_w);
    d.router_b = t16(ls.router_b); d.up_blocks = take(ls.up_blocks); d.up_scales = take(ls.up_scales);
    d.up_bias = t16(ls.up_bias); d.down_blocks = take(ls.down_blocks); d.down_scales = take(ls.down_scales);
    d.down_bias = t16(ls.down_bias); d.up_smax = take(ls.up_smax); d.down_smax = take(ls.down_smax);
  }
}

// Every rank of a tensor-parallel group draws the same seeds in the same order, so the tensors all ranks
// hold whole (embedding, norms, router) are equal on every rank.
void DeviceModel::fill_dummy(uint64_t seed0, cudaStream_t s, uint16_t* scratch, size_t scratch_elems) {
  const size_t H = shape.H, V = shape.V;
  uint64_t seed = seed0 * 1000003;
  auto bf = [&](uint16_t* p, size_t n, float sc, float off = 0.f) {
    cuda::launch_fill_random_bf16(p, n, sc, off, ++seed, s);
  };
  // A dense matrix [N, K]: bf16 in place, or bf16 slices in the scratch quantized into place.
  // One seed a matrix, whatever the number of slices.
  auto dense = [&](const cuda::DenseWeight& w, size_t N, size_t K, float sc) {
    if (w.fmt == DenseFormat::kBf16) return bf(const_cast<uint16_t*>(w.bf16()), N * K, sc);
    const uint64_t base = ++seed;
    const size_t step = std::max<size_t>(1, scratch_elems / K);
    for (size_t r = 0; r < N; r += step) {
      const size_t n = std::min(step, N - r);
      cuda::launch_fill_random_bf16(scratch, n * K, sc, 0.f, base * 0x9E3779B97F4A7C15ull + r, s);
      cuda::quantize_dense_rows(scratch, int(n), int(K), writable(w), r, s);
    }
  };
  bf(embed, V * H, 1.0f);
  dense(lm_head, size_t(shape.head_rows), H, 0.05f);
  bf(final_norm, H, 0.1f, 1.0f);
  const LayerSizes ls(shape);
  for (auto& d : layers) {
    bf(d.attn_norm, H, 0.1f, 1.0f); bf(d.mlp_norm, H, 0.1f, 1.0f);
    dense(d.qkv, size_t(shape.qkv_dim()), H, 0.03f); bf(d.qkv_b, ls.qkv_b / 2, 0.1f);
    dense(d.o, H, size_t(shape.q_dim()), 0.03f); bf(d.o_b, H, 0.1f); bf(d.sinks, size_t(shape.Hq), 1.0f);
    bf(d.router_w, ls.router_w / 2, 0.05f); bf(d.router_b, size_t(shape.E), 0.1f);
    cuda::launch_fill_random_u8(d.up_blocks, ls.up_blocks, 0, 0, ++seed, s);
    cuda::launch_fill_random_u8(d.up_scales, ls.up_scales, 118, 4, ++seed, s);
    bf(d.up_bias, ls.up_bias / 2, 0.1f);
    cuda::launch_fill_random_u8(d.down_blocks, ls.down_blocks, 0, 0, ++seed, s);
    cuda::launch_fill_random_u8(d.down_scales, ls.down_scales, 118, 4, ++seed, s);
    bf(d.down_bias, ls.down_bias / 2, 0.1f);
  }
  MX_CUDA(cudaStreamSynchronize(s));
}

size_t DeviceModel::upload(const ModelWeights& w, cudaStream_t s, uint16_t* scratch, size_t scratch_elems) {
  constexpr size_t kStage = 64ull << 20;
  uint8_t* stage[2];
  cudaEvent_t ev[2];
  for (int i = 0; i < 2; ++i) {
    MX_CUDA(cudaMallocHost(&stage[i], kStage));
    MX_CUDA(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
    MX_CUDA(cudaEventRecord(ev[i], s));
  }
  int cur = 0;
  size_t total = 0;
  // The memcpy into one staging buffer overlaps the DMA out of the other.
  auto put = [&](void* dst, const void* src, size_t n) {
    const uint8_t* from = static_cast<const uint8_t*>(src);
    uint8_t* to = static_cast<uint8_t*>(dst);
    for (size_t off = 0; off < n; off += kStage) {
      const size_t len = std::min(kStage, n - off);
      MX_CUDA(cudaEventSynchronize(ev[cur]));
      std::memcpy(stage[cur], from + off, len);
      MX_CUDA(cudaMemcpyAsync(to + off, stage[cur], len, cudaMemcpyHostToDevice, s));
      MX_CUDA(cudaEventRecord(ev[cur], s));
      cur ^= 1;
    }
    total += n;
  };
  // Rows [row0, row0 + rows) of dense matrix `dst` (K columns) from bf16 host rows: copied, or through
  // the scratch and quantized on the GPU (the stream orders each slice's copy, quantization and reuse).
  auto put_dense = [&](const cuda::DenseWeight& dst, size_t row0, const uint16_t* src, size_t rows, size_t K) {
    if (dst.fmt == DenseFormat::kBf16) return put(const_cast<uint16_t*>(dst.bf16()) + row0 * K, src, rows * K * 2);
    const size_t step = std::max<size_t>(1, std::min(kStage / (2 * K), scratch_elems / K));
    for (size_t r = 0; r < rows; r += step) {
      const size_t n = std::min(step, rows - r);
      put(scratch, src + r * K, n * K * 2);
      cuda::quantize_dense_rows(scratch, int(n), int(K), writable(dst), row0 + r, s);
    }
  };
  const size_t H = shape.H, V = shape.V;
  const LayerSizes ls(shape);
  put(embed, w.embed, V * H * 2);
  put_dense(lm_head, 0, w.lm_head, size_t(shape.head_rows), H);
  put(final_norm, w.final_norm, H * 2);
  for (int l = 0; l < shape.layers; ++l) {
    const LayerWeights& L = w.layers[size_t(l)];
    DeviceLayer& d = layers[size_t(l)];
    const size_t qr = size_t(shape.q_dim()), kr = size_t(shape.kv_dim());
    put(d.attn_norm, L.attn_norm, ls.attn_norm);
    put_dense(d.qkv, 0, L.q_w, qr, H);
    put_dense(d.qkv, qr, L.k_w, kr, H);
    put_dense(d.qkv, qr + kr, L.v_w, kr, H);
    put(d.qkv_b, L.q_b, qr * 2);
    put(d.qkv_b + qr, L.k_b, kr * 2);
    put(d.qkv_b + qr + kr, L.v_b, kr * 2);
    put_dense(d.o, 0, L.o_w, H, qr); put(d.o_b, L.o_b, ls.o_b); put(d.sinks, L.sinks, ls.sinks);
    put(d.mlp_norm, L.mlp_norm, ls.mlp_norm); put(d.router_w, L.router_w, ls.router_w);
    put(d.router_b, L.router_b, ls.router_b);
    put(d.up_blocks, L.gate_up_blocks, ls.up_blocks); put(d.up_scales, L.gate_up_scales, ls.up_scales);
    put(d.up_bias, L.gate_up_bias, ls.up_bias);
    put(d.down_blocks, L.down_blocks, ls.down_blocks); put(d.down_scales, L.down_scales, ls.down_scales);
    put(d.down_bias, L.down_bias, ls.down_bias);
  }
  MX_CUDA(cudaStreamSynchronize(s));
  for (int i = 0; i < 2; ++i) {
    cudaEventDestroy(ev[i]);
    cudaFreeHost(stage[i]);
  }
  return total;
}

void DeviceModel::find_row_scales(cudaStream_t s) {
  const LayerSizes ls(shape);
  for (const auto& d : layers) {
    cuda::moe_row_max_scale(d.up_scales, ls.up_smax, shape.H / 32, d.up_smax, s);
    cuda::moe_row_max_scale(d.down_scales, ls.down_smax, shape.I / 32, d.down_smax, s);
  }
}

void DeviceModel::check_scales(unsigned long long* bad, cudaStream_t s) const {
  MX_CUDA(cudaMemsetAsync(bad, 0, 8, s));
  const LayerSizes ls(shape);
  for (const auto& d : layers) {
    cuda::mxfp4_count_bad_scales(d.up_scales, ls.up_scales, bad, s);
    cuda::mxfp4_count_bad_scales(d.down_scales, ls.down_scales, bad, s);
  }
  auto count = [&] {
    unsigned long long n = 0;
    MX_CUDA(cudaMemcpyAsync(&n, bad, 8, cudaMemcpyDeviceToHost, s));
    MX_CUDA(cudaStreamSynchronize(s));
    return n;
  };
  if (const auto n = count())
    fail("checkpoint has {} MXFP4 expert scales above 2^1 (E8M0 > 128); the CUDA engine does not support them", n);
  MX_CUDA(cudaMemsetAsync(bad, 0, 8, s));
  const size_t H = shape.H;
  if (lm_head.fmt == DenseFormat::kMxfp4) cuda::mxfp4_count_bad_scales(lm_head.mx_scales(), size_t(shape.head_rows) * H / 32, bad, s);
  for (const auto& d : layers) {
    if (d.qkv.fmt == DenseFormat::kMxfp4) cuda::mxfp4_count_bad_scales(d.qkv.mx_scales(), ls.qkv_sc, bad, s);
    if (d.o.fmt == DenseFormat::kMxfp4) cuda::mxfp4_count_bad_scales(d.o.mx_scales(), ls.o_sc, bad, s);
  }
  if (const auto n = count())
    fail("--mxfp4-layers: {} blocks of 32 dense weights hold magnitudes above 12 (scale above 2^1), which the "
         "CUDA kernels do not support; use --fp8-layers for those layers", n);
}

}  // namespace mx
