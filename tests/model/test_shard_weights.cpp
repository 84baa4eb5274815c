// Tensor-parallel shards of the weights (model/shard_weights.h) on the mini fixture split over 2 ranks:
// each shard's head rows and vocabulary rows are the model's, and the partial o-proj and expert outputs
// of the shards sum to the model's (within double rounding).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <system_error>

#include <unistd.h>

#include "core/bf16.h"
#include "core/mxfp4.h"
#include "model/checkpoint.h"
#include "model/fixture.h"
#include "model/shard_weights.h"

namespace {
using namespace mx;

struct Mini {
  ModelConfig cfg;
  Checkpoint ck;
  ModelWeights w;
};

Mini& mini() {
  static Mini* m = [] {
    namespace fs = std::filesystem;
    const std::string dir = (fs::temp_directory_path() / "mx_shard_mini").string();
    if (!fs::exists(dir + "/config.json")) {  // ctest runs the two tests at once: write aside, then rename
      FixtureOptions fo;
      fo.preset = "mini";
      fo.seed = 3;
      fo.out_dir = dir + "." + std::to_string(::getpid());
      write_fixture(fo);
      std::error_code ec;
      fs::rename(fo.out_dir, dir, ec);
      if (ec) fs::remove_all(fo.out_dir);  // the other test's copy won
    }
    const ModelConfig cfg = load_model_config(dir);
    auto* p = new Mini{cfg, Checkpoint::open(dir), {}};
    p->w = bind_weights(p->ck, p->cfg);
    return p;
  }();
  return *m;
}

double bf(uint16_t v) { return bf16_to_f32(v); }

// y = W . x + b for bf16 W [rows, cols] (b may be null).
std::vector<double> gemv(const uint16_t* W, const uint16_t* b, const std::vector<double>& x, size_t rows, size_t cols) {
  std::vector<double> y(rows);
  for (size_t r = 0; r < rows; ++r) {
    double s = b ? bf(b[r]) : 0;
    for (size_t k = 0; k < cols; ++k) s += bf(W[r * cols + k]) * x[k];
    y[r] = s;
  }
  return y;
}

// The same for one MXFP4 expert matrix [rows, cols].
std::vector<double> gemv_mxfp4(const uint8_t* blocks, const uint8_t* scales, const uint16_t* b,
                               const std::vector<double>& x, size_t rows, size_t cols) {
  std::vector<double> y(rows);
  std::vector<float> row(cols);
  for (size_t r = 0; r < rows; ++r) {
    mxfp4_decode_row(blocks + r * cols / 2, scales + r * cols / 32, int(cols), row.data());
    double s = b ? bf(b[r]) : 0;
    for (size_t k = 0; k < cols; ++k) s += row[k] * x[k];
    y[r] = s;
  }
  return y;
}

std::vector<double> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-9 * (1 + std::fabs(want[i]))) << what << " " << i;
}

