// MXFP4 (OCP microscaling, E2M1 values + E8M0 block scale over 32 elements) on the host.
// Layout of the HF checkpoint: blocks[..., G, 16] bytes, low nibble = element 2j, high = 2j+1;
// scales[..., G] bytes, multiplier 2^(s-127). See docs/gpt-oss-spec.md section 3.4.
#pragma once
#include <cmath>
#include <cstdint>

namespace mx {

inline constexpr float kFp4Values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

inline float e8m0_to_f32(uint8_t s) { return std::ldexp(1.0f, int(s) - 127); }

// Decode one row of K elements (K % 32 == 0): blocks = K/2 bytes, scales = K/32 bytes.
inline void mxfp4_decode_row(const uint8_t* blocks, const uint8_t* scales, int K, float* out) {
  for (int g = 0; g < K / 32; ++g) {
    float m = e8m0_to_f32(scales[g]);
    for (int j = 0; j < 16; ++j) {
      uint8_t b = blocks[g * 16 + j];
      out[g * 32 + 2 * j] = kFp4Values[b & 0x0f] * m;
      out[g * 32 + 2 * j + 1] = kFp4Values[b >> 4] * m;
    }
  }
}

}  // namespace mx
