// gpt-oss model configuration, parsed once from config.json + generation_config.json
// (or built from a preset), then passed by const reference everywhere.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mx {

struct RopeScaling {
  float factor = 32.0f;            // YaRN s
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int original_max_position_embeddings = 4096;
  bool truncate = false;           // gpt-oss ships false: do not round the ramp bounds
};

struct ModelConfig {
  int num_layers = 0;
  int hidden_size = 0;             // d_model (2880)
  int num_heads = 0;               // query heads (64)
  int num_kv_heads = 0;            // (8)
  int head_dim = 0;                // (64)
  int intermediate_size = 0;       // per-expert FFN width I (2880)
  int num_experts = 0;             // 128 (120b) / 32 (20b)
  int experts_per_token = 0;       // top-k (4)
  int vocab_size = 0;              // embedding / lm_head rows (201088)
  int sliding_window = 0;          // 128
  std::vector<uint8_t> layer_is_sliding;  // [num_layers], from layer_types
  float rope_theta = 0.0f;         // 150000
  RopeScaling rope_scaling;
  float swiglu_limit = 7.0f;
  float swiglu_alpha = 1.702f;     // not in the hub config; constant of the model
  float rms_norm_eps = 1e-5f;
  int max_position_embeddings = 0; // 131072
  bool tie_word_embeddings = false;
  std::vector<int> eos_token_ids;  // generation_config eos list (or config eos)
  int pad_token_id = -1;
  int bos_token_id = -1;

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  int qkv_dim() const { return q_dim() + 2 * kv_dim(); }

  // The KV array each layer uses: the j-th full-attention layer and the j-th sliding-window layer
  // share array j, since a KV block is a page of one kind or the other (model_runner.h).
  std::vector<int> kv_array_of_layers() const {
    std::vector<int> a(layer_is_sliding.size());
    int full = 0, sliding = 0;
    for (size_t l = 0; l < a.size(); ++l) a[l] = layer_is_sliding[l] ? sliding++ : full++;
    return a;
  }
};

// Reads DIR/config.json and (if present) DIR/generation_config.json. Unknown architecture,
// a missing required field or an inconsistent value is an mx::Error naming the field and value.
ModelConfig load_model_config(const std::string& dir);

// Parses config.json text (generation_config text may be empty). `origin` names the source
// in error messages.
ModelConfig parse_model_config(const std::string& config_json, const std::string& generation_json,
                               const std::string& origin);

// Presets: "120b", "20b", "tiny" (a small shape for tests: 2 layers, hidden 64, 4 experts).
// Throws on an unknown name.
ModelConfig preset_config(const std::string& name);

// The config.json / generation_config.json text that load_model_config reads back into `cfg`.
std::string model_config_to_json(const ModelConfig& cfg);
std::string generation_config_to_json(const ModelConfig& cfg);

}  // namespace mx