void check_split(MoeSplit moe) {
  const Mini& m = mini();
  const ModelConfig& c = m.cfg;
  const int size = 2;
  const size_t H = size_t(c.hidden_size), D = size_t(c.head_dim), I = size_t(c.intermediate_size);
  const size_t q_dim = size_t(c.num_heads) * D;
  const LayerWeights& L = m.w.layers[1];
  const auto attn = random_vec(q_dim, 1), act = random_vec(I, 2), h = random_vec(H, 3);
  const auto o_full = gemv(L.o_w, L.o_b, attn, H, q_dim);
  const int e = 5;  // an expert of rank 1 under kExperts
  const auto down_full = gemv_mxfp4(L.down_blocks + e * H * I / 2, L.down_scales + e * H * I / 32,
                                    L.down_bias + e * H, act, H, I);
  const auto up_full = gemv_mxfp4(L.gate_up_blocks + e * 2 * I * H / 2, L.gate_up_scales + e * 2 * I * H / 32,
                                  L.gate_up_bias + e * 2 * I, h, 2 * I, H);
  std::vector<double> o_sum(H, 0), down_sum(H, 0);
  int vocab = 0;
  for (int r = 0; r < size; ++r) {
    const ShardDims d = shard_dims(c, r, size, moe);
    const ShardWeights s = shard_weights(m.w, c, d, moe, r == 0);
    const LayerWeights& S = s.weights.layers[1];
    EXPECT_EQ(s.cfg.num_heads, c.num_heads / size);
    // Head rows and sinks are the model's.
    const size_t q0 = size_t(d.q_heads.begin) * D, k0 = size_t(d.kv_heads.begin) * D;
    for (size_t i = 0; i < size_t(d.q_heads.count) * D * H; ++i) ASSERT_EQ(S.q_w[i], L.q_w[q0 * H + i]);
    for (size_t i = 0; i < size_t(d.kv_heads.count) * D * H; ++i) {
      ASSERT_EQ(S.k_w[i], L.k_w[k0 * H + i]);
      ASSERT_EQ(S.v_w[i], L.v_w[k0 * H + i]);
    }
    for (int i = 0; i < d.q_heads.count; ++i) ASSERT_EQ(S.sinks[i], L.sinks[d.q_heads.begin + i]);
    for (size_t i = 0; i < size_t(d.vocab.count) * H; ++i)
      ASSERT_EQ(s.weights.lm_head[i], m.w.lm_head[size_t(d.vocab.begin) * H + i]);
    vocab += d.vocab.count;
    // o-proj: this rank's heads' columns against its slice of the attention output.
    const std::vector<double> a(attn.begin() + long(q0), attn.begin() + long(q0 + size_t(d.q_heads.count) * D));
    const auto o = gemv(S.o_w, S.o_b, a, H, a.size());
    for (size_t i = 0; i < H; ++i) o_sum[i] += o[i];
    if (moe == MoeSplit::kIntermediate) {
      const size_t i0 = size_t(d.inter.begin), in = size_t(d.inter.count);
      const std::vector<double> act_r(act.begin() + long(i0), act.begin() + long(i0 + in));
      const auto dn = gemv_mxfp4(S.down_blocks + e * H * in / 2, S.down_scales + e * H * in / 32, S.down_bias + e * H,
                                 act_r, H, in);
      for (size_t i = 0; i < H; ++i) down_sum[i] += dn[i];
      const auto up = gemv_mxfp4(S.gate_up_blocks + e * 2 * in * H / 2, S.gate_up_scales + e * 2 * in * H / 32,
                                 S.gate_up_bias + e * 2 * in, h, 2 * in, H);
      expect_near(up, std::vector<double>(up_full.begin() + long(2 * i0), up_full.begin() + long(2 * (i0 + in))), "fc1 rows");
    } else if (e >= d.experts.begin && e < d.experts.begin + d.experts.count) {
      const size_t j = size_t(e - d.experts.begin);
      down_sum = gemv_mxfp4(S.down_blocks + j * H * I / 2, S.down_scales + j * H * I / 32, S.down_bias + j * H, act, H, I);
      const auto up = gemv_mxfp4(S.gate_up_blocks + j * 2 * I * H / 2, S.gate_up_scales + j * 2 * I * H / 32,
                                 S.gate_up_bias + j * 2 * I, h, 2 * I, H);
      expect_near(up, up_full, "fc1 of the rank's expert");
    }
  }
  EXPECT_EQ(vocab, c.vocab_size);
  expect_near(o_sum, o_full, "o-proj partial sums");
  expect_near(down_sum, down_full, "expert output");
}

TEST(ShardWeights, IntermediateSplitSumsToTheModel) { check_split(MoeSplit::kIntermediate); }
TEST(ShardWeights, ExpertSplitHoldsWholeExperts) { check_split(MoeSplit::kExperts); }

}  // namespace
