// The paged KV cache as every writer and reader sees it: one layer's K and V arrays, their element type
// and page size. A row is one token of one layer, Hkv * D values; row = block * block_size + offset.
// Kernels take a KvLayer, never raw pointers, so a new element type (an FP8 cache with per-layer
// scales) changes this header and the kernels that check it, not every parameter struct.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/common/cuda_check.h"

namespace mx::cuda {

enum class KvDtype : int32_t { kBf16 = 0 };

inline size_t kv_dtype_bytes(KvDtype t) { return t == KvDtype::kBf16 ? 2 : 0; }
inline const char* kv_dtype_name(KvDtype t) { return t == KvDtype::kBf16 ? "bf16" : "unknown"; }

// The whole cache's format: what the memory plan sizes and what each layer's view carries.
struct KvCacheSpec {
  KvDtype dtype = KvDtype::kBf16;
  int block_size = 16;  // tokens a page
  int row_elems = 0;    // Hkv * D values a row
  size_t row_bytes() const { return size_t(row_elems) * kv_dtype_bytes(dtype); }
  size_t page_bytes() const { return size_t(block_size) * row_bytes(); }  // one page of K (or of V)
};

// One layer's K and V arrays (each [rows, Hkv * D] of `dtype`).
struct KvLayer {
  void* k = nullptr;
  void* v = nullptr;
  KvDtype dtype = KvDtype::kBf16;
  int block_size = 16;
  // Dequantization scales of a quantized cache (per layer); null: values are stored as they are.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  __host__ __device__ uint16_t* k_bf16() const { return static_cast<uint16_t*>(k); }
  __host__ __device__ uint16_t* v_bf16() const { return static_cast<uint16_t*>(v); }
};

// Kernels that read or write bf16 rows only: a clear error for any other cache format.
inline void require_bf16_kv(const KvLayer& kv, const char* kernel) {
  if (kv.dtype != KvDtype::kBf16)
    throw_error(std::string(kernel) + ": KV cache dtype " + kv_dtype_name(kv.dtype) + " is not supported (bf16)");
  if (!kv.k || !kv.v) throw_error(std::string(kernel) + ": KV cache arrays not set");
}

}  // namespace mx::cuda
