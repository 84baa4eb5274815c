// Decode kernels (M <= 8 tokens) against CPU references. Label gpu.
// Tolerances: the GPU rounds staged activations to bf16 and accumulates in fp32 in another order, so
// the references round the same inputs to bf16 and accumulate in double; outputs must agree within
// 1e-5 of sum |w x| (+1e-6). bf16 outputs (KV cache, activations) within one bf16 ulp of the reference.
// MXFP4 decode is checked exact: one-hot activations make each output a single decoded weight.
// FP8 KV cache: a written value within half an E4M3 step (2^-4 relative, 2^-10 absolute near zero) of
// the reference plus the bf16 tolerance; attention reads the E4M3 values exactly (the reference
// widens the same bytes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/fp8.h"
#include "kernels/attention_decode/attention_decode.h"
#include "kernels/decode/decode_gemv.h"
#include "tests/kernels/dense_weight_util.h"
#include "tests/kernels/gpu_test_util.h"

namespace {
using namespace mx;
using namespace mx::test;

TEST(DecodeGemv, Bf16SmallMMatchesReferenceOddSizes) {
  std::mt19937 rng(1);
  for (auto [M, N, K] : {std::tuple{1, 7, 32}, std::tuple{3, 37, 96}, std::tuple{8, 129, 2880}, std::tuple{5, 200, 4096}}) {
    auto W = random_bf16(size_t(N) * K, rng), b = random_bf16(N, rng), x = random_bf16(size_t(M) * K, rng);
    DevBuf<uint16_t> dW(W), db(b), dx(x);
    DevBuf<float> dy(size_t(M) * N);
    dy.poison();
    cuda::bf16_gemv_small_m(dx.p, dW.p, db.p, dy.p, M, N, K, 0);
    auto y = dy.get();
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < N; ++r) {
        double ref = bf16_to_f32(b[r]), mag = 0;
        for (int k = 0; k < K; ++k) {
          const double t = double(bf16_to_f32(W[size_t(r) * K + k])) * bf16_to_f32(x[size_t(m) * K + k]);
          ref += t;
          mag += std::fabs(t);
        }
        ASSERT_NEAR(y[size_t(m) * N + r], ref, 1e-5 * mag + 1e-6) << M << "x" << N << "x" << K << " m=" << m << " r=" << r;
      }
  }
}

// Every weight format (the quantized values are exact in bf16: the same tolerance), odd sizes: H = 96 is a
// partial MXFP4 segment (3 groups of 32) and a partial FP8 one (6 chunks of 16).
TEST(DecodeGemv, LmHeadMatchesReferenceEveryFormat) {
  std::mt19937 rng(2);
  for (auto [M, V, H] : {std::tuple{2, 1000, 320}, std::tuple{7, 37, 96}, std::tuple{1, 77, 2880}})
    for (DenseFormat f : kDenseFormats) {
      auto W = random_bf16(size_t(V) * H, rng), x = random_bf16(size_t(M) * H, rng);
      const DenseTestWeight tw(f, W, V, H);
      DevBuf<uint16_t> dx(x);
      DevBuf<float> dy(size_t(M) * V);
      dy.poison();
      cuda::dense_lm_head(dx.p, tw.w, dy.p, M, V, H, 0);
      auto y = dy.get();
      for (int m = 0; m < M; ++m)
        for (int r = 0; r < V; ++r) {
          double ref = 0, mag = 0;
          for (int k = 0; k < H; ++k) {
            const double t = double(tw.values[size_t(r) * H + k]) * bf16_to_f32(x[size_t(m) * H + k]);
            ref += t;
            mag += std::fabs(t);
          }
          ASSERT_NEAR(y[size_t(m) * V + r], ref, 1e-5 * mag + 1e-6) << format_name(f) << " V=" << V << " H=" << H;
        }
    }
}

// rmsnorm(x + sum y_slot) -> bf16, as the staged activations of the GPU.
std::vector<float> ref_norm_bf16(const std::vector<float>& res, const std::vector<uint16_t>& g, int M, int H, float eps) {
  std::vector<float> out(size_t(M) * H);
  for (int m = 0; m < M; ++m) {
    double ss = 0;
    for (int k = 0; k < H; ++k) ss += double(res[size_t(m) * H + k]) * res[size_t(m) * H + k];
    const float inv = 1.0f / std::sqrt(float(ss / H) + eps);
    for (int k = 0; k < H; ++k) out[size_t(m) * H + k] = round_bf16(bf16_to_f32(g[k]) * (res[size_t(m) * H + k] * inv));
  }
  return out;
}

