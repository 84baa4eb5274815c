// config.json parsing: the hub configs round-trip, and each bad field is named with its value.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"

namespace {
std::string err(const std::string& cfg) {
  try {
    mx::parse_model_config(cfg, "", "config.json");
  } catch (const mx::Error& e) {
    return e.what();
  }
  return "";
}
std::string with(const char* key, nlohmann::json value) {
  auto j = nlohmann::json::parse(mx::model_config_to_json(mx::preset_config("120b")));
  if (value.is_null()) j.erase(key);
  else j[key] = value;
  return j.dump();
}
}  // namespace

TEST(Config, PresetsRoundTrip) {
  for (const char* p : {"120b", "20b", "tiny"}) {
    mx::ModelConfig a = mx::preset_config(p);
    mx::ModelConfig b = mx::parse_model_config(mx::model_config_to_json(a), mx::generation_config_to_json(a), p);
    EXPECT_EQ(a.num_layers, b.num_layers);
    EXPECT_EQ(a.num_experts, b.num_experts);
    EXPECT_EQ(a.layer_is_sliding, b.layer_is_sliding);
    EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
    EXPECT_FLOAT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
    EXPECT_FALSE(b.rope_scaling.truncate);
  }
  mx::ModelConfig c = mx::preset_config("120b");
  EXPECT_EQ(c.num_layers, 36);
  EXPECT_EQ(c.qkv_dim(), 5120);
  EXPECT_TRUE(c.layer_is_sliding[0]);
  EXPECT_FALSE(c.layer_is_sliding[1]);
}

TEST(Config, BadFieldsAreNamed) {
  EXPECT_NE(err("{").find("invalid JSON"), std::string::npos);
  EXPECT_NE(err(with("model_type", "llama")).find("'model_type' is 'llama'"), std::string::npos);
  EXPECT_NE(err(with("hidden_size", nullptr)).find("missing field 'hidden_size'"), std::string::npos);
  EXPECT_NE(err(with("hidden_size", "big")).find("'hidden_size' has the wrong type"), std::string::npos);
  EXPECT_NE(err(with("num_hidden_layers", 0)).find("'num_hidden_layers' must be positive, got 0"), std::string::npos);
  EXPECT_NE(err(with("num_key_value_heads", 7)).find("not a multiple"), std::string::npos);
  EXPECT_NE(err(with("num_experts_per_tok", 200)).find("exceeds"), std::string::npos);
  EXPECT_NE(err(with("layer_types", nlohmann::json::array({"full_attention"}))).find("'layer_types'"), std::string::npos);
  EXPECT_NE(err(with("rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}})).find("expected 'yarn'"), std::string::npos);
  EXPECT_NE(err(with("hidden_size", 100)).find("multiple of 32"), std::string::npos);
  EXPECT_NE(err(with("tie_word_embeddings", true)).find("tie_word_embeddings"), std::string::npos);
  EXPECT_NE(err(with("quantization_config", {{"quant_method", "gptq"}})).find("'gptq'"), std::string::npos);
}

TEST(Config, GenerationConfigEosWins) {
  auto c = mx::parse_model_config(mx::model_config_to_json(mx::preset_config("20b")),
                                  R"({"eos_token_id":[200002,199999,200012],"bos_token_id":199998})", "x");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{200002, 199999, 200012}));
  EXPECT_EQ(c.bos_token_id, 199998);
  EXPECT_THROW(mx::parse_model_config(mx::model_config_to_json(mx::preset_config("20b")), "{", "x"), mx::Error);
}
