// Fixture writer: pinned bytes (a hash of the tiny fixture, so a change to the generator or
// the header layout is noticed), and value statistics that keep activations finite.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "core/bf16.h"
#include "core/error.h"
#include "core/mxfp4.h"
#include "model/checkpoint.h"
#include "model/fixture.h"
#include "model/weights.h"

namespace fs = std::filesystem;

namespace {

// FNV-1a 64 over the file bytes: enough to pin content, no dependency.
uint64_t fnv1a(const fs::path& p, uint64_t h = 0xcbf29ce484222325ull) {
  std::ifstream f(p, std::ios::binary);
  char buf[1 << 16];
  while (f) {
    f.read(buf, sizeof buf);
    for (std::streamsize i = 0; i < f.gcount(); ++i) h = (h ^ uint8_t(buf[i])) * 0x100000001b3ull;
  }
  return h;
}

struct Stats {
  double mean = 0, std = 0;
};
template <class F>
Stats stats(size_t n, F value) {
  double s = 0, s2 = 0;
  for (size_t i = 0; i < n; ++i) {
    double v = value(i);
    s += v;
    s2 += v * v;
  }
  Stats r;
  r.mean = s / double(n);
  r.std = std::sqrt(std::max(0.0, s2 / double(n) - r.mean * r.mean));
  return r;
}

class TinyFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(std::string(MXSERVE_ASSET_DIR) + "/tokenizer/tokenizer.json"))
      GTEST_SKIP() << "run scripts/setup.sh first (tokenizer asset missing)";
    dir_ = (fs::temp_directory_path() / ("mxserve-fixture-" + std::to_string(::getpid()))).string();
    mx::FixtureOptions o;
    o.out_dir = dir_;
    mx::write_fixture(o);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string dir_;
};

}  // namespace

TEST_F(TinyFixture, BytesArePinned) {
  // Default options: one shard (tiny is ~0.3 MB), named with the HF "of LAST index" rule.
  fs::path shard = fs::path(dir_) / "model-00000-of-00000.safetensors";
  ASSERT_TRUE(fs::exists(shard));
  uint64_t h = fnv1a(fs::path(dir_) / "model.safetensors.index.json", fnv1a(shard));
  // Update only on a deliberate change of the generator; say so in the commit message.
  EXPECT_EQ(h, 0xed2b72adad16d019ull) << std::hex << "tiny fixture hash is 0x" << h;
}

TEST_F(TinyFixture, HeaderIsCanonical) {
  fs::path shard = fs::path(dir_) / "model-00000-of-00000.safetensors";
  std::ifstream f(shard, std::ios::binary);
  uint8_t len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  EXPECT_EQ(n % 8, 0u) << "header padded with spaces to a multiple of 8";
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find('\n'), std::string::npos);
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));
}

TEST_F(TinyFixture, ValueRangesKeepActivationsFinite) {
  mx::ModelConfig cfg = mx::load_model_config(dir_);
  mx::Checkpoint ck = mx::Checkpoint::open(dir_);
  mx::ModelWeights w = mx::bind_weights(ck, cfg);
  const int H = cfg.hidden_size, I = cfg.intermediate_size, E = cfg.num_experts;
  auto bf = [](const uint16_t* p) { return [p](size_t i) { return double(mx::bf16_to_f32(p[i])); }; };

  const auto& L = w.layers[0];
  Stats q = stats(size_t(cfg.q_dim()) * H, bf(L.q_w));
  EXPECT_NEAR(q.mean, 0.0, 0.02);
  EXPECT_NEAR(q.std, 1.0 / std::sqrt(double(H)), 0.1 / std::sqrt(double(H)));
  Stats o = stats(size_t(H) * cfg.q_dim(), bf(L.o_w));
  EXPECT_NEAR(o.std, 1.0 / std::sqrt(double(cfg.q_dim())), 0.1 / std::sqrt(double(cfg.q_dim())));
  Stats norm = stats(H, bf(L.attn_norm));
  EXPECT_NEAR(norm.mean, 1.0, 0.05);
  EXPECT_LT(norm.std, 0.2);
  Stats qb = stats(cfg.q_dim(), bf(L.q_b));
  EXPECT_LT(qb.std, 0.05);

  // MXFP4 experts: dequantized std ~ 1/sqrt(fan_in). Scales are powers of two, so allow a
  // factor sqrt(2) either way; every value must be finite (no scale byte 255).
  std::vector<float> row(size_t(std::max(H, I)));
  auto expert_std = [&](const uint8_t* blocks, const uint8_t* scales, int rows, int K) {
    double s2 = 0;
    size_t n = 0;
    for (int64_t r = 0; r < int64_t(E) * rows; ++r) {
      mx::mxfp4_decode_row(blocks + r * (K / 2), scales + r * (K / 32), K, row.data());
      for (int k = 0; k < K; ++k) {
        EXPECT_TRUE(std::isfinite(row[k]));
        s2 += double(row[k]) * row[k];
        ++n;
      }
    }
    return std::sqrt(s2 / double(n));
  };
  double gu = expert_std(L.gate_up_blocks, L.gate_up_scales, 2 * I, H);
  double dn = expert_std(L.down_blocks, L.down_scales, H, I);
  EXPECT_GT(gu * std::sqrt(double(H)), 0.7) << gu;
  EXPECT_LT(gu * std::sqrt(double(H)), 1.42) << gu;
  EXPECT_GT(dn * std::sqrt(double(I)), 0.7) << dn;
  EXPECT_LT(dn * std::sqrt(double(I)), 1.42) << dn;
}

TEST(Fixture, OverridesAndBadOptions) {
  mx::FixtureOptions o;
  o.num_layers = 3;
  o.num_experts = 5;
  mx::ModelConfig c = mx::fixture_config(o);
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.num_experts, 5);
  ASSERT_EQ(c.layer_is_sliding.size(), 3u);
  EXPECT_TRUE(c.layer_is_sliding[0]);
  EXPECT_FALSE(c.layer_is_sliding[1]);
  o.num_experts = 2;  // fewer than top-k
  EXPECT_THROW(mx::fixture_config(o), mx::Error);
  mx::FixtureOptions t;
  t.tokenizer_dir = "/nonexistent";
  t.out_dir = (fs::temp_directory_path() / "mxserve-fixture-notok").string();
  try {
    mx::write_fixture(t);
    FAIL() << "expected an error";
  } catch (const mx::Error& e) {
    EXPECT_NE(std::string(e.what()).find("scripts/setup.sh"), std::string::npos) << e.what();
  }
  fs::remove_all(t.out_dir);
}
