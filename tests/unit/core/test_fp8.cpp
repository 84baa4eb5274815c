// FP8 E4M3 and MXFP8 block rounding (core/fp8.h): exact, checked against the format's definition.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/fp8.h"

namespace mx {
namespace {

TEST(Fp8, E4m3CodesAndLimits) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_EQ(e4m3_to_f32(0xB8), -1.0f);
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    const float v = e4m3_to_f32(uint8_t(c));
    EXPECT_EQ(f32_to_e4m3(v), c == 0x80 ? 0x80 : c) << c;  // every value is its own code
  }
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7E);  // saturates
  EXPECT_EQ(f32_to_e4m3(-1e30f), 0xFE);
  EXPECT_EQ(f32_to_e4m3(INFINITY), 0x7E);
  EXPECT_EQ(f32_to_e4m3(NAN), 0x7F);
}

TEST(Fp8, E4m3RoundsToNearestEven) {
  for (int c = 0; c < 0x7E; ++c) {
    const float a = e4m3_to_f32(uint8_t(c)), b = e4m3_to_f32(uint8_t(c + 1)), mid = (a + b) / 2;
    EXPECT_EQ(f32_to_e4m3(mid), c % 2 == 0 ? c : c + 1) << c;  // ties: the even mantissa
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 0.0f)), c) << c;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 1e9f)), c + 1) << c;
    EXPECT_EQ(f32_to_e4m3(-std::nextafter(mid, 0.0f)), 0x80 | c) << c;
  }
}

TEST(Fp8, MxBlocksShareAPowerOfTwoScale) {
  std::vector<float> x = {1.0f, -300.0f, 0.001f, 5.5f};
  EXPECT_EQ(mxfp8_scale_exponent(x.data(), 4), 0);   // 300 <= 448: no scaling
  x[1] = -500.0f;
  EXPECT_EQ(mxfp8_scale_exponent(x.data(), 4), 1);   // 500 > 448: halved, never saturated
  x[1] = 0.75f;
  EXPECT_EQ(mxfp8_scale_exponent(x.data(), 4), -6);  // 5.5 * 2^6 = 352 <= 448 < 5.5 * 2^7
  std::vector<float> zeros(32, 0.0f);
  EXPECT_EQ(mxfp8_scale_exponent(zeros.data(), 32), -127);
  // Rounding: each block's values are E4M3 times its scale, within half an E4M3 step (1/16 relative,
  // or half the smallest subnormal step), never saturated; values that fit exactly stay.
  std::mt19937 g(3);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> v(70);  // two whole blocks and a partial one
  for (auto& f : v) f = n(g) * 37.0f;
  std::vector<float> r = v;
  mxfp8_round(r.data(), int(r.size()));
  for (int b = 0; b < 70; b += 32) {
    const int m = std::min(32, 70 - b);
    const int s = mxfp8_scale_exponent(v.data() + b, m);
    for (int i = b; i < b + m; ++i) {
      const float q = std::ldexp(r[size_t(i)], -s);
      EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(q)), q) << i;  // representable after scaling
      EXPECT_LE(std::fabs(r[size_t(i)] - v[size_t(i)]), std::fabs(v[size_t(i)]) / 16 + std::ldexp(1.0f, s - 9)) << i;
    }
  }
  std::vector<float> exact = {1.0f, 2.0f, -0.5f, 448.0f};
  std::vector<float> copy = exact;
  mxfp8_round(copy.data(), 4);
  EXPECT_EQ(copy, exact);
}

}  // namespace
}  // namespace mx
