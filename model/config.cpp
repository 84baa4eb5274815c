#include "model/config.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mmap_file.h"

namespace mx {
namespace {

using nlohmann::json;

template <class T>
T get_field(const json& j, const char* key, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end()) fail("{}: missing field '{}'", origin, key);
  try {
    if constexpr (std::is_same_v<T, int>) {
      if (!it->is_number_integer()) throw 0;
      auto v = it->get<int64_t>();
      if (v < INT32_MIN || v > INT32_MAX) throw 0;
      return int(v);
    } else if constexpr (std::is_same_v<T, float>) {
      if (!it->is_number()) throw 0;
      return it->get<float>();
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) throw 0;
      return it->get<bool>();
    } else {
      return it->get<T>();
    }
  } catch (...) {
    fail("{}: field '{}' has the wrong type: {}", origin, key, it->dump());
  }
}

template <class T>
T get_or(const json& j, const char* key, T def, const std::string& origin) {
  return j.contains(key) && !j[key].is_null() ? get_field<T>(j, key, origin) : def;
}

void require_positive(int v, const char* key, const std::string& origin) {
  if (v <= 0) fail("{}: field '{}' must be positive, got {}", origin, key, v);
}

}  // namespace

ModelConfig parse_model_config(const std::string& config_text, const std::string& gen_text,
                               const std::string& origin) {
  json j;
  try {
    j = json::parse(config_text);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", origin, e.what());
  }
  if (!j.is_object()) fail("{}: expected a JSON object", origin);

  std::string model_type = get_or<std::string>(j, "model_type", "", origin);
  if (model_type != "gpt_oss") fail("{}: field 'model_type' is '{}', expected 'gpt_oss'", origin, model_type);
  if (j.contains("architectures")) {
    const auto& a = j["architectures"];
    if (!a.is_array() || a.empty() || a[0] != "GptOssForCausalLM")
      fail("{}: field 'architectures' is {}, expected [\"GptOssForCausalLM\"]", origin, a.dump());
  }

  ModelConfig c;
  c.num_layers = get_field<int>(j, "num_hidden_layers", origin);
  c.hidden_size = get_field<int>(j, "hidden_size", origin);
  c.num_heads = get_field<int>(j, "num_attention_heads", origin);
  c.num_kv_heads = get_field<int>(j, "num_key_value_heads", origin);
  c.head_dim = get_or<int>(j, "head_dim", 64, origin);
  c.intermediate_size = get_field<int>(j, "intermediate_size", origin);
  c.num_experts = j.contains("num_local_experts") ? get_field<int>(j, "num_local_experts", origin)
                                                 : get_field<int>(j, "num_experts", origin);
  c.experts_per_token = j.contains("num_experts_per_tok") ? get_field<int>(j, "num_experts_per_tok", origin)
                                                          : get_field<int>(j, "experts_per_token", origin);
  c.vocab_size = get_field<int>(j, "vocab_size", origin);
  c.sliding_window = get_or<int>(j, "sliding_window", 128, origin);
  c.rope_theta = get_or<float>(j, "rope_theta", 150000.0f, origin);
  c.swiglu_limit = get_or<float>(j, "swiglu_limit", 7.0f, origin);
  c.swiglu_alpha = get_or<float>(j, "swiglu_alpha", 1.702f, origin);
  c.rms_norm_eps = get_or<float>(j, "rms_norm_eps", 1e-5f, origin);
  c.max_position_embeddings = get_or<int>(j, "max_position_embeddings", 131072, origin);
  c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false, origin);
  c.pad_token_id = get_or<int>(j, "pad_token_id", -1, origin);
  c.bos_token_id = get_or<int>(j, "bos_token_id", -1, origin);

  require_positive(c.num_layers, "num_hidden_layers", origin);
  require_positive(c.hidden_size, "hidden_size", origin);
  require_positive(c.num_heads, "num_attention_heads", origin);
  require_positive(c.num_kv_heads, "num_key_value_heads", origin);
  require_positive(c.head_dim, "head_dim", origin);
  require_positive(c.intermediate_size, "intermediate_size", origin);
  require_positive(c.num_experts, "num_local_experts", origin);
  require_positive(c.experts_per_token, "num_experts_per_tok", origin);
  require_positive(c.vocab_size, "vocab_size", origin);
  require_positive(c.sliding_window, "sliding_window", origin);
  require_positive(c.max_position_embeddings, "max_position_embeddings", origin);
  if (c.num_heads % c.num_kv_heads != 0)
    fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", origin, c.num_heads,
         c.num_kv_heads);
  if (c.head_dim % 2 != 0) fail("{}: field 'head_dim' must be even, got {}", origin, c.head_dim);
  if (c.experts_per_token > c.num_experts)
    fail("{}: num_experts_per_tok {} exceeds num_local_experts {}", origin, c.experts_per_token, c.num_experts);
  if (c.hidden_size % 32 != 0)
    fail("{}: field 'hidden_size' must be a multiple of 32 (MXFP4 block), got {}", origin, c.hidden_size);
  if (c.intermediate_size % 32 != 0)
    fail("{}: field 'intermediate_size' must be a multiple of 32 (MXFP4 block), got {}", origin,
         c.intermediate_size);
  if (!(c.rope_theta > 1.0f)) fail("{}: field 'rope_theta' must be > 1, got {}", origin, c.rope_theta);
  if (!(c.rms_norm_eps > 0.0f)) fail("{}: field 'rms_norm_eps' must be > 0, got {}", origin, c.rms_norm_eps);
  if (!(c.swiglu_limit > 0.0f)) fail("{}: field 'swiglu_limit' must be > 0, got {}", origin, c.swiglu_limit);
  if (c.tie_word_embeddings) fail("{}: field 'tie_word_embeddings' is true; gpt-oss has an untied lm_head", origin);

  // layer_types: default (HF) is sliding on even layers.
  c.layer_is_sliding.assign(c.num_layers, 0);
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const auto& lt = j["layer_types"];
    if (!lt.is_array() || int(lt.size()) != c.num_layers)
      fail("{}: field 'layer_types' must be an array of num_hidden_layers={} entries, got {}", origin,
           c.num_layers, lt.is_array() ? std::to_string(lt.size()) + " entries" : lt.dump());
    for (int i = 0; i < c.num_layers; ++i) {
      if (lt[i] == "sliding_attention") c.layer_is_sliding[i] = 1;
      else if (lt[i] == "full_attention") c.layer_is_sliding[i] = 0;
      else fail("{}: field 'layer_types[{}]' is {}, expected sliding_attention|full_attention", origin, i,
                lt[i].dump());
    }
  } else {
    for (int i = 0; i < c.num_layers; ++i) c.layer_is_sliding[i] = (i % 2 == 0);
  }

  const char* rope_key = j.contains("rope_scaling") ? "rope_scaling"
                         : j.contains("rope_parameters") ? "rope_parameters" : nullptr;
  if (!rope_key || j[rope_key].is_null()) fail("{}: missing field 'rope_scaling' (gpt-oss uses YaRN)", origin);
  {
    const auto& r = j[rope_key];
    if (!r.is_object()) fail("{}: field '{}' must be an object, got {}", origin, rope_key, r.dump());
    std::string type = r.contains("rope_type") ? r["rope_type"].get<std::string>()
                                               : r.value("type", std::string());
    if (type != "yarn") fail("{}: field '{}.rope_type' is '{}', expected 'yarn'", origin, rope_key, type);
    std::string o = origin + " " + rope_key;
    c.rope_scaling.factor = get_field<float>(r, "factor", o);
    c.rope_scaling.beta_fast = get_or<float>(r, "beta_fast", 32.0f, o);
    c.rope_scaling.beta_slow = get_or<float>(r, "beta_slow", 1.0f, o);
    c.rope_scaling.original_max_position_embeddings =
        get_or<int>(r, "original_max_position_embeddings", 4096, o);
    c.rope_scaling.truncate = get_or<bool>(r, "truncate", true, o);
    if (r.contains("rope_theta")) c.rope_theta = get_field<float>(r, "rope_theta", o);
    if (!(c.rope_scaling.factor >= 1.0f)) fail("{}: field 'factor' must be >= 1, got {}", o, c.rope_scaling.factor);
    if (!(c.rope_scaling.beta_fast > c.rope_scaling.beta_slow))
      fail("{}: beta_fast {} must exceed beta_slow {}", o, c.rope_scaling.beta_fast, c.rope_scaling.beta_slow);
    require_positive(c.rope_scaling.original_max_position_embeddings, "original_max_position_embeddings", o);
  }

  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    const auto& q = j["quantization_config"];
    std::string method = q.is_object() ? q.value("quant_method", std::string()) : std::string();
    if (method != "mxfp4")
      fail("{}: field 'quantization_config.quant_method' is '{}', only 'mxfp4' is supported", origin, method);
  }

  // eos: generation_config wins (it carries <|call|> too).
  if (j.contains("eos_token_id")) {
    const auto& e = j["eos_token_id"];
    if (e.is_number_integer()) c.eos_token_ids = {e.get<int>()};
    else if (e.is_array()) for (auto& x : e) c.eos_token_ids.push_back(x.get<int>());
  }
  if (!gen_text.empty()) {
    json g;
    try {
      g = json::parse(gen_text);
    } catch (const json::exception& e) {
      fail("{} (generation_config.json): invalid JSON: {}", origin, e.what());
    }
    if (g.contains("eos_token_id")) {
      const auto& e = g["eos_token_id"];
      c.eos_token_ids.clear();
      if (e.is_number_integer()) c.eos_token_ids = {e.get<int>()};
      else if (e.is_array()) for (auto& x : e) {
          if (!x.is_number_integer()) fail("generation_config.json: eos_token_id entry {} is not an integer", x.dump());
          c.eos_token_ids.push_back(x.get<int>());
        }
      else fail("generation_config.json: field 'eos_token_id' has the wrong type: {}", e.dump());
    }
    if (g.contains("bos_token_id") && g["bos_token_id"].is_number_integer()) c.bos_token_id = g["bos_token_id"];
    if (g.contains("pad_token_id") && g["pad_token_id"].is_number_integer()) c.pad_token_id = g["pad_token_id"];
  }
  for (int id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size) fail("{}: eos_token_id {} is outside the vocabulary [0, {})", origin, id, c.vocab_size);
  return c;
}