// prefetch: with the K / V L2 prefetch of the older keys (a hint: the outputs must not change).
void check_qkv(int M, int H, int Hq, int Hkv, int D, bool with_y, bool prefetch = false, bool fp8 = false,
               DenseFormat wf = DenseFormat::kBf16) {
  SCOPED_TRACE(format_name(wf));
  std::mt19937 rng(3 + D + M);
  const int N = (Hq + 2 * Hkv) * D, rows = 64;
  const float eps = 1e-5f;
  auto x = random_f32(size_t(M) * H, rng, -2, 2), y = random_f32(size_t(M) * 4 * H, rng, -0.5f, 0.5f);
  auto g = random_bf16(H, rng, 0.5f, 1.5f), Wb = random_bf16(size_t(N) * H, rng), b = random_bf16(N, rng);
  const DenseTestWeight tw(wf, Wb, N, H);
  const std::vector<float>& W = tw.values;
  std::vector<float> inv(D / 2);
  for (int i = 0; i < D / 2; ++i) inv[i] = std::pow(150000.f, -2.f * i / D);
  std::vector<int32_t> pos(M), slot(M);
  for (int m = 0; m < M; ++m) { pos[m] = 3 + 37 * m; slot[m] = (5 * m + 3) % rows; }
  DevBuf<float> dx(x), dy(y), dxo(size_t(M) * H), dq(size_t(M) * Hq * D), dinv(inv);
  DevBuf<uint16_t> dg(g), db(b), dk(size_t(rows) * Hkv * D), dv(size_t(rows) * Hkv * D);
  DevBuf<uint8_t> dk8(size_t(rows) * Hkv * D), dv8(size_t(rows) * Hkv * D);
  DevBuf<int32_t> dpos(pos), dslot(slot), dbt(std::vector<int32_t>{2, 0, 3, 1}), dbo(std::vector<int32_t>(M, 0));
  dq.poison(); dk.poison(); dv.poison(); dxo.poison(); dk8.poison(); dv8.poison();
  cuda::QkvRopeKvParams p;
  p.res = {dx.p, with_y ? dy.p : nullptr, dxo.p};
  p.norm_w = dg.p; p.eps = eps; p.w = tw.w; p.bias = db.p; p.pos = dpos.p; p.slot = dslot.p; p.inv_freq = dinv.p;
  p.concentration = 1.25f; p.q_out = dq.p; p.kv.k = dk.p; p.kv.v = dv.p;
  if (fp8) p.kv.k = dk8.p, p.kv.v = dv8.p, p.kv.dtype = cuda::KvDtype::kFp8E4m3;
  p.M = M; p.H = H; p.Hq = Hq; p.Hkv = Hkv; p.D = D;
  if (prefetch) {
    p.kv_prefetch = true;
    p.block_tables = dbt.p; p.bt_off = dbo.p; p.kv.block_size = 16;
  }
  cuda::dense_qkv_rope_kv(p, 0);
  auto q = dq.get(); auto kc = dk.get(); auto vc = dv.get(); auto xo = dxo.get();
  auto kc8 = dk8.get(), vc8 = dv8.get();
  std::vector<float> res(x);
  if (with_y)
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < 4; ++j)
        for (int k = 0; k < H; ++k) res[size_t(m) * H + k] += y[(size_t(m) * 4 + j) * H + k];
  for (size_t i = 0; i < res.size(); ++i) ASSERT_NEAR(xo[i], res[i], 1e-5 * (1 + std::fabs(res[i])));
  auto xn = ref_norm_bf16(res, g, M, H, eps);
  for (int m = 0; m < M; ++m) {
    std::vector<double> o(N), mag(N);
    for (int r = 0; r < N; ++r) {
      o[r] = bf16_to_f32(b[r]);
      for (int k = 0; k < H; ++k) {
        const double t = double(W[size_t(r) * H + k]) * xn[size_t(m) * H + k];
        o[r] += t;
        mag[r] += std::fabs(t);
      }
    }
    for (int h = 0; h < Hq + 2 * Hkv; ++h)
      for (int d = 0; d < D / 2; ++d) {
        const int r1 = h * D + d, r2 = r1 + D / 2;
        double y1 = o[r1], y2 = o[r2];
        if (h < Hq + Hkv) {
          const float ang = float(pos[m]) * inv[d];
          const double c = std::cos(ang) * 1.25, s = std::sin(ang) * 1.25;
          y1 = o[r1] * c - o[r2] * s;
          y2 = o[r2] * c + o[r1] * s;
        }
        const double tol = 1.25e-5 * (mag[r1] + mag[r2]) + 1e-5;
        if (h < Hq) {
          ASSERT_NEAR(q[size_t(m) * Hq * D + h * D + d], y1, tol) << "q m=" << m << " h=" << h << " d=" << d;
          ASSERT_NEAR(q[size_t(m) * Hq * D + h * D + d + D / 2], y2, tol);
        } else {
          const bool is_k = h < Hq + Hkv;
          const size_t base = size_t(slot[m]) * Hkv * D + size_t(is_k ? h - Hq : h - Hq - Hkv) * D;
          if (fp8) {
            const auto& cache = is_k ? kc8 : vc8;
            ASSERT_TRUE(near_e4m3(e4m3_to_f32(cache[base + d]), y1, tol)) << "kv m=" << m << " h=" << h << " d=" << d;
            ASSERT_TRUE(near_e4m3(e4m3_to_f32(cache[base + d + D / 2]), y2, tol));
          } else {
            const auto& cache = is_k ? kc : vc;
            ASSERT_TRUE(near_bf16(bf16_to_f32(cache[base + d]), y1, tol)) << "kv m=" << m << " h=" << h << " d=" << d;
            ASSERT_TRUE(near_bf16(bf16_to_f32(cache[base + d + D / 2]), y2, tol));
          }
        }
      }
  }
}

