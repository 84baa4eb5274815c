// --mxfp4-layers / --fp8-layers (model/dense_quant.h): the flags' parsing and the CPU reference's
// rounding of the chosen tensors at load.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/bf16.h"
#include "core/dense_quant.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/dense_quant.h"
#include "model/fixture.h"
#include "model/weights.h"

namespace mx {
namespace {

TEST(DenseQuantFlags, ParseListsAllAndNone) {
  EXPECT_FALSE(parse_dense_quant("none", "none").any());
  const DenseQuant a = parse_dense_quant("all", "none");
  EXPECT_EQ(a.describe(), "qkv mxfp4, o mxfp4, lm_head mxfp4");
  const DenseQuant b = parse_dense_quant("qkv,o", "lm_head");
  EXPECT_EQ(b.describe(), "qkv mxfp4, o mxfp4, lm_head fp8");
  EXPECT_EQ(parse_dense_quant("none", "o").describe(), "qkv bf16, o fp8, lm_head bf16");
}

TEST(DenseQuantFlags, BadValuesFailWithTheFlagsName) {
  auto message = [](const char* m, const char* f) {
    try {
      parse_dense_quant(m, f);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message("qkv,x", "none").find("--mxfp4-layers"), std::string::npos);
  EXPECT_NE(message("", "none").find("--mxfp4-layers"), std::string::npos);
  EXPECT_NE(message("none", "o,").find("--fp8-layers"), std::string::npos);
  EXPECT_NE(message("none", "qkv,,o").find("unknown layer"), std::string::npos);
  EXPECT_NE(message("qkv", "all").find("also in --mxfp4-layers"), std::string::npos);
}

TEST(DenseQuantLoad, ChosenTensorsAreRoundedCopiesOthersUntouched) {
  const std::string dir = (std::filesystem::temp_directory_path() / "mx_dense_quant_tiny").string();
  if (!std::filesystem::exists(dir + "/config.json")) {
    FixtureOptions fo;
    fo.out_dir = dir;
    write_fixture(fo);
  }
  const ModelConfig cfg = load_model_config(dir);
  const Checkpoint ck = Checkpoint::open(dir);
  const ModelWeights orig = bind_weights(ck, cfg);
  ModelWeights w = orig;
  std::vector<std::vector<uint16_t>> copies;
  apply_dense_quant(parse_dense_quant("qkv", "lm_head"), cfg, w, copies);
  EXPECT_NE(w.layers[0].q_w, orig.layers[0].q_w);
  EXPECT_EQ(w.layers[0].o_w, orig.layers[0].o_w);  // o stays bf16
  EXPECT_NE(w.lm_head, orig.lm_head);
  const int H = cfg.hidden_size;
  std::vector<float> row(static_cast<size_t>(H)), again;
  for (int r = 0; r < 3; ++r) {  // a rounded row is its own rounding, and within the format's step
    for (int c = 0; c < H; ++c) row[size_t(c)] = bf16_to_f32(w.layers[0].q_w[size_t(r) * H + size_t(c)]);
    again = row;
    mxfp4_round_row(again.data(), H);
    EXPECT_EQ(again, row);
    for (int c = 0; c < H; ++c) row[size_t(c)] = bf16_to_f32(w.lm_head[size_t(r) * H + size_t(c)]);
    again = row;
    fp8_round_row(again.data(), H);
    EXPECT_EQ(again, row);
  }
}

}  // namespace
}  // namespace mx
