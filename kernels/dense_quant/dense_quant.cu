// Dense weight quantization on the GPU (dense_quant.h): bf16 rows to MXFP4 / FP8 at load, bit for bit as
// core/dense_quant.h does on the host, and the exact widening back to bf16 for the prefill GEMMs.
// core/dense_quant.h is host C++ (<cmath>), so its numerics are restated here in device code.
#include "kernels/dense_quant/dense_quant.h"

#include <cuda_bf16.h>

#include <string>

#include "kernels/common/cuda_check.h"
#include "kernels/common/device_math.cuh"
#include "kernels/common/kv_fp8.cuh"

namespace mx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowThreads = 128;  // one CTA per row: 2880 / 8 = 360 groups of 8 are 3 near-full passes

// pow2_scale_exponent on an amax: the smallest s in [-127, 127] with amax <= top * 2^s; -127 for zero or
// a non-finite amax. log2f only seeds s; the loops make it exact whatever log2f's rounding.
// (fmaxf drops NaN like std::max(amax, NaN) does on the host, so NaN never reaches amax.)
__device__ int pow2_exponent(float amax, float top) {
  if (amax == 0.0f || !isfinite(amax)) return -127;
  int s = int(ceilf(log2f(amax / top)));
  while (ldexpf(top, s) < amax) ++s;
  while (ldexpf(top, s - 1) >= amax) --s;
  return min(max(s, -127), 127);
}

// f32_to_e2m1 of x * inv for a bf16 x: the thresholds are the midpoints between E2M1 values, strict where
// a tie goes down to the even code; NaN and |.| >= 6 give 7. The sign comes from x's own bit because a
// scaled NaN's sign is not preserved by GPU arithmetic (the host's ldexp keeps it).
__device__ __forceinline__ uint32_t bf16_to_e2m1(uint16_t h, float inv) {
  const float a = fabsf(bf(h)) * inv;  // exact scaling by a power of two (rounds only on underflow, as ldexp)
  const uint32_t code = a < 6.0f ? (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                                       (a >= 3.5f) + (a > 5.0f)
                                 : 7u;
  return code | uint32_t(h >> 15) << 3;
}

// kFp4Values[c] from the code's bits: magnitudes 2..7 are 2^(e-1) * (1 + m/2), 1 is 0.5 (no table
// lookup: a per-lane index into constant memory would serialize the warp).
__device__ __forceinline__ float e2m1_value(uint32_t c) {
  const uint32_t mag = c & 7;
  const uint32_t bits = mag >= 2 ? ((mag >> 1) + 126) << 23 | (mag & 1) << 22 : mag ? 0x3F000000u : 0u;
  return __uint_as_float(bits | (c & 8) << 28);
}

// 2^(e - 127) exactly (e8m0_to_f32): e = 0 is the subnormal 2^-127, 255 gives inf like ldexp(1, 128).
__device__ __forceinline__ float e8m0_value(uint32_t e) { return __uint_as_float(e ? e << 23 : 0x00400000u); }

// A float as bf16 bits, and two as bf16x2 (first in the low half); round to nearest even.
__device__ __forceinline__ uint16_t bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return uint32_t(__bfloat16_as_ushort(h.x)) | uint32_t(__bfloat16_as_ushort(h.y)) << 16;
}

// MXFP4: a thread per pair of values (one output byte), 16 lanes per 32-value block. src / data / scales
// start at the first row; n_pairs = rows * K / 2 is a multiple of 16, so a half-warp is one whole block.
__global__ void quantize_mxfp4_k(const uint16_t* src, long long n_pairs, uint8_t* data, uint8_t* scales) {
  const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const bool in = p < n_pairs;
  const uint16_t h0 = in ? src[2 * p] : 0, h1 = in ? src[2 * p + 1] : 0;
  float amax = fmaxf(fabsf(bf(h0)), fabsf(bf(h1)));
  for (int o = 8; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));  // within the half-warp
  if (!in) return;
  const int s = pow2_exponent(amax, 6.0f);
  const float inv = ldexpf(1.0f, -s);  // 2^-s, exact (2^-127 is a float subnormal)
  data[p] = uint8_t(bf16_to_e2m1(h0, inv) | bf16_to_e2m1(h1, inv) << 4);
  if ((p & 15) == 0) scales[p >> 4] = uint8_t(s + 127);
}

// FP8: one CTA per row (the scale is the whole row's); the second pass re-reads the row from L1/L2.
__global__ void quantize_fp8_k(const uint16_t* src, int K, uint8_t* data, float* row_scale) {
  const uint16_t* x = src + size_t(blockIdx.x) * K;
  float amax = 0.0f;
  for (int k = threadIdx.x; k < K; k += blockDim.x) amax = fmaxf(amax, fabsf(bf(x[k])));
  __shared__ float part[kThreads / 32];
  amax = warp_max(amax);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) amax = fmaxf(amax, part[w]);
  const int s = pow2_exponent(amax, 448.0f);
  const float inv = ldexpf(1.0f, -s);
  if (threadIdx.x == 0) row_scale[blockIdx.x] = ldexpf(1.0f, s);
  uint8_t* out = data + size_t(blockIdx.x) * K;
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    const float v = bf(x[k]) * inv;  // |v| <= 448 by construction, so only NaN and inf are special
    // f32_to_e4m3's NaN is 0x7F whatever the sign; sm_90's cvt gives that too (seen), kept explicit for
    // other archs' conversion paths. +-inf saturates to 0x7E / 0xFE like the host.
    out[k] = isnan(v) ? uint8_t(0x7F) : kv_to_e4m3(v);
  }
}

