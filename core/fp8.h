// FP8 E4M3 (OCP 8-bit floating point: 4 exponent bits, bias 7, 3 mantissa bits, no infinities,
// S.1111.111 is NaN, largest finite 448). The FP8 KV cache stores each K and V value this way; these
// host functions define its numerics (the CPU reference rounds through them, the CUDA kernels' hardware
// conversions match them bit for bit).
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

// A value as the FP8 KV cache stores it (a scale of one, kv_cache.h): E4M3 rounded and widened back.
inline float e4m3_round(float x) { return e4m3_to_f32(f32_to_e4m3(x)); }

}  // namespace mx