TEST(DecodeGemv, QkvRopeKvHeadDim64) { check_qkv(3, 320, 16, 2, 64, true); }
TEST(DecodeGemv, QkvRopeKvHeadDim16EightTokens) { check_qkv(8, 64, 8, 1, 16, false); }
TEST(DecodeGemv, QkvRopeKvOneTokenWithKvPrefetch) { check_qkv(1, 320, 16, 2, 64, true, true); }
TEST(DecodeGemv, QkvRopeKvFp8Cache) { check_qkv(3, 320, 16, 2, 64, true, false, true); }
TEST(DecodeGemv, QkvRopeKvFp8CacheOneTokenWithKvPrefetch) { check_qkv(1, 320, 16, 2, 64, true, true, true); }
TEST(DecodeGemv, QkvRopeKvMxfp4Weights) {
  check_qkv(3, 320, 16, 2, 64, true, false, false, DenseFormat::kMxfp4);
  check_qkv(1, 320, 16, 2, 64, true, true, true, DenseFormat::kMxfp4);
  check_qkv(8, 64, 8, 1, 16, false, false, false, DenseFormat::kMxfp4);
}
TEST(DecodeGemv, QkvRopeKvFp8Weights) {
  check_qkv(3, 320, 16, 2, 64, true, false, false, DenseFormat::kFp8);
  check_qkv(1, 320, 16, 2, 64, true, true, true, DenseFormat::kFp8);
  check_qkv(8, 96, 8, 1, 16, false, false, false, DenseFormat::kFp8);
}

TEST(DecodeGemv, OProjAddsToResidualEveryFormat) {
  std::mt19937 rng(4);
  for (auto [M, N, K] : {std::tuple{4, 72, 128}, std::tuple{8, 2880, 4096}, std::tuple{3, 40, 96}})
    for (DenseFormat f : kDenseFormats) {
      auto Wb = random_bf16(size_t(N) * K, rng), b = random_bf16(N, rng), a = random_bf16(size_t(M) * K, rng);
      auto x = random_f32(size_t(M) * N, rng);
      const DenseTestWeight tw(f, Wb, N, K);
      DevBuf<uint16_t> db(b), da(a);
      DevBuf<float> dx(x);
      cuda::dense_o_proj_residual({da.p, tw.w, db.p, dx.p, M, N, K, {}}, 0);
      auto got = dx.get();
      for (int m = 0; m < M; ++m)
        for (int r = 0; r < N; ++r) {
          double ref = x[size_t(m) * N + r] + bf16_to_f32(b[r]), mag = 1;
          for (int k = 0; k < K; ++k) {
            const double t = double(tw.values[size_t(r) * K + k]) * bf16_to_f32(a[size_t(m) * K + k]);
            ref += t;
            mag += std::fabs(t);
          }
          ASSERT_NEAR(got[size_t(m) * N + r], ref, 1e-5 * mag) << format_name(f) << " N=" << N << " K=" << K;
        }
    }
}

// One token: the o-proj as above plus the router's sums (OProjRouterParams), on the residual the kernel
// wrote. The fixed-point sums round once per 16-row tile: 2^-29 each.
void check_oproj_router(int N, int K, int E, uint64_t seed, DenseFormat wf = DenseFormat::kBf16) {
  SCOPED_TRACE(format_name(wf));
  std::mt19937 rng(seed);
  auto Wb = random_bf16(size_t(N) * K, rng), b = random_bf16(N, rng), a = random_bf16(K, rng);
  auto x = random_f32(N, rng, -4, 4);
  auto g = random_bf16(N, rng, 0.5f, 1.5f), R = random_bf16(size_t(E) * N, rng);
  const int tiles = cuda::oproj_router_tiles(N);
  const DenseTestWeight tw(wf, Wb, N, K);
  const std::vector<float>& W = tw.values;
  DevBuf<uint16_t> db(b), da(a), dg(g), dR(R);
  DevBuf<float> dx(x), dss(tiles);
  DevBuf<long long> dacc(std::vector<long long>(E, 0));
  dss.poison();
  cuda::dense_o_proj_router_m1({{da.p, tw.w, db.p, dx.p, 1, N, K, {}}, dg.p, dR.p, dacc.p, dss.p, E}, 0);
  auto h = dx.get(); auto ss = dss.get(); auto acc = dacc.get();
  double ss_ref = 0, ss_got = 0;
  for (int r = 0; r < N; ++r) {
    double ref = x[r] + bf16_to_f32(b[r]), mag = 1;
    for (int k = 0; k < K; ++k) {
      const double t = double(W[size_t(r) * K + k]) * bf16_to_f32(a[k]);
      ref += t;
      mag += std::fabs(t);
    }
    ASSERT_NEAR(h[r], ref, 1e-5 * mag) << "N=" << N << " r=" << r;
    ss_ref += double(h[r]) * h[r];
  }
  for (float s : ss) ss_got += s;
  ASSERT_NEAR(ss_got, ss_ref, 1e-5 * ss_ref) << "N=" << N;
  for (int e = 0; e < E; ++e) {
    double ref = 0, mag = 0;
    for (int r = 0; r < N; ++r) {
      const double t = double(bf16_to_f32(R[size_t(e) * N + r])) * bf16_to_f32(g[r]) * h[r];
      ref += t;
      mag += std::fabs(t);
    }
    ASSERT_NEAR(double(acc[e]) / cuda::kRouteAccScale, ref, 1e-5 * mag + tiles * 0x1p-29) << "N=" << N << " e=" << e;
  }
}
TEST(DecodeGemv, OProjRouterOneTokenSums) { check_oproj_router(2880, 4096, 128, 21); }
TEST(DecodeGemv, OProjRouterOneTokenSumsOddSizes) { check_oproj_router(37, 96, 20, 22); }
TEST(DecodeGemv, OProjRouterOneTokenQuantizedWeights) {
  for (DenseFormat f : {DenseFormat::kMxfp4, DenseFormat::kFp8}) {
    check_oproj_router(2880, 4096, 128, 23, f);
    check_oproj_router(37, 96, 20, 24, f);
  }
}

