// bf16 <-> fp32 on the host. Round-to-nearest-even, NaN preserved (quiet).
#pragma once
#include <cstdint>
#include <cstring>

namespace mx {

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Round an fp32 value through bf16 (what a bf16 store then load does).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

}  // namespace mx