// MXFP4 to bf16, vectorized: a thread per 8 data bytes (half a block, one scale) -> 16 values, 2 x 16 B.
__global__ void dequantize_mxfp4_vec_k(const uint2* data, const uint8_t* scales, uint4* out, long long n) {
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const uint2 d = data[t];
  const float m = e8m0_value(scales[t >> 1]);
  uint32_t w[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t b = ((i < 4 ? d.x : d.y) >> (8 * (i % 4))) & 0xFF;
    w[i] = bf16x2_bits(e2m1_value(b & 15) * m, e2m1_value(b >> 4) * m);  // exact products (<= 3 bits)
  }
  out[2 * t] = make_uint4(w[0], w[1], w[2], w[3]);
  out[2 * t + 1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// MXFP4 to bf16 for unaligned pointers: a thread per data byte.
__global__ void dequantize_mxfp4_scalar_k(const uint8_t* data, const uint8_t* scales, uint16_t* out, long long n) {
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const uint32_t b = data[t];
  const float m = e8m0_value(scales[t >> 4]);
  out[2 * t] = bf16_bits(e2m1_value(b & 15) * m);
  out[2 * t + 1] = bf16_bits(e2m1_value(b >> 4) * m);
}

// FP8 to bf16: one CTA per row (its scale). VEC: 8 codes (8 B) -> 8 bf16 (16 B) per step, needs K % 8 == 0
// and aligned pointers; otherwise a value per step.
template <bool VEC>
__global__ void dequantize_fp8_k(const uint8_t* data, const float* row_scale, int K, uint16_t* out) {
  const uint8_t* in = data + size_t(blockIdx.x) * K;
  uint16_t* o = out + size_t(blockIdx.x) * K;
  const float sc = row_scale[blockIdx.x];
  if (VEC) {
    for (int g = threadIdx.x; g < K / 8; g += blockDim.x) {
      const uint2 d = reinterpret_cast<const uint2*>(in)[g];
      uint32_t w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = e4m3x2_to_float2(((i < 2 ? d.x : d.y) >> (16 * (i % 2))) & 0xFFFF);  // exact
        w[i] = bf16x2_bits(f.x * sc, f.y * sc);  // exact in fp32; bf16 rounds only below its subnormals
      }
      reinterpret_cast<uint4*>(o)[g] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  } else {
    for (int k = threadIdx.x; k < K; k += blockDim.x) o[k] = bf16_bits(e4m3x2_to_float2(in[k]).x * sc);
  }
}

unsigned blocks_for(long long n, int threads) { return unsigned((n + threads - 1) / threads); }
bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

void check_shape(const char* what, DenseFormat fmt, int rows, int K) {
  if (rows < 0 || K <= 0)
    throw_error(std::string(what) + ": bad shape rows=" + std::to_string(rows) + " K=" + std::to_string(K));
  if (fmt == DenseFormat::kMxfp4 && K % 32)
    throw_error(std::string(what) + ": MXFP4 needs K % 32 == 0, got K=" + std::to_string(K));
}

}  // namespace

void quantize_dense_rows(const uint16_t* src, int rows, int K, const DenseWeightOut& dst, size_t row0, cudaStream_t s) {
  if (dst.fmt == DenseFormat::kBf16) throw_error("quantize_dense_rows: bf16 is not a quantized format (copy instead)");
  check_shape("quantize_dense_rows", dst.fmt, rows, K);
  if (rows == 0) return;
  if (dst.fmt == DenseFormat::kMxfp4) {
    const long long n_pairs = (long long)rows * K / 2;
    quantize_mxfp4_k<<<blocks_for(n_pairs, kThreads), kThreads, 0, s>>>(src, n_pairs, dst.data + row0 * (K / 2),
                                                                        dst.scales + row0 * (K / 32));
  } else {
    quantize_fp8_k<<<rows, kThreads, 0, s>>>(src, K, dst.data + row0 * K, dst.row_scale + row0);
  }
  MX_CUDA(cudaGetLastError());
}

void dequantize_dense_rows(const DenseWeight& w, size_t row0, int rows, int K, uint16_t* dst, cudaStream_t s) {
  check_shape("dequantize_dense_rows", w.fmt, rows, K);
  if (rows == 0) return;
  const DenseWeight r = w.rows_from(row0, K);
  if (r.fmt == DenseFormat::kBf16) {
    MX_CUDA(cudaMemcpyAsync(dst, r.data, size_t(rows) * K * 2, cudaMemcpyDeviceToDevice, s));
    return;
  }
  if (r.fmt == DenseFormat::kMxfp4) {
    const long long bytes = (long long)rows * K / 2;
    if (aligned(r.data, 8) && aligned(dst, 16))
      dequantize_mxfp4_vec_k<<<blocks_for(bytes / 8, kThreads), kThreads, 0, s>>>(
          static_cast<const uint2*>(r.data), r.mx_scales(), reinterpret_cast<uint4*>(dst), bytes / 8);
    else
      dequantize_mxfp4_scalar_k<<<blocks_for(bytes, kThreads), kThreads, 0, s>>>(r.bytes(), r.mx_scales(), dst, bytes);
  } else if (K % 8 == 0 && aligned(r.data, 8) && aligned(dst, 16)) {
    dequantize_fp8_k<true><<<rows, kRowThreads, 0, s>>>(r.bytes(), r.row_scale(), K, dst);
  } else {
    dequantize_fp8_k<false><<<rows, kRowThreads, 0, s>>>(r.bytes(), r.row_scale(), K, dst);
  }
  MX_CUDA(cudaGetLastError());
}

}  // namespace mx::cuda