TEST(DecodeGemv, RouterLogitsAndNormalizedRows) {
  std::mt19937 rng(5);
  const int M = 5, E = 20, H = 96;
  auto x = random_f32(size_t(M) * H, rng, -3, 3);
  auto g = random_bf16(H, rng, 0.5f, 1.5f), W = random_bf16(size_t(E) * H, rng), b = random_bf16(E, rng);
  DevBuf<float> dx(x), dl(size_t(cuda::kRouterSplits) * M * E);
  DevBuf<uint16_t> dg(g), dW(W), db(b), dxn(size_t(M) * H);
  dl.poison(); dxn.poison();
  cuda::RouterParams p;
  p.res = {dx.p, nullptr, nullptr};
  p.norm_w = dg.p; p.eps = 1e-5f; p.w = dW.p; p.bias = db.p; p.logits = dl.p; p.xn = dxn.p; p.M = M; p.E = E; p.H = H;
  cuda::bf16_router(p, 0);
  auto part = dl.get(); auto xn = dxn.get();
  std::vector<float> lg(size_t(M) * E, 0.f);  // the expert kernels add the K-slice partials in order
  for (int k = 0; k < cuda::kRouterSplits; ++k)
    for (size_t i = 0; i < lg.size(); ++i) lg[i] += part[size_t(k) * M * E + i];
  auto ref = ref_norm_bf16(x, g, M, H, 1e-5f);
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_TRUE(near_bf16(bf16_to_f32(xn[i]), ref[i], 1e-6)) << i;
  for (int m = 0; m < M; ++m)
    for (int e = 0; e < E; ++e) {
      double r = bf16_to_f32(b[e]), mag = 1;
      for (int k = 0; k < H; ++k) {
        const double t = double(bf16_to_f32(W[size_t(e) * H + k])) * ref[size_t(m) * H + k];
        r += t;
        mag += std::fabs(t);
      }
      ASSERT_NEAR(lg[size_t(m) * E + e], r, 1e-5 * mag);
    }
}

// Router logits that make token n choose `experts[n]` in this order (weights e^0, e^-1, ...).
std::vector<float> forced_logits(const std::vector<std::array<int, 4>>& experts, int E, float gap) {
  std::vector<float> lg(experts.size() * E, -50.f);
  for (size_t n = 0; n < experts.size(); ++n)
    for (int j = 0; j < 4; ++j) lg[n * E + experts[n][j]] = -gap * j;
  return lg;
}

