// Safetensors header validation and checkpoint loading: every damaged input gives one mx::Error
// line that names the problem and the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/fixture.h"
#include "model/weights.h"
#include "safetensors_builder.h"

namespace fs = std::filesystem;
using mx::test::build_safetensors;
using nlohmann::ordered_json;

namespace {

std::string parse_error(const std::string& bytes) {
  try {
    mx::parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "x.safetensors");
  } catch (const mx::Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << "error must be one line: " << m;
    EXPECT_NE(m.find("x.safetensors"), std::string::npos) << "error must name the file: " << m;
    return m;
  }
  return "";
}

ordered_json two_tensors() {
  ordered_json h;
  h["__metadata__"] = {{"format", "pt"}};
  h["a"] = {{"dtype", "BF16"}, {"shape", {2, 3}}, {"data_offsets", {0, 12}}};
  h["b"] = {{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", {12, 16}}};
  return h;
}

}  // namespace

TEST(Safetensors, ParsesValidFile) {
  std::string f = build_safetensors(two_tensors().dump(), 16);
  auto v = mx::parse_safetensors(reinterpret_cast<const uint8_t*>(f.data()), f.size(), "x");
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].name, "a");
  EXPECT_EQ(v[0].nbytes, 12u);
  EXPECT_EQ(v[1].shape, std::vector<int64_t>{4});
}

TEST(Safetensors, RejectsDamagedHeaders) {
  struct Case {
    const char* what;
    std::string bytes;
    const char* expect;
  };
  auto with = [](auto edit, uint64_t data = 16) {
    ordered_json h = two_tensors();
    edit(h);
    return build_safetensors(h.dump(), data);
  };
  std::string valid = build_safetensors(two_tensors().dump(), 16);
  std::string huge = valid;
  huge[5] = '\x7f';
  std::vector<Case> cases = {
      {"too small", "abc", "too small"},
      {"header length huge", huge, "exceeds"},
      {"header past EOF", valid.substr(0, 20), "runs past the end"},
      {"bad json", build_safetensors("{\"a\": ", 0), "not valid JSON"},
      {"not an object", build_safetensors("[1,2]", 0), "must be a JSON object"},
      {"unknown dtype", with([](auto& h) { h["a"]["dtype"] = "Q4"; }), "unknown dtype"},
      {"size mismatch", with([](auto& h) { h["a"]["shape"] = {2, 2}; }), "data_offsets span"},
      {"reversed", with([](auto& h) { h["b"]["data_offsets"] = {16, 12}; }), "reversed"},
      {"out of range", with([](auto& h) { h["b"]["data_offsets"] = {12, 20}; h["b"]["shape"] = {8}; }), "run past the data"},
      {"overlap", with([](auto& h) { h["b"]["data_offsets"] = {8, 12}; }, 12), "overlap"},
      {"gap", with([](auto& h) { h["b"]["data_offsets"] = {14, 18}; }, 18), "gap"},
      {"trailing bytes", with([](auto&) {}, 20), "not described"},
      {"negative dim", with([](auto& h) { h["a"]["shape"] = {-2, 3}; }), "non-negative"},
      {"unknown field", with([](auto& h) { h["a"]["extra"] = 1; }), "unknown field"},
      {"metadata not strings", with([](auto& h) { h["__metadata__"]["n"] = 3; }), "not a string"},
      {"overflowing shape", with([](auto& h) { h["a"]["shape"] = {1ull << 40, 1ull << 40}; }), "overflows"},
      {"duplicate name", build_safetensors(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2), "duplicate"},
  };
  for (const auto& c : cases) {
    std::string m = parse_error(c.bytes);
    EXPECT_NE(m.find(c.expect), std::string::npos) << c.what << ": got '" << m << "'";
  }
}

class TinyCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(std::string(MXSERVE_ASSET_DIR) + "/tokenizer/tokenizer.json"))
      GTEST_SKIP() << "run scripts/setup.sh first (tokenizer asset missing)";
    dir_ = (fs::temp_directory_path() / ("mxserve-ckpt-" + std::to_string(::getpid()))).string();
    mx::FixtureOptions o;
    o.out_dir = dir_;
    o.max_shard_bytes = 20 << 20;  // several shards
    mx::write_fixture(o);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const mx::Error& e) {
      return e.what();
    }
    return "";
  }
  std::string dir_;
};

TEST_F(TinyCheckpoint, LoadsShardedFixture) {
  mx::ModelConfig cfg = mx::load_model_config(dir_);
  mx::Checkpoint ck = mx::Checkpoint::open(dir_);
  EXPECT_EQ(ck.tensors().size(), mx::expected_tensors(cfg).size());
  mx::ModelWeights w = mx::bind_weights(ck, cfg);
  EXPECT_EQ(w.layers.size(), size_t(cfg.num_layers));
  EXPECT_TRUE(fs::exists(fs::path(dir_) / "model-00002-of-00002.safetensors"));
}

TEST_F(TinyCheckpoint, WrongShapeNamesTensorShapesAndFile) {
  mx::ModelConfig cfg = mx::load_model_config(dir_);
  cfg.num_experts = 16;
  mx::Checkpoint ck = mx::Checkpoint::open(dir_);
  std::string m = error_of([&] { ck.validate(cfg); });
  EXPECT_NE(m.find("model.layers.0.mlp.router.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("[16, 64]"), std::string::npos) << m;
  EXPECT_NE(m.find("[8, 64]"), std::string::npos) << m;
  EXPECT_NE(m.find(".safetensors"), std::string::npos) << m;
}

TEST_F(TinyCheckpoint, MissingTensorIsNamed) {
  mx::ModelConfig cfg = mx::load_model_config(dir_);
  cfg.num_layers = 3;
  cfg.layer_is_sliding.push_back(1);
  mx::Checkpoint ck = mx::Checkpoint::open(dir_);
  std::string m = error_of([&] { ck.validate(cfg); });
  EXPECT_NE(m.find("model.layers.2.input_layernorm.weight is missing"), std::string::npos) << m;
}

TEST_F(TinyCheckpoint, TruncatedShardIsAnError) {
  fs::path shard = fs::path(dir_) / "model-00001-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 1000);
  std::string m = error_of([&] { mx::Checkpoint::open(dir_); });
  EXPECT_NE(m.find("model-00001-of-00002.safetensors"), std::string::npos) << m;
}

TEST_F(TinyCheckpoint, IndexNamingMissingShard) {
  fs::remove(fs::path(dir_) / "model-00002-of-00002.safetensors");
  std::string m = error_of([&] { mx::Checkpoint::open(dir_); });
  EXPECT_NE(m.find("does not exist"), std::string::npos) << m;
}

TEST_F(TinyCheckpoint, BadIndexJsonAndMissingDir) {
  std::ofstream(fs::path(dir_) / "model.safetensors.index.json") << "{\"weight_map\": ";
  EXPECT_NE(error_of([&] { mx::Checkpoint::open(dir_); }).find("invalid JSON"), std::string::npos);
  EXPECT_NE(error_of([&] { mx::Checkpoint::open(dir_ + "/nope"); }).find("does not exist"), std::string::npos);
}

TEST_F(TinyCheckpoint, SameSeedSameBytesOtherSeedDiffers) {
  auto read = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  std::string d2 = dir_ + "-b", d3 = dir_ + "-c";
  mx::FixtureOptions o;
  o.out_dir = d2;
  o.max_shard_bytes = 20 << 20;
  mx::write_fixture(o);
  o.out_dir = d3;
  o.seed = 1;
  mx::write_fixture(o);
  for (auto name : {"model-00000-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"})
    EXPECT_EQ(read(fs::path(dir_) / name), read(fs::path(d2) / name)) << name;
  EXPECT_NE(read(fs::path(dir_) / "model-00001-of-00002.safetensors"), read(fs::path(d3) / "model-00001-of-00002.safetensors"));
  fs::remove_all(d2);
  fs::remove_all(d3);
}
