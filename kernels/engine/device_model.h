// The model's weights on one GPU: the shapes the kernels see, one arena laid out layer by layer, and
// how it is filled (a checkpoint's tensors through pinned staging, or dummy weights made on the GPU).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/common/dense_weight.h"
#include "model/config.h"
#include "model/dense_quant.h"
#include "model/tensor_parallel.h"

namespace mx {

struct ModelWeights;

// Every buffer of the device arenas starts on a 256-byte boundary.
inline size_t align256(size_t n) { return (n + 255) & ~size_t(255); }

// The dimensions the kernels see. On one GPU they are the model's; a tensor-parallel shard holds a
// slice of the heads and of the experts, so the forward takes its sizes from here, never from
// ModelConfig.
struct DeviceShape {
  int layers = 0, H = 0, V = 0;  // layers, hidden size, vocabulary (embedding rows, the logits' width)
  int Hq = 0, Hkv = 0, D = 0;    // query heads, KV heads, head dim
  int E = 0, I = 0, top_k = 0;   // experts (the router's), intermediate size, experts per token
  int expert0 = 0, experts_held = 0;  // the experts whose weights this GPU holds: [expert0, expert0 + held)
  int head_rows = 0;                 // the lm_head (vocabulary) rows this GPU holds
  int vocab0 = 0;                    // the first of them
  int tp_size = 1;                   // GPUs of the tensor-parallel group
  DenseQuant dense;              // formats of qkv, o-proj and lm_head (--mxfp4-layers, --fp8-layers)
  int q_dim() const { return Hq * D; }
  int kv_dim() const { return Hkv * D; }
  int qkv_dim() const { return (Hq + 2 * Hkv) * D; }
  static DeviceShape of(const ModelConfig& c, const DenseQuant& dense = {});
  // Rank `rank` of `size` (model/tensor_parallel.h): its heads, its experts or intermediate slice, and its
  // vocabulary rows.
  static DeviceShape shard(const ModelConfig& c, const DenseQuant& dense, int rank, int size, MoeSplit moe);
  bool holds_all_experts() const { return experts_held == E; }
};

// One layer's weights (device pointers into the arena). q, k and v are one matrix, concatenated by
// rows, so one GEMV reads the three projections.
struct DeviceLayer {
  cuda::DenseWeight qkv, o;
  uint16_t *attn_norm, *qkv_b, *o_b, *sinks, *mlp_norm, *router_w, *router_b;
  uint8_t *up_blocks, *up_scales, *down_blocks, *down_scales;
  uint16_t *up_bias, *down_bias;
  uint8_t *up_smax, *down_smax;  // each expert row's largest scale (the FP8 MoE's, find_row_scales)
};

// Byte sizes of every tensor of one layer, in arena order (qkv_sc / o_sc: the quantized formats' scales).
struct LayerSizes {
  size_t attn_norm, qkv_w, qkv_sc, qkv_b, o_w, o_sc, o_b, sinks, mlp_norm, router_w, router_b, up_blocks, up_scales,
      up_bias, down_blocks, down_scales, down_bias, up_smax, down_smax;
  explicit LayerSizes(const DeviceShape& s);
  size_t total() const;         // with each tensor's 256-byte alignment
  size_t expert_bytes() const;  // all experts held, fc1 + fc2 (blocks, scales, bias, row scale maxima)
};

// Bytes of lm_head in its format, scales included.
size_t lm_head_bytes(const DeviceShape& s);
// bf16 values of the scratch quantized dense matrices pass through (load, prefill GEMMs): the larger of
// qkv and o-proj; lm_head goes in slices of rows. 0 when every dense matrix is bf16.
size_t dense_scratch_elems(const DeviceShape& s);

// Distinct experts M tokens touch on average with uniform routing, and the weight bytes one decode
// step of M tokens reads with it (dense + those experts + lm_head + embedding rows).
double expected_distinct_experts(const DeviceShape& s, int M);
double decode_weight_bytes(const DeviceShape& s, int M);
// The same with the experts counted: `experts_read` distinct experts summed over the layers.
double step_weight_bytes(const DeviceShape& s, double experts_read, int M);

class DeviceModel {
 public:
  // cfg: the whole model's; shape: DeviceShape::of or ::shard of it.
  DeviceModel(const ModelConfig& cfg, const DeviceShape& shape);
  size_t arena_bytes() const;
  // Lays the tensors out in `arena` (arena_bytes() of device memory).
  void bind(uint8_t* arena);
  // Quantized matrices pass through `scratch` (bf16, scratch_elems >= one row of each): made or uploaded
  // in bf16 a slice of rows at a time, then quantized into the arena on the GPU (dense_quant.h).
  void fill_dummy(uint64_t seed, cudaStream_t s, uint16_t* scratch, size_t scratch_elems);
  // Host -> device through two pinned staging buffers; returns the bytes copied. A tensor-parallel rank
  // uploads its shard_weights() (the layout is the same).
  size_t upload(const ModelWeights& w, cudaStream_t s, uint16_t* scratch, size_t scratch_elems);
  // The decode kernels fold the E8M0 scale into one bf16 multiply, which covers scales up to 2^1:
  // fails on a checkpoint with larger ones (experts, or dense rows quantized to MXFP4). scratch: 8 bytes
  // of device memory.
  void check_scales(unsigned long long* scratch, cudaStream_t s) const;
  // Each expert row's largest scale (up_smax, down_smax) from the loaded scales.
  void find_row_scales(cudaStream_t s);

  const ModelConfig& cfg;
  DeviceShape shape;
  uint16_t *embed = nullptr, *final_norm = nullptr;
  cuda::DenseWeight lm_head;
  std::vector<DeviceLayer> layers;
  bool sliding(int layer) const { return cfg.sliding_window > 0 && cfg.layer_is_sliding[size_t(layer)]; }
  int window(int layer) const { return sliding(layer) ? cfg.sliding_window : 0; }
};

}  // namespace mx