// M = 1 (FP8 tensor cores) and M > 1 (bf16 mma) run two forms of the E2M1 decode (e4m3_split.cuh,
// mma_tile.cuh fp4_lo): both exact.
void check_fc2_exact(int M) {
  std::mt19937 rng(6);
  const int E = 5, H = 96, I = 96;  // 6 row tiles, a partial 128-value segment
  auto blocks = random_u8(size_t(E) * H * I / 2, rng), scales = random_u8(size_t(E) * H * I / 32, rng, 2, 128);
  std::vector<uint16_t> bias(size_t(E) * H, 0);
  DevBuf<uint8_t> db(blocks), ds(scales);
  DevBuf<uint16_t> dbias(bias), dact(size_t(M) * 4 * I);
  DevBuf<float> dy(size_t(M) * 4 * H);
  // Token n: expert (n % E) first with weight 1 (the others e^-200 below it: weight 0 in fp32).
  std::vector<std::array<int, 4>> ex(M);
  for (int n = 0; n < M; ++n) ex[n] = {n % E, (n + 1) % E, (n + 2) % E, (n + 3) % E};
  DevBuf<float> dlg(forced_logits(ex, E, 200.f));
  for (int k0 = 0; k0 < I; k0 += M) {
    std::vector<uint16_t> act(size_t(M) * 4 * I, f32_to_bf16(0.f));
    for (int n = 0; n < M; ++n) act[(size_t(n) * 4) * I + k0 + n] = f32_to_bf16(1.f);
    dact.put(act);
    dy.poison();
    cuda::MoeDecodeParams p;
    p.router_logits = dlg.p; p.fc2_blocks = db.p; p.fc2_scales = ds.p; p.fc2_bias = dbias.p; p.act = dact.p;
    p.y_slot = dy.p; p.M = M; p.E = E; p.H = H; p.I = I;
    cuda::mxfp4_moe_fc2(p, 0);
    auto y = dy.get();
    for (int n = 0; n < M; ++n)
      for (int r = 0; r < H; ++r) {
        const size_t row = size_t(ex[n][0]) * H + r;
        const float want = mxfp4_at(&blocks[row * I / 2], &scales[row * I / 32], k0 + n);
        ASSERT_EQ(y[(size_t(n) * 4) * H + r], want) << "M=" << M << " k=" << k0 + n << " n=" << n << " r=" << r;
      }
  }
}
TEST(MoeDecode, Fc2DecodesMxfp4ExactlyOneToken) { check_fc2_exact(1); }
TEST(MoeDecode, Fc2DecodesMxfp4ExactlyTwoTokens) { check_fc2_exact(2); }
TEST(MoeDecode, Fc2DecodesMxfp4ExactlyEightTokens) { check_fc2_exact(8); }

