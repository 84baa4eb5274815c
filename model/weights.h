// Host-side typed views of the gpt-oss weights (pointers into the mapped checkpoint, or into
// buffers the caller owns). Shapes are HF's: Linear weights [out, in]; MXFP4 experts as
// blocks [E, out, in/32, 16] + scales [E, out, in/32]. bf16 is stored as uint16_t.
#pragma once
#include <cstdint>
#include <vector>

#include "model/checkpoint.h"
#include "model/config.h"

namespace mx {

struct LayerWeights {
  const uint16_t* attn_norm;       // [H]
  const uint16_t* q_w;             // [Hq*D, H]
  const uint16_t* q_b;             // [Hq*D]
  const uint16_t* k_w;             // [Hkv*D, H]
  const uint16_t* k_b;             // [Hkv*D]
  const uint16_t* v_w;             // [Hkv*D, H]
  const uint16_t* v_b;             // [Hkv*D]
  const uint16_t* o_w;             // [H, Hq*D]
  const uint16_t* o_b;             // [H]
  const uint16_t* sinks;           // [Hq]
  const uint16_t* mlp_norm;        // [H]
  const uint16_t* router_w;        // [E, H]
  const uint16_t* router_b;        // [E]
  const uint8_t* gate_up_blocks;   // [E, 2I, H/32, 16]  rows interleaved: even = gate, odd = up
  const uint8_t* gate_up_scales;   // [E, 2I, H/32]
  const uint16_t* gate_up_bias;    // [E, 2I]
  const uint8_t* down_blocks;      // [E, H, I/32, 16]
  const uint8_t* down_scales;      // [E, H, I/32]
  const uint16_t* down_bias;       // [E, H]
};

struct ModelWeights {
  const uint16_t* embed;           // [V, H]
  const uint16_t* final_norm;      // [H]
  const uint16_t* lm_head;         // [V, H]
  std::vector<LayerWeights> layers;
};

// Validates the checkpoint against the config (Checkpoint::validate) and binds the views.
ModelWeights bind_weights(const Checkpoint& ckpt, const ModelConfig& cfg);

}  // namespace mx
