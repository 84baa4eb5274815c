// The tensors a gpt-oss checkpoint must hold (HF layout), derived from the config.
// Shared by the checkpoint validator and the fixture writer so the two cannot drift.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace mx {

enum class DType : uint8_t { kBF16, kF16, kF32, kF64, kU8, kI8, kU16, kI16, kU32, kI32, kU64, kI64, kBool, kF8E4M3, kF8E5M2 };

// Safetensors dtype string <-> DType. parse returns false on an unknown string.
bool parse_dtype(const std::string& s, DType* out);
const char* dtype_name(DType d);
int dtype_size(DType d);

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// In checkpoint order: embed, then per layer (norms, attention, router, experts), then norm, lm_head.
std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg);

std::string shape_str(const std::vector<int64_t>& shape);  // "[128, 5760, 90, 16]"

}  // namespace mx