// wide: activations of both signs spread over 2^-24 .. 2^8 (the
// one-token path splits them into e4m3 terms with a scale per 32 values), some exactly zero.
// from_acc (one token): the routing comes from the o-proj's router sums (MoeDecodeParams::route_acc)
// and the input is normalized from an fp32 residual h; the reference's xn and logits are what those
// sums and h stand for.
// held_lo/held_hi (expert parallelism): only those experts run; the other slots' rows stay untouched.
void check_moe(int M, int E, int H, int I, uint64_t seed, bool wide = false, bool from_acc = false, int held_lo = 0,
               int held_hi = -1) {
  if (held_hi < 0) held_hi = E;
  std::mt19937 rng(seed);
  const float alpha = 1.702f, limit = 7.f;
  auto b1 = random_u8(size_t(E) * 2 * I * H / 2, rng), s1 = random_u8(size_t(E) * 2 * I * H / 32, rng, 118, 124);
  auto b2 = random_u8(size_t(E) * H * I / 2, rng), s2 = random_u8(size_t(E) * H * I / 32, rng, 118, 124);
  auto bias1 = random_bf16(size_t(E) * 2 * I, rng), bias2 = random_bf16(size_t(E) * H, rng);
  auto xn = random_bf16(size_t(M) * H, rng, -2, 2);
  if (wide) {
    std::uniform_real_distribution<float> ex(-24.f, 8.f);
    for (size_t k = 0; k < xn.size(); ++k)
      xn[k] = k % 37 == 5 ? f32_to_bf16(0.f) : f32_to_bf16((k % 3 ? 1.f : -1.f) * std::exp2(ex(rng)));
  }
  auto lg = random_f32(size_t(M) * E, rng, -3, 3);
  if (M > 1 && E > 5) lg[E + 3] = lg[E + 5] = 10.f;  // a tie: the lower index must win
  std::vector<float> h, ss_part;
  std::vector<uint16_t> gamma, rbias(E, f32_to_bf16(0.f));
  std::vector<long long> acc(E);
  if (from_acc) {
    h = random_f32(H, rng, -3, 3);
    gamma = random_bf16(H, rng, 0.5f, 1.5f);
    ss_part.assign(3, 0.f);
    for (int k = 0; k < H; ++k) ss_part[k * 3 / H] += h[k] * h[k];
    const float inv = 1.f / std::sqrt((ss_part[0] + ss_part[1] + ss_part[2]) / H + 1e-5f);
    for (int k = 0; k < H; ++k) xn[k] = f32_to_bf16(bf16_to_f32(gamma[k]) * (h[k] * inv));
    for (int e = 0; e < E; ++e) acc[e] = std::llround(double(lg[e]) / inv * cuda::kRouteAccScale);
  }
  DevBuf<uint8_t> db1(b1), ds1(s1), db2(b2), ds2(s2);
  DevBuf<uint16_t> dbias1(bias1), dbias2(bias2), dxn(xn), dact(size_t(M) * 4 * I);
  DevBuf<float> dlg(lg), dy(size_t(M) * 4 * H);
  dact.poison(); dy.poison();
  cuda::MoeDecodeParams p;
  p.router_logits = dlg.p; p.fc1_blocks = db1.p; p.fc1_scales = ds1.p; p.fc1_bias = dbias1.p;
  p.fc2_blocks = db2.p; p.fc2_scales = ds2.p; p.fc2_bias = dbias2.p; p.xn = dxn.p; p.act = dact.p; p.y_slot = dy.p;
  p.M = M; p.E = E; p.H = H; p.I = I; p.alpha = alpha; p.limit = limit;
  p.expert_lo = held_lo; p.expert_hi = held_hi;
  DevBuf<float> dh(from_acc ? h : std::vector<float>(1)), dss(from_acc ? ss_part : std::vector<float>(1));
  DevBuf<uint16_t> dgamma(from_acc ? gamma : std::vector<uint16_t>(1)), drb(rbias);
  DevBuf<long long> dacc(acc);
  if (from_acc) {
    dxn.poison();  // must not be read
    p.router_logits = nullptr;
    p.route_acc = dacc.p; p.ss_part = dss.p; p.ss_parts = 3; p.router_bias = drb.p; p.norm_w = dgamma.p;
    p.h = dh.p; p.eps = 1e-5f;
  }
  cuda::mxfp4_moe_fc1_swiglu(p, 0);
  cuda::mxfp4_moe_fc2(p, 0);
  auto act = dact.get(); auto y = dy.get();
  // The FP8 path's products are exact, but Hopper's FP8 tensor cores add them keeping ~13 bits below
  // the largest term, and activations below 2^-9 of their group's maximum carry up to 2^-17 of it
  // (e4m3_split.cuh): 3e-4 of the magnitude, still ~10x inside bf16 rounding. The bf16 paths
  // accumulate in fp32: 1e-5.
  const double ytol = M == 1 ? 3e-4 : 1e-5;
  int held_slots = 0, other_slots = 0;
  for (int n = 0; n < M; ++n) {
    std::vector<int> idx(E);
    std::iota(idx.begin(), idx.end(), 0);
    const float* r = &lg[size_t(n) * E];
    std::partial_sort(idx.begin(), idx.begin() + 4, idx.end(), [&](int a, int b) { return r[a] > r[b] || (r[a] == r[b] && a < b); });
    double z = 0, w[4];
    for (int j = 0; j < 4; ++j) z += (w[j] = std::exp(double(r[idx[j]]) - r[idx[0]]));
    for (int j = 0; j < 4; ++j) {
      const int e = idx[j];
      if (e < held_lo || e >= held_hi) {  // another GPU's expert: its slot is left alone
        for (int h = 0; h < H; ++h) ASSERT_TRUE(std::isnan(y[(size_t(n) * 4 + j) * H + h])) << "n=" << n << " j=" << j;
        ++other_slots;
        continue;
      }
      ++held_slots;
      std::vector<float> a(I);
      for (int i = 0; i < I; ++i) {
        double hv[2], mag = 0;
        for (int u = 0; u < 2; ++u) {
          const size_t row = size_t(e) * 2 * I + 2 * i + u;
          hv[u] = bf16_to_f32(bias1[row]);
          for (int k = 0; k < H; ++k) {
            const double t = double(mxfp4_at(&b1[row * H / 2], &s1[row * H / 32], k)) * bf16_to_f32(xn[size_t(n) * H + k]);
            hv[u] += t;
            mag += std::fabs(t);
          }
        }
        const double gate = std::min(hv[0], double(limit)), up = std::clamp(hv[1], -double(limit), double(limit));
        const double ref = gate / (1 + std::exp(-alpha * gate)) * (up + 1);
        const float got = bf16_to_f32(act[(size_t(n) * 4 + j) * I + i]);
        ASSERT_TRUE(near_bf16(got, ref, 1e-4 * mag)) << "act n=" << n << " j=" << j << " i=" << i << " " << got << " vs " << ref;
        a[i] = got;  // the FC2 check below starts from the GPU's bf16 activations
      }
      for (int h = 0; h < H; ++h) {
        const size_t row = size_t(e) * H + h;
        double ref = bf16_to_f32(bias2[row]), mag = 0;
        for (int i = 0; i < I; ++i) {
          const double t = double(mxfp4_at(&b2[row * I / 2], &s2[row * I / 32], i)) * a[i];
          ref += t;
          mag += std::fabs(t);
        }
        ref *= w[j] / z;
        ASSERT_NEAR(y[(size_t(n) * 4 + j) * H + h], ref, ytol * mag + 1e-6) << "y n=" << n << " j=" << j << " h=" << h;
      }
    }
  }
  EXPECT_GT(held_slots, 0);
  if (held_hi - held_lo < E) {
    EXPECT_GT(other_slots, 0) << "the seed routes every slot to held experts";
  }
}

