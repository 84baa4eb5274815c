#include "model/weights.h"

#include <fmt/format.h>

namespace mx {

ModelWeights bind_weights(const Checkpoint& ck, const ModelConfig& cfg) {
  ck.validate(cfg);
  auto bf16 = [&](const std::string& n) { return reinterpret_cast<const uint16_t*>(ck.get(n).data); };
  auto u8 = [&](const std::string& n) { return ck.get(n).data; };
  ModelWeights w;
  w.embed = bf16("model.embed_tokens.weight");
  w.final_norm = bf16("model.norm.weight");
  w.lm_head = bf16("lm_head.weight");
  for (int l = 0; l < cfg.num_layers; ++l) {
    std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights L;
    L.attn_norm = bf16(p + "input_layernorm.weight");
    L.q_w = bf16(p + "self_attn.q_proj.weight");
    L.q_b = bf16(p + "self_attn.q_proj.bias");
    L.k_w = bf16(p + "self_attn.k_proj.weight");
    L.k_b = bf16(p + "self_attn.k_proj.bias");
    L.v_w = bf16(p + "self_attn.v_proj.weight");
    L.v_b = bf16(p + "self_attn.v_proj.bias");
    L.o_w = bf16(p + "self_attn.o_proj.weight");
    L.o_b = bf16(p + "self_attn.o_proj.bias");
    L.sinks = bf16(p + "self_attn.sinks");
    L.mlp_norm = bf16(p + "post_attention_layernorm.weight");
    L.router_w = bf16(p + "mlp.router.weight");
    L.router_b = bf16(p + "mlp.router.bias");
    L.gate_up_blocks = u8(p + "mlp.experts.gate_up_proj_blocks");
    L.gate_up_scales = u8(p + "mlp.experts.gate_up_proj_scales");
    L.gate_up_bias = bf16(p + "mlp.experts.gate_up_proj_bias");
    L.down_blocks = u8(p + "mlp.experts.down_proj_blocks");
    L.down_scales = u8(p + "mlp.experts.down_proj_scales");
    L.down_bias = bf16(p + "mlp.experts.down_proj_bias");
    w.layers.push_back(L);
  }
  return w;
}

}  // namespace mx
