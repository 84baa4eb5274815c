// Which dense layers run quantized (--mxfp4-layers, --fp8-layers) and, for the CPU reference, the
// quantization applied at load: each chosen bf16 tensor is copied with every value rounded as
// core/dense_quant.h says (the rounded values are exact in bf16), and the weights point at the copy.
// The checkpoint stays as downloaded; the default is bf16, exact to it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dense_format.h"
#include "model/config.h"
#include "model/weights.h"

namespace mx {

const char* dense_format_name(DenseFormat f);

struct DenseQuant {
  DenseFormat qkv = DenseFormat::kBf16, o = DenseFormat::kBf16, lm_head = DenseFormat::kBf16;
  bool any() const;
  std::string describe() const;  // e.g. "qkv mxfp4, o mxfp4, lm_head bf16"
};

// The two flags' values (none | all | a comma list of qkv, o, lm_head); fails with one line naming the
// flag for an unknown or empty name, or a layer named in both.
DenseQuant parse_dense_quant(const std::string& mxfp4_layers, const std::string& fp8_layers);

// Rounds the chosen tensors into `storage` (owned copies) and points `w` at them.
void apply_dense_quant(const DenseQuant& q, const ModelConfig& cfg, ModelWeights& w,
                       std::vector<std::vector<uint16_t>>& storage);

}  // namespace mx