// One token runs on FP8 tensor cores (kernels/decode/e4m3_split.cuh) on sm_89+, more tokens on bf16 mma.
TEST(MoeDecode, Fc1Fc2MatchReferenceOneToken) { check_moe(1, 32, 288, 160, 7); }
TEST(MoeDecode, Fc1Fc2OneTokenWideRangeActivations) { check_moe(1, 8, 2880, 96, 17, true); }
TEST(MoeDecode, Fc1Fc2OneTokenOddSizes) { check_moe(1, 4, 96, 32, 18); }
// Expert parallelism: this GPU holds experts [8, 20) of 32 (seed 19 routes the token to both sides).
TEST(MoeDecode, Fc1Fc2OneTokenHeldExpertsOnly) { check_moe(1, 32, 288, 160, 19, false, false, 8, 20); }
TEST(MoeDecode, Fc1Fc2OneTokenHeldExpertsOnlyRoutedFromOProjSums) { check_moe(1, 32, 288, 160, 19, false, true, 8, 20); }
TEST(MoeDecode, Fc1Fc2ThreeTokensHeldExpertsOnly) { check_moe(3, 32, 64, 64, 9, false, false, 0, 16); }
// K = 4160: the one-token staging (e4m3::stage_split_from) takes two rounds of batched loads, the
// second partial, and a partial last 128-value segment.
TEST(MoeDecode, Fc1Fc2OneTokenLongRows) { check_moe(1, 4, 4160, 4160, 21); }
TEST(MoeDecode, Fc1Fc2OneTokenLongRowsRoutedFromOProjSums) { check_moe(1, 4, 4160, 4160, 22, false, true); }
TEST(MoeDecode, Fc1Fc2OneTokenRoutedFromOProjSums) { check_moe(1, 32, 288, 160, 19, false, true); }
TEST(MoeDecode, Fc1Fc2OneTokenRoutedFromOProjSumsOddSizes) { check_moe(1, 5, 96, 32, 20, false, true); }
TEST(MoeDecode, Fc1Fc2MatchReferenceEightTokens) { check_moe(8, 16, 128, 96, 8); }
TEST(MoeDecode, Fc1Fc2MatchReferenceThreeTokensManyExperts) { check_moe(3, 128, 64, 64, 9); }
TEST(MoeDecode, Fc1Fc2TwoTokensOddSizes) { check_moe(2, 8, 96, 32, 23); }

// Attention over a paged cache vs a double-precision reference (with the sink in the denominator).
// fp8: the cache holds E4M3 bytes (random values rounded), which the reference widens exactly.
void check_attention(int D, int Hkv, std::vector<int> positions, int window, uint64_t seed, bool fp8 = false) {
  std::mt19937 rng(seed);
  const int G = 8, Hq = G * Hkv, bs = 16, M = int(positions.size());
  const int maxpos = *std::max_element(positions.begin(), positions.end());
  const int nblk = maxpos / bs + 1, nblocks = nblk * M + 3;
  auto kc = random_bf16(size_t(nblocks) * bs * Hkv * D, rng), vc = random_bf16(size_t(nblocks) * bs * Hkv * D, rng);
  std::vector<uint8_t> kc8(kc.size()), vc8(vc.size());
  if (fp8)  // the bf16 values become their E4M3 roundings, so one reference serves both
    for (size_t i = 0; i < kc.size(); ++i) {
      kc8[i] = f32_to_e4m3(bf16_to_f32(kc[i]) * 3);  // a wider range: subnormals to ~3
      vc8[i] = f32_to_e4m3(bf16_to_f32(vc[i]));
      kc[i] = f32_to_bf16(e4m3_to_f32(kc8[i]));
      vc[i] = f32_to_bf16(e4m3_to_f32(vc8[i]));
    }
  auto q = random_f32(size_t(M) * Hq * D, rng, -2, 2);
  auto sinks = random_bf16(Hq, rng, -1, 3);
  std::vector<int32_t> bt, bt_off;
  for (int m = 0; m < M; ++m) {  // reversed, interleaved block ids: non-contiguous tables
    bt_off.push_back(int(bt.size()));
    for (int b = 0; b < nblk; ++b) bt.push_back((nblk - 1 - b) * M + m + 3);
  }
  DevBuf<uint16_t> dk(kc), dv(vc), ds(sinks), dout(size_t(M) * Hq * D);
  DevBuf<uint8_t> dk8(kc8), dv8(vc8);
  DevBuf<float> dq(q), dpart(cuda::attention_decode_scratch_floats(M, Hkv, D));
  DevBuf<int32_t> dpos(positions), dbt(bt), dbo(bt_off), dtk(std::vector<int32_t>(size_t(M) * Hkv * G, 0));
  DevBuf<unsigned long long> dmma(std::vector<unsigned long long>(cuda::attention_decode_mma_scratch_words(M, Hkv), 0));
  // Every head grouping, with and without the older keys read before the wait (kv_stable: each query is
  // its own sequence here), then the tensor-core kernel (D = 64) with all its splits and with only
  // those the longest context uses (the engine's wide steps: passes sized to the longest split, or
  // 32-key passes), then with fewer splits than the contexts take (1 and 3: longer splits, more passes);
  // the second launch of each checks the tickets were reset.
  int splits = 0, pass = 0, pass1 = 0, pass3 = 0;
  for (int pos : positions) {
    const int keys = window ? std::min(pos + 1, window) : pos + 1;
    splits = std::max(splits, cuda::attention_decode_mma_splits(keys));
    pass = std::max(pass, std::min(cuda::kAttnMmaKeys, cuda::attention_decode_mma_keys_per_split(keys)));
    pass1 = std::max(pass1, std::min(cuda::kAttnMmaKeys, cuda::attention_decode_mma_keys_per_split(keys, 1)));
    pass3 = std::max(pass3, std::min(cuda::kAttnMmaKeys, cuda::attention_decode_mma_keys_per_split(keys, 3)));
  }
  std::vector<double> want(size_t(M) * Hq * D);
  for (int m = 0; m < M; ++m) {
    const int pos = positions[m], lo = window ? std::max(0, pos - window + 1) : 0;
    for (int h = 0; h < Hq; ++h) {
      const int kvh = h / G;
      std::vector<double> s;
      double mx = bf16_to_f32(sinks[h]);
      for (int j = lo; j <= pos; ++j) {
        const size_t row = size_t(bt[bt_off[m] + j / bs]) * bs + j % bs;
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += double(q[(size_t(m) * Hq + h) * D + d]) * bf16_to_f32(kc[(row * Hkv + kvh) * D + d]);
        s.push_back(dot / std::sqrt(double(D)));
        mx = std::max(mx, s.back());
      }
      double den = std::exp(bf16_to_f32(sinks[h]) - mx);
      for (double& v : s) den += (v = std::exp(v - mx));
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int j = lo; j <= pos; ++j) {
          const size_t row = size_t(bt[bt_off[m] + j / bs]) * bs + j % bs;
          o += s[j - lo] * bf16_to_f32(vc[(row * Hkv + kvh) * D + d]);
        }
        want[(size_t(m) * Hq + h) * D + d] = o / den;
      }
    }
  }
  const int runs = D == 64 ? 26 : 16;
  for (int run = 0; run < runs; ++run) {
    const bool mma = run >= 16;
    const int heads = mma ? 8 : 8 >> (run / 4);
    const bool kv_stable = run >= 22 ? run % 2 == 1 : (run / 2) & 1;  // capped splits: both ways
    SCOPED_TRACE(std::string(mma ? "tensor cores" : "heads_per_cta " + std::to_string(heads)) +
                 (kv_stable ? ", kv_stable" : ""));
    dout.poison();
    cuda::AttnDecodeParams p;
    p.q = dq.p; p.q_stride = Hq * D; p.kv.k = dk.p; p.kv.v = dv.p; p.pos = dpos.p; p.bt_off = dbo.p;
    if (fp8) p.kv.k = dk8.p, p.kv.v = dv8.p, p.kv.dtype = cuda::KvDtype::kFp8E4m3;
    p.block_tables = dbt.p; p.sinks = ds.p; p.out = dout.p; p.partials = dpart.p; p.tickets = dtk.p;
    p.mma_partials = dmma.p;
    p.M = M; p.Hq = Hq; p.Hkv = Hkv; p.D = D; p.kv.block_size = bs; p.window = window; p.heads_per_cta = heads;
    p.kv_stable = kv_stable;
    p.splits = run >= 24 ? 3 : run >= 22 ? 1 : run >= 20 ? splits : 0;
    const int fit = run >= 24 ? pass3 : run >= 22 ? pass1 : pass;
    p.pass_keys = run >= 20 ? (run % 2 == 0 ? fit : 32) : 0;  // passes sized to the longest split, or 32 keys
    if (mma) cuda::attention_decode_mma(p, 0);
    else cuda::attention_decode(p, 0);
    auto out = dout.get();
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < Hq * D; ++i) {
        const double o = want[size_t(m) * Hq * D + i];
        const float got = bf16_to_f32(out[size_t(m) * Hq * D + i]);
        ASSERT_TRUE(near_bf16(got, o, 2e-4)) << "m=" << m << " pos=" << positions[m] << " h=" << i / D << " d=" << i % D
                                             << " got " << got << " want " << o;
      }
  }
}

