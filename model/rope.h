// YaRN rotary embedding tables for gpt-oss (NeoX half-split rotation). Plain arrays so the CPU
// reference and the CUDA engine share one definition. See docs/gpt-oss-spec.md section 2.3.
#pragma once
#include "model/config.h"

namespace mx {

struct YarnParams {
  float low = 0, high = 0;       // ramp bounds in frequency-index units (unrounded unless truncate)
  float concentration = 1.0f;    // multiplies cos and sin (HF attention_factor = 0.1 ln s + 1)
};

// Fills inv_freq[head_dim / 2]; returns the ramp bounds and concentration.
YarnParams yarn_inv_freq(const ModelConfig& cfg, float* inv_freq);

// Rotates one head vector x[head_dim] in place at position pos (fp32, concentration included).
void rope_rotate_f32(float* x, int head_dim, int pos, const float* inv_freq, float concentration);

}  // namespace mx