ModelConfig load_model_config(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) fail("model directory {} does not exist", dir);
  std::string cfg_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(cfg_path)) fail("{} not found", cfg_path);
  std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  std::string gen = fs::exists(gen_path) ? read_text_file(gen_path) : std::string();
  return parse_model_config(read_text_file(cfg_path), gen, cfg_path);
}

ModelConfig preset_config(const std::string& name) {
  ModelConfig c;
  c.hidden_size = 2880;
  c.num_heads = 64;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.intermediate_size = 2880;
  c.experts_per_token = 4;
  c.vocab_size = 201088;
  c.sliding_window = 128;
  c.rope_theta = 150000.0f;
  c.rope_scaling = RopeScaling{};
  c.max_position_embeddings = 131072;
  c.eos_token_ids = {200002, 199999, 200012};
  c.pad_token_id = 199999;
  c.bos_token_id = 199998;
  if (name == "120b") {
    c.num_layers = 36;
    c.num_experts = 128;
  } else if (name == "20b") {
    c.num_layers = 24;
    c.num_experts = 32;
  } else if (name == "tiny") {
    // Small enough for CPU tests in seconds, but every structural feature is present:
    // GQA 8:1, sliding + full layers, top-4 routing over more experts than k, MXFP4 blocks.
    c.num_layers = 2;
    c.hidden_size = 64;
    c.num_heads = 8;
    c.num_kv_heads = 1;
    c.head_dim = 16;
    c.intermediate_size = 64;
    c.num_experts = 8;
    c.sliding_window = 4;
  } else if (name == "mini") {
    // The GPU engine's test model: real head_dim (64) and GQA group (8) so the prefill kernels run,
    // small enough for the CPU reference; a short window so test prompts cross it.
    c.num_layers = 4;
    c.hidden_size = 256;
    c.num_heads = 16;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.intermediate_size = 192;
    c.num_experts = 16;
    c.sliding_window = 16;
  } else {
    fail("unknown preset '{}' (120b|20b|mini|tiny)", name);
  }
  c.layer_is_sliding.assign(c.num_layers, 0);
  for (int i = 0; i < c.num_layers; ++i) c.layer_is_sliding[i] = (i % 2 == 0);
  return c;
}