TEST(AttentionDecode, FullAttentionShortAndLongContexts) { check_attention(64, 2, {0, 5, 130, 700, 2100, 5000}, 0, 10); }
TEST(AttentionDecode, SlidingWindow) { check_attention(64, 1, {3, 127, 128, 129, 1000}, 128, 11); }
TEST(AttentionDecode, HeadDim16) { check_attention(16, 1, {0, 9, 40}, 4, 12); }
// A wide step's rows: many sequences of mixed depths in one launch.
std::vector<int> mixed_depths(int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back((i * 397 + 11) % 1900);
  return v;
}
TEST(AttentionDecode, ManyRowsMixedDepths) { check_attention(64, 1, mixed_depths(37), 0, 13); }
TEST(AttentionDecode, ManyRowsSlidingWindow) { check_attention(64, 1, mixed_depths(41), 128, 14); }
// The FP8 cache, 1 to 64k keys (both kernels, every variant above).
TEST(AttentionDecode, Fp8CacheShortToLongContexts) {
  check_attention(64, 1, {0, 5, 130, 700, 2100, 5000, 16383, 65535}, 0, 15, true);
}
TEST(AttentionDecode, Fp8CacheSlidingWindow) { check_attention(64, 1, {3, 127, 128, 129, 1000}, 128, 16, true); }
TEST(AttentionDecode, Fp8CacheManyRowsMixedDepths) { check_attention(64, 1, mixed_depths(37), 0, 17, true); }
TEST(AttentionDecode, Fp8CacheHeadDim16) { check_attention(16, 1, {0, 9, 40}, 4, 18, true); }

}  // namespace
