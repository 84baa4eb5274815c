// The storage format of a dense weight matrix (--mxfp4-layers, --fp8-layers); core/dense_quant.h has
// the numerics. Shared by the CPU reference and the CUDA kernels (C++17).
#pragma once
#include <cstdint>

namespace mx {

enum class DenseFormat : uint8_t { kBf16, kMxfp4, kFp8 };

}  // namespace mx