std::string model_config_to_json(const ModelConfig& c) {
  json j;
  j["architectures"] = {"GptOssForCausalLM"};
  j["model_type"] = "gpt_oss";
  j["attention_bias"] = true;
  j["attention_dropout"] = 0.0;
  j["eos_token_id"] = 200002;
  j["pad_token_id"] = c.pad_token_id;
  j["experts_per_token"] = c.experts_per_token;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["initial_context_length"] = c.rope_scaling.original_max_position_embeddings;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = c.intermediate_size;
  json lt = json::array();
  for (int i = 0; i < c.num_layers; ++i) lt.push_back(c.layer_is_sliding[i] ? "sliding_attention" : "full_attention");
  j["layer_types"] = lt;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["num_attention_heads"] = c.num_heads;
  j["num_experts_per_tok"] = c.experts_per_token;
  j["num_hidden_layers"] = c.num_layers;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["num_local_experts"] = c.num_experts;
  j["output_router_logits"] = false;
  j["quantization_config"] = {{"modules_to_not_convert",
                               {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}},
                              {"quant_method", "mxfp4"}};
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_scaling"] = {{"beta_fast", c.rope_scaling.beta_fast},
                       {"beta_slow", c.rope_scaling.beta_slow},
                       {"factor", c.rope_scaling.factor},
                       {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings},
                       {"rope_type", "yarn"},
                       {"truncate", c.rope_scaling.truncate}};
  j["rope_theta"] = c.rope_theta;
  j["router_aux_loss_coef"] = 0.9;
  j["sliding_window"] = c.sliding_window;
  j["swiglu_limit"] = c.swiglu_limit;
  j["tie_word_embeddings"] = false;
  j["transformers_version"] = "4.55.0.dev0";
  j["use_cache"] = true;
  j["vocab_size"] = c.vocab_size;
  return j.dump(2) + "\n";
}

std::string generation_config_to_json(const ModelConfig& c) {
  json g;
  g["bos_token_id"] = c.bos_token_id;
  g["do_sample"] = true;
  g["eos_token_id"] = c.eos_token_ids;
  g["pad_token_id"] = c.pad_token_id;
  g["transformers_version"] = "4.55.0.dev0";
  return g.dump(2) + "\n";
}

}  // namespace mx
