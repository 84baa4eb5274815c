// FP8 E4M3 rounding (core/fp8.h): exact, checked against the format's definition.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <random>

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

TEST(Fp8, KvRoundingKeepsThreeMantissaBits) {
  // Normal range: within half a step (2^-4 relative); below 2^-6: half the subnormal step 2^-9.
  std::mt19937 g(3);
  std::normal_distribution<float> n(0, 1);
  for (int i = 0; i < 10000; ++i) {
    const float x = n(g) * std::ldexp(1.0f, i % 20 - 10), r = e4m3_round(x);
    if (std::fabs(x) <= 448.0f) EXPECT_LE(std::fabs(r - x), std::max(std::fabs(x) / 16, std::ldexp(1.0f, -10))) << x;
    else EXPECT_EQ(std::fabs(r), 448.0f) << x;
    EXPECT_EQ(e4m3_round(r), r);  // idempotent
  }
  EXPECT_EQ(e4m3_round(0.3f), 0.3125f);
  EXPECT_EQ(e4m3_round(-1000.0f), -448.0f);
}

}  // namespace
}  // namespace mx
