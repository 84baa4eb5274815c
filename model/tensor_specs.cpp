#include "model/tensor_specs.h"

#include <fmt/format.h>

namespace mx {
namespace {
struct DTypeInfo {
  const char* name;
  DType dtype;
  int size;
};
constexpr DTypeInfo kDTypes[] = {
    {"BF16", DType::kBF16, 2}, {"F16", DType::kF16, 2},   {"F32", DType::kF32, 4},
    {"F64", DType::kF64, 8},   {"U8", DType::kU8, 1},     {"I8", DType::kI8, 1},
    {"U16", DType::kU16, 2},   {"I16", DType::kI16, 2},   {"U32", DType::kU32, 4},
    {"I32", DType::kI32, 4},   {"U64", DType::kU64, 8},   {"I64", DType::kI64, 8},
    {"BOOL", DType::kBool, 1}, {"F8_E4M3", DType::kF8E4M3, 1}, {"F8_E5M2", DType::kF8E5M2, 1},
};
}  // namespace

bool parse_dtype(const std::string& s, DType* out) {
  for (const auto& d : kDTypes)
    if (s == d.name) {
      *out = d.dtype;
      return true;
    }
  return false;
}

const char* dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.name;
  return "?";
}

int dtype_size(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.size;
  return 0;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::vector<TensorSpec> expected_tensors(const ModelConfig& c) {
  const int64_t H = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim(), E = c.num_experts,
                I = c.intermediate_size, V = c.vocab_size;
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", DType::kBF16, {V, H}});
  for (int l = 0; l < c.num_layers; ++l) {
    std::string p = fmt::format("model.layers.{}.", l);
    t.push_back({p + "input_layernorm.weight", DType::kBF16, {H}});
    t.push_back({p + "self_attn.q_proj.weight", DType::kBF16, {Q, H}});
    t.push_back({p + "self_attn.q_proj.bias", DType::kBF16, {Q}});
    t.push_back({p + "self_attn.k_proj.weight", DType::kBF16, {KV, H}});
    t.push_back({p + "self_attn.k_proj.bias", DType::kBF16, {KV}});
    t.push_back({p + "self_attn.v_proj.weight", DType::kBF16, {KV, H}});
    t.push_back({p + "self_attn.v_proj.bias", DType::kBF16, {KV}});
    t.push_back({p + "self_attn.o_proj.weight", DType::kBF16, {H, Q}});
    t.push_back({p + "self_attn.o_proj.bias", DType::kBF16, {H}});
    t.push_back({p + "self_attn.sinks", DType::kBF16, {c.num_heads}});
    t.push_back({p + "post_attention_layernorm.weight", DType::kBF16, {H}});
    t.push_back({p + "mlp.router.weight", DType::kBF16, {E, H}});
    t.push_back({p + "mlp.router.bias", DType::kBF16, {E}});
    t.push_back({p + "mlp.experts.gate_up_proj_blocks", DType::kU8, {E, 2 * I, H / 32, 16}});
    t.push_back({p + "mlp.experts.gate_up_proj_scales", DType::kU8, {E, 2 * I, H / 32}});
    t.push_back({p + "mlp.experts.gate_up_proj_bias", DType::kBF16, {E, 2 * I}});
    t.push_back({p + "mlp.experts.down_proj_blocks", DType::kU8, {E, H, I / 32, 16}});
    t.push_back({p + "mlp.experts.down_proj_scales", DType::kU8, {E, H, I / 32}});
    t.push_back({p + "mlp.experts.down_proj_bias", DType::kBF16, {E, H}});
  }
  t.push_back({"model.norm.weight", DType::kBF16, {H}});
  t.push_back({"lm_head.weight", DType::kBF16, {V, H}});
  return t;
}

}  // namespace mx
