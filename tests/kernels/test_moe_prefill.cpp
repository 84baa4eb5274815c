// Grouped MXFP4 MoE prefill (route -> FC1+SwiGLU -> FC2 -> combine) vs the double CPU reference.
// Routing is exact (data movement); the block output is bf16-level: x, W (exact MXFP4 in bf16) and the
// activation are bf16 with fp32 accumulation: per element |d| <= 2e-2 * (|ref| + rms(ref)), rel L2 < 1e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "core/bf16.h"
#include "kernels/moe_prefill/moe_prefill.h"
#include "tests/kernels/gpu_test_util.h"

namespace mx::cuda {
namespace {

using mx::test::to_dev;
template <class T>
T* dev(size_t n, int fill = 0xff) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
  cudaMemset(d, fill, std::max<size_t>(1, n) * sizeof(T));
  return d;
}

// tile_rows: 0 = the engine's choice for T (moe_prefill_tile_rows), else forced to 16 or 64 (bf16) or 16, 24, 64 or
// 128 (fp8).
// fp8: the FP8 path (moe_quant_fp8 + moe_fc1_fp8 + moe_fc2_fp8) on 16-, 24-, 64- or 128-row tiles.
// wide_scales: E8M0 scales over 31 octaves, so the FP8 path reads the groups more than 11 below their
// row's largest as zeros (docs/equivalence.md: under 2^-11 of the row's largest weights).
// ctas: the FP8 kernels' persistent grid, fewer CTAs than SMs so each walks many items.
struct Case { int T, E, H, I; bool skewed; int tile_rows = 0; bool fp8 = false; bool wide_scales = false; int ctas = 0; };

// The FP8 operands' k order: moe_fp8_value inverts moe_fp8_pos (exact, both ways, over 512 segments).
TEST(MoeFp8Order, ValueInvertsPos) {
  for (int v = 0; v < 128 * 512; ++v) ASSERT_EQ(moe_fp8_value(moe_fp8_pos(v)), v);
  for (int p = 0; p < 128 * 512; ++p) ASSERT_EQ(moe_fp8_pos(moe_fp8_value(p)), p);
}

// Each row's largest E8M0 scale (exact): rows of 1, 3, 45 and 90 groups, a row count off the block size.
TEST(MoeRowMaxScale, MatchesHost) {
  std::mt19937 g(3);
  std::uniform_int_distribution<int> byte(0, 255);
  for (const int G : {1, 3, 45, 90}) {
    const size_t rows = 1000 + G;
    std::vector<uint8_t> sc(rows * G);
    for (auto& x : sc) x = uint8_t(byte(g));
    std::vector<uint8_t> want(rows);
    for (size_t r = 0; r < rows; ++r) want[r] = *std::max_element(sc.begin() + r * G, sc.begin() + (r + 1) * G);
    uint8_t* d = to_dev(sc);
    uint8_t* out = dev<uint8_t>(rows);
    moe_row_max_scale(d, rows, G, out, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(mx::test::from_dev(out, rows), want) << "G = " << G;
    cudaFree(d);
    cudaFree(out);
  }
}

class MoePrefill : public ::testing::TestWithParam<Case> {};

TEST_P(MoePrefill, MatchesReference) {
  const Case c = GetParam();
  if (c.fp8 && !moe_fp8_available()) GTEST_SKIP() << "the FP8 MoE needs an sm_90 GPU";
  const int k = 4, H = c.H, I = c.I, E = c.E, T = c.T;
  std::mt19937 g(7);
  std::uniform_int_distribution<int> byte(0, 255), sc(c.wide_scales ? 100 : 118, c.wide_scales ? 130 : 122);
  std::uniform_real_distribution<float> u(-1, 1);
  auto rb = [&](size_t n) { std::vector<uint8_t> v(n); for (auto& x : v) x = uint8_t(byte(g)); return v; };
  auto rs = [&](size_t n) { std::vector<uint8_t> v(n); for (auto& x : v) x = uint8_t(sc(g)); return v; };
  auto rbf = [&](size_t n, float s) { std::vector<uint16_t> v(n); for (auto& x : v) { float f = u(g) * s; x = f32_to_bf16(f == 0 ? 0.01f : f); } return v; };
  auto b1 = rb(size_t(E) * 2 * I * H / 2), s1 = rs(size_t(E) * 2 * I * H / 32);
  auto b2 = rb(size_t(E) * H * I / 2), s2 = rs(size_t(E) * H * I / 32);
  auto bias1 = rbf(size_t(E) * 2 * I, 0.5f), bias2 = rbf(size_t(E) * H, 0.5f);
  auto x = rbf(size_t(T) * H, 1.f);
  // Routing: distinct experts per token; "skewed" sends most tokens to experts 0..5 and leaves most empty.
  std::vector<int32_t> idx(size_t(T) * k);
  std::vector<float> w(size_t(T) * k);
  for (int t = 0; t < T; ++t) {
    std::vector<int> pool(E);
    for (int e = 0; e < E; ++e) pool[e] = e;
    std::shuffle(pool.begin(), pool.end(), g);
    float sum = 0;
    for (int j = 0; j < k; ++j) {
      idx[t * k + j] = c.skewed ? (t % 9 == 0 ? E - 1 - j : j + (t % 3)) : pool[j];
      w[t * k + j] = 0.1f + std::fabs(u(g));
      sum += w[t * k + j];
    }
    for (int j = 0; j < k; ++j) w[t * k + j] /= sum;
  }
  std::vector<float> resid(size_t(T) * H);
  for (auto& r : resid) r = u(g);
  std::vector<float> ref = resid;
  moe_prefill_ref(b1.data(), s1.data(), bias1.data(), b2.data(), s2.data(), bias2.data(), x.data(), idx.data(),
                  w.data(), ref.data(), T, k, H, I, 1.702f, 7.0f);

  const int tile_rows = c.tile_rows ? c.tile_rows : moe_prefill_tile_rows(T, k, E);
  const int max_tiles = (T * k + tile_rows - 1) / tile_rows + E;
  if (!c.tile_rows) {
    EXPECT_EQ(max_tiles, moe_prefill_max_tiles(T, k, E));
  }
  EXPECT_LE(moe_prefill_max_tiles(T, k, E), moe_prefill_tile_bound(T, k, E));
  MoeRouteParams r;
  r.topk_idx = to_dev(idx); r.topk_w = to_dev(w); r.T = T; r.k = k; r.E = E;
  r.counts = dev<int32_t>(E); r.offsets = dev<int32_t>(E + 1); r.sorted_tok = dev<int32_t>(T * k);
  r.sorted_slot = dev<int32_t>(T * k); r.sorted_w = dev<float>(T * k); r.tile_expert = dev<int32_t>(max_tiles);
  r.tile_row0 = dev<int32_t>(max_tiles); r.num_tiles = dev<int32_t>(1); r.max_tiles = max_tiles;
  r.tile_rows = tile_rows;
  moe_route_prefill(r, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {  // routing is exact: stable per-expert order
    auto off = mx::test::from_dev(r.offsets, E + 1);
    auto slot = mx::test::from_dev(r.sorted_slot, T * k);
    std::vector<int> expect;
    for (int e = 0; e < E; ++e) {
      EXPECT_EQ(off[e], int(expect.size()));
      for (int i = 0; i < T * k; ++i) if (idx[i] == e) expect.push_back(i);
    }
    EXPECT_EQ(off[E], T * k);
    EXPECT_EQ(slot, expect);
    int tiles = 0;  // each expert's rows in tiles of tile_rows
    for (int e = 0; e < E; ++e) tiles += (off[e + 1] - off[e] + tile_rows - 1) / tile_rows;
    EXPECT_EQ(mx::test::from_dev(r.num_tiles, 1)[0], tiles);
  }
  MoeGemmPrefillParams f;
  f.sorted_tok = r.sorted_tok; f.sorted_slot = r.sorted_slot; f.sorted_w = r.sorted_w; f.offsets = r.offsets;
  f.tile_expert = r.tile_expert; f.tile_row0 = r.tile_row0; f.num_tiles = r.num_tiles; f.max_tiles = max_tiles;
  f.tile_rows = tile_rows; f.max_ctas = c.ctas;
  f.blocks = to_dev(b1); f.scales = to_dev(s1); f.bias = to_dev(bias1); f.x = to_dev(x);
  f.act = dev<uint16_t>(size_t(T) * k * I); f.N = 2 * I; f.K = H;
  uint8_t* xq = nullptr;
  float* xinv = nullptr;
  uint8_t *smax1 = nullptr, *smax2 = nullptr;  // the rows' largest scales (the engine finds them at load)
  if (c.fp8) {  // scratch filled with 0xff (e4m3 NaN): every byte a kernel reads must have been written
    xq = dev<uint8_t>(size_t(T) * moe_fp8_row_bytes(H));
    xinv = dev<float>(T);
    f.act_q = dev<uint8_t>(size_t(T) * k * moe_fp8_row_bytes(I));
    moe_quant_fp8(f.x, T, H, xq, xinv, nullptr);
    f.xq = xq; f.xinv = xinv;
    smax1 = dev<uint8_t>(size_t(E) * 2 * I);
    moe_row_max_scale(f.scales, size_t(E) * 2 * I, H / 32, smax1, nullptr);
    f.row_smax = smax1;
    moe_fc1_fp8(f, nullptr);
  } else {
    moe_fc1_prefill(f, nullptr);
  }
  MoeGemmPrefillParams f2 = f;
  f2.blocks = to_dev(b2); f2.scales = to_dev(s2); f2.bias = to_dev(bias2); f2.x = f.act; f2.xq = f.act_q;
  f2.y_slot = dev<float>(size_t(T) * k * H); f2.N = H; f2.K = I;
  if (c.fp8) {
    smax2 = dev<uint8_t>(size_t(E) * H);
    moe_row_max_scale(f2.scales, size_t(E) * H, I / 32, smax2, nullptr);
    f2.row_smax = smax2;
    moe_fc2_fp8(f2, nullptr);
  } else {
    moe_fc2_prefill(f2, nullptr);
  }
  float* dres = to_dev(resid);
  moe_combine_prefill(f2.y_slot, dres, T, k, H, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto got = mx::test::from_dev(dres, resid.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double dr = ref[i] - resid[i], dg = got[i] - resid[i];
    num += (dg - dr) * (dg - dr); den += dr * dr;
  }
  const double rms = std::sqrt(den / ref.size());
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double dr = ref[i] - resid[i], dg = got[i] - resid[i];
    if (!(std::fabs(dg - dr) <= 2e-2 * (std::fabs(dr) + rms))) ++bad;
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_LT(std::sqrt(num / den), 1e-2);
  for (void* p : {(void*)r.topk_idx, (void*)r.topk_w, (void*)r.counts, (void*)r.offsets, (void*)r.sorted_tok,
                  (void*)r.sorted_slot, (void*)r.sorted_w, (void*)r.tile_expert, (void*)r.tile_row0, (void*)r.num_tiles,
                  (void*)f.blocks, (void*)f.scales, (void*)f.bias, (void*)f.x, (void*)f.act, (void*)f2.blocks,
                  (void*)f2.scales, (void*)f2.bias, (void*)f2.y_slot, (void*)dres, (void*)xq, (void*)xinv,
                  (void*)f.act_q, (void*)smax1, (void*)smax2})
    cudaFree(p);
}

// Small hidden sizes keep the CPU reference quick; 2880 checks the real K/N tiling with few tokens.
// Both tile heights run every shape class: N not a multiple of the 192-row slab, K of 2..90 groups,
// tiles of 1..16 and 17+ rows.
INSTANTIATE_TEST_SUITE_P(Shapes, MoePrefill,
                         ::testing::Values(Case{1, 16, 256, 256, false}, Case{7, 32, 256, 256, false},
                                           Case{65, 32, 256, 320, false}, Case{333, 128, 128, 128, false},
                                           Case{333, 128, 128, 128, true}, Case{123, 16, 256, 192, false},
                                           Case{3, 8, 2880, 2880, false}, Case{65, 32, 256, 320, false, 16},
                                           Case{333, 128, 128, 128, true, 16}, Case{123, 16, 256, 192, false, 16},
                                           Case{37, 8, 384, 2880, false, 16}, Case{37, 8, 384, 2880, false, 64},
                                           Case{9, 8, 2880, 2880, false, 16}));

// The FP8 path on the same shape classes: K of 3..90 groups (full and partial 128-value segments:
// 256, 320, 192, 2880 = 22.5 segments, 1440 = 11.25), N not a multiple of the CTA (256 rows: 5,760 =
// 22.5 CTAs, 2,880 = 11.25, 640 = 2.5, 384 = 1.5; 128 rows: sparse_cta_warpgroups picks them up to 256 rows:
// 256, 192, 128), 1..16 (1..24) rows a tile.
INSTANTIATE_TEST_SUITE_P(Fp8, MoePrefill,
                         ::testing::Values(Case{1, 16, 256, 256, false, 16, true},
                                           Case{7, 32, 256, 320, false, 16, true},
                                           Case{65, 32, 256, 320, false, 16, true},
                                           Case{333, 128, 128, 128, true, 16, true},
                                           Case{123, 16, 256, 192, false, 16, true},
                                           Case{37, 8, 384, 2880, false, 16, true},
                                           Case{9, 8, 2880, 2880, false, 16, true},
                                           Case{24, 32, 2880, 2880, false, 16, true},
                                           Case{37, 8, 384, 1440, false, 16, true},  // 45 groups (odd): TP=2's FC2
                                           Case{9, 16, 256, 96, false, 16, true},  // 3 groups, a partial CTA
                                           Case{9, 8, 2880, 2880, false, 16, true, true},
                                           // sparse tiles on a few persistent CTAs: items across tiles, the
                                           // weight ring into the next item (S = 1 < kU in FC2 of the last)
                                           Case{24, 32, 2880, 2880, false, 16, true, false, 3},
                                           Case{65, 32, 256, 320, false, 16, true, false, 5},
                                           Case{37, 8, 384, 1440, false, 16, true, false, 4},
                                           Case{9, 16, 256, 96, false, 16, true, false, 2},
                                           // 24-row sparse tiles (every MMA width up to n48; B 141 KB at K
                                           // 2,880; experts split over tiles; few CTAs; two CTAs an SM at N 256)
                                           Case{32, 8, 2880, 2880, false, 24, true},
                                           Case{100, 8, 256, 320, false, 24, true},
                                           Case{333, 128, 128, 128, true, 24, true},
                                           Case{37, 8, 384, 1440, false, 24, true},
                                           Case{65, 32, 256, 320, false, 24, true, false, 5},
                                           Case{9, 16, 256, 96, false, 24, true, false, 2},
                                           // prefill tiles (128 rows: two sub-tiles of 64)
                                           Case{333, 128, 128, 128, true, 128, true},
                                           Case{65, 32, 256, 320, false, 128, true},
                                           Case{123, 16, 256, 192, false, 128, true},
                                           Case{37, 8, 384, 2880, false, 128, true},
                                           Case{300, 4, 256, 1440, false, 128, true},
                                           // ~50 and ~90 rows an expert: every MMA width (tiles of <= 32,
                                           // 48, 64, 80, 96 and 128 rows)
                                           Case{100, 8, 256, 320, false, 128, true},
                                           Case{180, 8, 256, 320, false, 128, true},
                                           // a few persistent CTAs, many items each (S = 1 in FC2 of the last)
                                           Case{300, 4, 256, 1440, false, 128, true, false, 3},
                                           Case{37, 8, 384, 2880, false, 128, true, false, 5},
                                           Case{200, 16, 256, 96, false, 128, true, false, 2},
                                           // 64-row tiles (one sub-tile, the B copier): tiles of <= 32,
                                           // 48 and 64 rows, experts split over tiles, few CTAs
                                           Case{100, 8, 256, 320, false, 64, true},
                                           Case{180, 8, 256, 320, false, 64, true},
                                           Case{333, 128, 128, 128, true, 64, true},
                                           Case{37, 8, 384, 2880, false, 64, true},
                                           Case{300, 4, 256, 1440, false, 64, true, false, 3},
                                           Case{200, 16, 256, 96, false, 64, true, false, 2}));

}  // namespace
}  // namespace mx::cuda
