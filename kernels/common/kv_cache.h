// The paged KV cache as every writer and reader sees it: one layer's K and V arrays, their element type
// and page size. A row is one token of one layer, Hkv * D values; row = block * block_size + offset.
// Kernels take a KvLayer, never raw pointers, so the element type travels with the arrays and each
// kernel checks it (require_kv).
//
// FP8 (--kv-cache-dtype fp8): each value is E4M3 (core/fp8.h: round to nearest even, saturating at
// 448) with a scale of one, so a row is Hkv * D bytes and dequantizes exactly to bf16 / f16 / fp32.
// docs/equivalence.md says why no per-row scale.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/common/cuda_check.h"

namespace mx::cuda {

enum class KvDtype : int32_t { kBf16 = 0, kFp8E4m3 = 1 };

inline size_t kv_dtype_bytes(KvDtype t) { return t == KvDtype::kBf16 ? 2 : t == KvDtype::kFp8E4m3 ? 1 : 0; }
inline const char* kv_dtype_name(KvDtype t) {
  return t == KvDtype::kBf16 ? "bf16" : t == KvDtype::kFp8E4m3 ? "fp8 e4m3" : "unknown";
}

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
  __host__ __device__ bool fp8() const { return dtype == KvDtype::kFp8E4m3; }
  __host__ __device__ uint16_t* k_bf16() const { return static_cast<uint16_t*>(k); }
  __host__ __device__ uint16_t* v_bf16() const { return static_cast<uint16_t*>(v); }
  __host__ __device__ uint8_t* k_fp8() const { return static_cast<uint8_t*>(k); }
  __host__ __device__ uint8_t* v_fp8() const { return static_cast<uint8_t*>(v); }
};

// Every kernel that touches the cache checks its format (all of them read and write bf16 and fp8).
inline void require_kv(const KvLayer& kv, const char* kernel) {
  if (kv.dtype != KvDtype::kBf16 && kv.dtype != KvDtype::kFp8E4m3)
    throw_error(std::string(kernel) + ": KV cache dtype " + kv_dtype_name(kv.dtype) + " is not supported");
  if (!kv.k || !kv.v) throw_error(std::string(kernel) + ": KV cache arrays not set");
}

}  // namespace mx::cuda
