// Dense-weight quantization (core/dense_quant.h): exact, against the formats' definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <random>
#include <vector>

#include "core/dense_quant.h"

namespace mx {
namespace {

TEST(DenseQuant, E2m1RoundsToNearestEvenAndSaturates) {
  for (int c = 0; c < 8; ++c) EXPECT_EQ(f32_to_e2m1(kFp4Values[c]), c);  // every value is its own code
  EXPECT_EQ(f32_to_e2m1(-1.5f), 8 | 3);
  // Ties between neighbours go to the even code: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2,
  // 3.5 -> 4, 5 -> 4.
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const int want[] = {0, 2, 2, 4, 4, 6, 6};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(f32_to_e2m1(ties[i]), want[i]) << ties[i];
  EXPECT_EQ(f32_to_e2m1(0.26f), 1);
  EXPECT_EQ(f32_to_e2m1(4.9f), 6);
  EXPECT_EQ(f32_to_e2m1(5.1f), 7);
  EXPECT_EQ(f32_to_e2m1(100.0f), 7);  // saturates
  EXPECT_EQ(f32_to_e2m1(-100.0f), 15);
}

TEST(DenseQuant, ScaleIsTheSmallestPowerOfTwoThatHoldsTheLargestValue) {
  std::vector<float> x(32, 0.1f);
  x[5] = 6.0f;
  EXPECT_EQ(pow2_scale_exponent(x.data(), 32, 6.0f), 0);  // exactly 6: no scaling
  x[5] = 6.01f;
  EXPECT_EQ(pow2_scale_exponent(x.data(), 32, 6.0f), 1);
  x[5] = -3.0f;
  EXPECT_EQ(pow2_scale_exponent(x.data(), 32, 6.0f), -1);  // 3 <= 6 / 2, 3 > 6 / 4
  EXPECT_EQ(pow2_scale_exponent(x.data(), 32, 448.0f), -7);  // 3 <= 448 / 128 = 3.5
  std::vector<float> zeros(32, 0.0f);
  EXPECT_EQ(pow2_scale_exponent(zeros.data(), 32, 6.0f), -127);
}

TEST(DenseQuant, RowsRoundWithinHalfAStepAndNeverSaturate) {
  std::mt19937 g(7);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> v(96);
  for (auto& f : v) f = n(g) * 0.02f;
  v[40] = 0.5f;  // an outlier in the second block
  std::vector<float> m = v, e = v;
  mxfp4_round_row(m.data(), 96);
  fp8_round_row(e.data(), 96);
  for (int b = 0; b < 96; b += 32) {
    const int s = pow2_scale_exponent(v.data() + b, 32, 6.0f);
    for (int i = b; i < b + 32; ++i) {
      const float q = std::ldexp(m[size_t(i)], -s);
      EXPECT_EQ(kFp4Values[f32_to_e2m1(q)], q) << i;  // an E2M1 value times the block's scale
      EXPECT_LE(std::fabs(m[size_t(i)] - v[size_t(i)]), std::ldexp(1.0f, s - 1) + std::fabs(v[size_t(i)]) / 4) << i;
    }
  }
  EXPECT_EQ(m[40], 0.5f);  // the block's largest value is kept (0.5 = 4 * 2^-3)
  const int s8 = pow2_scale_exponent(v.data(), 96, 448.0f);
  for (int i = 0; i < 96; ++i) {
    EXPECT_EQ(e4m3_round(std::ldexp(e[size_t(i)], -s8)), std::ldexp(e[size_t(i)], -s8)) << i;
    EXPECT_LE(std::fabs(e[size_t(i)] - v[size_t(i)]), std::fabs(v[size_t(i)]) / 16 + std::ldexp(1.0f, s8 - 10)) << i;
  }
}

TEST(DenseQuant, PackedRowsDecodeToTheRoundedValues) {
  std::mt19937 g(11);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> v(160);  // five blocks, one of them all zero
  for (auto& f : v) f = n(g) * 0.03f;
  std::fill(v.begin() + 64, v.begin() + 96, 0.0f);
  std::vector<uint8_t> blocks(80), scales(5), codes(160);
  mxfp4_pack_row(v.data(), 160, blocks.data(), scales.data());
  std::vector<float> decoded(160), rounded = v;
  mxfp4_decode_row(blocks.data(), scales.data(), 160, decoded.data());
  mxfp4_round_row(rounded.data(), 160);
  for (int i = 0; i < 160; ++i) EXPECT_EQ(decoded[size_t(i)], rounded[size_t(i)]) << i;
  EXPECT_EQ(scales[2], 0);  // the zero block: E8M0 2^-127, all codes 0
  const int s = fp8_pack_row(v.data(), 160, codes.data());
  rounded = v;
  fp8_round_row(rounded.data(), 160);
  for (int i = 0; i < 160; ++i) EXPECT_EQ(std::ldexp(e4m3_to_f32(codes[size_t(i)]), s), rounded[size_t(i)]) << i;
}

}  // namespace
}  // namespace mx
