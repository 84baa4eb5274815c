// The prefill path's per-row kernels (also a wide decode step's) against host references, at wide-step
// and odd shapes. Label gpu. Tolerances: the RMS norm within one bf16 ulp of a double reference; rope's
// fp32 q within 1e-5 (+1e-5 relative) of a double rotation by the same float angle, its bf16 copies and
// the bf16 cache within one bf16 ulp, the FP8 cache within half an E4M3 step (2^-4 relative, 2^-10
// absolute); the MoE combine exact (fp32 sums in slot order, as the kernel adds them).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/fp8.h"
#include "kernels/decode/decode_kernels.h"
#include "kernels/moe_prefill/moe_prefill.h"
#include "tests/kernels/gpu_test_util.h"

namespace {
using namespace mx;
using namespace mx::test;

TEST(StepKernels, RmsNormRows) {
  std::mt19937 rng(21);
  for (const int M : {1, 37, 200})
    for (const int H : {2880, 100}) {
      const auto x = random_f32(size_t(M) * H, rng, -3, 3);
      const auto g = random_bf16(H, rng, 0.5f, 1.5f);
      DevBuf<float> dx(x);
      DevBuf<uint16_t> dg(g), dy(size_t(M) * H);
      cuda::launch_rmsnorm_bf16(dx.p, nullptr, dg.p, dy.p, M, H, 1e-5f, nullptr);
      const auto y = dy.get();
      for (int m = 0; m < M; ++m) {
        double ss = 0;
        for (int i = 0; i < H; ++i) ss += double(x[size_t(m) * H + i]) * x[size_t(m) * H + i];
        const double r = 1.0 / std::sqrt(ss / H + 1e-5);
        for (int i = 0; i < H; ++i) {
          const double want = bf16_to_f32(g[i]) * x[size_t(m) * H + i] * r;
          ASSERT_TRUE(near_bf16(bf16_to_f32(y[size_t(m) * H + i]), want, 1e-5)) << "M " << M << " H " << H << " m " << m << " i " << i;
        }
      }
    }
}

// q and k heads rotated by pos * inv_freq (times the YaRN concentration); q kept in fp32 and as bf16, k
// and v written at the token's cache row.
TEST(StepKernels, RopeKvWritesQAndTheCache) {
  std::mt19937 rng(22);
  const int M = 37, Hq = 8, Hkv = 2, D = 64, half = D / 2, qkv_dim = (Hq + 2 * Hkv) * D, rows = 2 * M + 3;
  for (const bool fp8 : {false, true}) {
    const auto qkv = random_f32(size_t(M) * qkv_dim, rng, -2, 2);
    std::vector<int32_t> pos(M), slot(M);
    for (int m = 0; m < M; ++m) pos[m] = int32_t(rng() % 5000), slot[m] = 2 * m + 1;  // scattered rows
    std::vector<float> inv_freq(half);
    for (int i = 0; i < half; ++i) inv_freq[i] = std::pow(150000.f, -float(2 * i) / D);
    const float conc = 1.3f;
    DevBuf<float> dqkv(qkv), dfreq(inv_freq);
    DevBuf<int32_t> dpos(pos), dslot(slot);
    DevBuf<uint16_t> dqb(size_t(M) * Hq * D), dk(size_t(rows) * Hkv * D), dv(size_t(rows) * Hkv * D);
    DevBuf<uint8_t> dk8(size_t(rows) * Hkv * D), dv8(size_t(rows) * Hkv * D);
    cuda::RopeKvParams p;
    p.qkv = dqkv.p; p.pos = dpos.p; p.slot = dslot.p; p.inv_freq = dfreq.p; p.concentration = conc;
    p.kv.k = fp8 ? static_cast<void*>(dk8.p) : dk.p;
    p.kv.v = fp8 ? static_cast<void*>(dv8.p) : dv.p;
    p.kv.dtype = fp8 ? cuda::KvDtype::kFp8E4m3 : cuda::KvDtype::kBf16;
    p.q_bf16 = dqb.p; p.M = M; p.Hq = Hq; p.Hkv = Hkv; p.D = D;
    cuda::launch_rope_kv(p, nullptr);
    const std::vector<float> q = dqkv.get();
    const std::vector<uint16_t> qb = dqb.get(), k16 = dk.get(), v16 = dv.get();
    const std::vector<uint8_t> k8 = dk8.get(), v8 = dv8.get();
    for (int m = 0; m < M; ++m)
      for (int h = 0; h < Hq + Hkv; ++h)
        for (int i = 0; i < half; ++i) {
          const float ang = float(pos[m]) * inv_freq[i];  // the kernel's float angle
          const double cs = std::cos(double(ang)) * conc, sn = std::sin(double(ang)) * conc;
          const size_t at = size_t(m) * qkv_dim + size_t(h) * D;
          const double x1 = qkv[at + i], x2 = qkv[at + i + half];
          const double y[2] = {x1 * cs - x2 * sn, x2 * cs + x1 * sn};
          for (int c = 0; c < 2; ++c) {
            const int d = i + c * half;
            if (h < Hq) {
              ASSERT_NEAR(q[at + d], y[c], 1e-5 + 1e-5 * std::fabs(y[c])) << "m " << m << " h " << h << " d " << d;
              ASSERT_TRUE(near_bf16(bf16_to_f32(qb[(size_t(m) * Hq + h) * D + d]), y[c], 1e-5));
            } else {
              const size_t o = (size_t(slot[m]) * Hkv + (h - Hq)) * D + d;
              const float got = fp8 ? e4m3_to_f32(k8[o]) : bf16_to_f32(k16[o]);
              ASSERT_TRUE(fp8 ? near_e4m3(got, y[c]) : near_bf16(got, y[c], 1e-5)) << "k m " << m << " d " << d;
            }
          }
        }
    for (int m = 0; m < M; ++m)
      for (int u = 0; u < Hkv * D; ++u) {
        const double want = qkv[size_t(m) * qkv_dim + size_t(Hq + Hkv) * D + u];
        const size_t o = size_t(slot[m]) * Hkv * D + u;
        const float got = fp8 ? e4m3_to_f32(v8[o]) : bf16_to_f32(v16[o]);
        ASSERT_TRUE(fp8 ? near_e4m3(got, want) : near_bf16(got, want)) << "v m " << m << " u " << u;
      }
  }
}

// resid[t] += the sum of its k slots in slot order; with expert ids, only the slots of experts [lo, hi).
TEST(StepKernels, MoeCombineSumsSlotsInOrder) {
  std::mt19937 rng(23);
  const int k = 4;
  for (const int T : {1, 37, 300})
    for (const int H : {2880, 100})
      for (const bool filter : {false, true}) {
        const auto y = random_f32(size_t(T) * k * H, rng, -1, 1);
        const auto resid = random_f32(size_t(T) * H, rng, -1, 1);
        std::vector<int32_t> idx(size_t(T) * k);
        for (auto& e : idx) e = int32_t(rng() % 16);
        const int lo = filter ? 4 : 0, hi = filter ? 11 : 1 << 30;
        DevBuf<float> dy(y), dr(resid);
        DevBuf<int32_t> di(idx);
        cuda::moe_combine_prefill(dy.p, dr.p, T, k, H, nullptr, filter ? di.p : nullptr, lo, hi);
        const auto got = dr.get();
        for (int t = 0; t < T; ++t)
          for (int h = 0; h < H; ++h) {
            float s = 0.f;
            for (int j = 0; j < k; ++j) {
              const int e = filter ? idx[size_t(t) * k + j] : lo;
              if (e >= lo && e < hi) s += y[(size_t(t) * k + j) * H + h];
            }
            ASSERT_EQ(got[size_t(t) * H + h], resid[size_t(t) * H + h] + s) << "T " << T << " t " << t << " h " << h;
          }
      }
}

}  // namespace
