// Quantized dense weights (--mxfp4-layers, --fp8-layers) on the host: the numerics that the CPU
// reference applies at load and the CUDA kernels must match.
//
// MXFP4 (OCP Microscaling): 32 consecutive values of a row share an E8M0 scale 2^s, each value is
// E2M1 (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), rounded to nearest, ties to the even code.
// FP8: each value is E4M3 (core/fp8.h) times its output row's scale 2^s. Both scales are the smallest
// power of two that keeps the block's (row's) largest magnitude representable (<= 6 * 2^s, <= 448 *
// 2^s): nothing saturates. (OCP's floor(log2(amax)) - emax clips a block's largest values by up to 25 %
// in E2M1; a power of two keeps every rounded value exact in bf16 and fp32.)
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/fp8.h"
#include "core/mxfp4.h"

namespace mx {

// E2M1 code (bit 3 the sign) of x: round to nearest, ties to the even code; |x| past 6 saturates.
inline uint8_t f32_to_e2m1(float x) {
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  const float a = std::fabs(x);
  if (!(a < 6.0f)) return sign | 7;  // 6, beyond, or NaN
  int lo = 0;
  while (lo < 7 && kFp4Values[lo + 1] <= a) ++lo;  // kFp4Values[lo] <= a < kFp4Values[lo + 1]
  const float dl = a - kFp4Values[lo], dh = kFp4Values[lo + 1] - a;
  const int code = dl < dh ? lo : dh < dl ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
  return sign | uint8_t(code);
}

// The smallest s (clamped to E8M0's range) with max |x| <= top * 2^s; -127 for an all-zero block.
inline int pow2_scale_exponent(const float* x, int n, float top) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0.0f || !std::isfinite(amax)) return -127;
  int s = int(std::ceil(std::log2(amax / top)));
  while (std::ldexp(top, s) < amax) ++s;  // log2 rounding at the edges
  while (std::ldexp(top, s - 1) >= amax) --s;
  return std::clamp(s, -127, 127);
}

// Rounds a row of n values (n % 32 == 0) in place to MXFP4: per block of 32, E2M1 times 2^s.
inline void mxfp4_round_row(float* x, int n) {
  for (int b = 0; b < n; b += 32) {
    const int s = pow2_scale_exponent(x + b, 32, 6.0f);
    for (int i = b; i < b + 32; ++i) x[i] = std::ldexp(kFp4Values[f32_to_e2m1(std::ldexp(x[i], -s))], s);
  }
}

// A row of n values (n % 32 == 0) packed as the checkpoint stores MXFP4 (core/mxfp4.h): blocks
// n / 2 bytes (low nibble = even element), scales n / 32 E8M0 bytes. Decodes to mxfp4_round_row's values.
inline void mxfp4_pack_row(const float* x, int n, uint8_t* blocks, uint8_t* scales) {
  for (int b = 0; b < n; b += 32) {
    const int s = pow2_scale_exponent(x + b, 32, 6.0f);
    scales[b / 32] = uint8_t(s + 127);
    for (int j = 0; j < 16; ++j)
      blocks[b / 2 + j] = uint8_t(f32_to_e2m1(std::ldexp(x[b + 2 * j], -s)) |
                                  (f32_to_e2m1(std::ldexp(x[b + 2 * j + 1], -s)) << 4));
  }
}

// A row as E4M3 codes and its scale exponent s (value = e4m3 * 2^s). Decodes to fp8_round_row's values.
inline int fp8_pack_row(const float* x, int n, uint8_t* codes) {
  const int s = pow2_scale_exponent(x, n, 448.0f);
  for (int i = 0; i < n; ++i) codes[i] = f32_to_e4m3(std::ldexp(x[i], -s));
  return s;
}

// Rounds a row in place to E4M3 times the row's power-of-two scale.
inline void fp8_round_row(float* x, int n) {
  const int s = pow2_scale_exponent(x, n, 448.0f);
  for (int i = 0; i < n; ++i) x[i] = std::ldexp(e4m3_round(std::ldexp(x[i], -s)), s);
}

}  // namespace mx
