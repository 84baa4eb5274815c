// FP8 E4M3 (OCP 8-bit floating point: 4 exponent bits, bias 7, 3 mantissa bits, no infinities,
// S.1111.111 is NaN, largest finite 448) and MXFP8 blocks (OCP Microscaling: 32 consecutive values
// share one E8M0 power-of-two scale). The FP8 KV cache stores each token's K and V rows this way;
// these host functions define its numerics (the CPU reference rounds through them).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace mx {

inline float e4m3_to_f32(uint8_t v) {
  const int sign = v >> 7, exp = (v >> 3) & 0xF, man = v & 0x7;
  float f;
  if (exp == 0xF && man == 0x7) f = NAN;
  else if (exp == 0) f = std::ldexp(float(man), -9);  // subnormal: man / 8 * 2^-6
  else f = std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
  return sign ? -f : f;
}

// Round to nearest, ties to even; magnitudes past 448 saturate to 448 (as OCP MX conversion does);
// NaN stays NaN. Non-negative codes 0x00..0x7E are in value order, so the rounding is a search.
inline uint8_t f32_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7E;
  int lo = 0, hi = 0x7E;  // value(lo) <= a < value(hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (e4m3_to_f32(uint8_t(mid)) <= a ? lo : hi) = mid;
  }
  const float dl = a - e4m3_to_f32(uint8_t(lo)), dh = e4m3_to_f32(uint8_t(hi)) - a;
  const int code = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);  // a tie: the even mantissa
  return sign | uint8_t(code);
}

// MXFP8 block scale: the E8M0 exponent s of 32 (or fewer) values, the smallest with
// max |x| <= 448 * 2^s, so no value saturates (OCP MX's floor(log2(max)) - 8 would clip a block's
// largest values in [448, 512) * 2^s by up to 12 %; this costs at most one bit at the bottom).
inline int mxfp8_scale_exponent(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0.0f || !std::isfinite(amax)) return -127;
  int e;
  std::frexp(amax, &e);  // amax in [2^(e-1), 2^e), so amax / 2^(e-9) in [256, 512)
  const int s = amax > std::ldexp(448.0f, e - 9) ? e - 8 : e - 9;
  return std::clamp(s, -127, 127);
}

// Rounds n values in place to MXFP8 E4M3: blocks of 32 consecutive values (the last may be shorter),
// each quantized with its block's power-of-two scale and restored.
inline void mxfp8_round(float* x, int n) {
  for (int b = 0; b < n; b += 32) {
    const int m = std::min(32, n - b);
    const int s = mxfp8_scale_exponent(x + b, m);
    for (int i = 0; i < m; ++i) x[b + i] = std::ldexp(e4m3_to_f32(f32_to_e4m3(std::ldexp(x[b + i], -s))), s);
  }
}

}  // namespace mx
