// The FP8 MoE's entry points (moe_prefill.h): the activations' hi/lo rows, the weight rows' largest scales,
// and FC1 / FC2, which hand each tile height to its kernel family (moe_fp8_sparse.cu, moe_fp8_wide.cu; what
// they share, and why FP8 tensor cores: moe_fp8_device.cuh).
#include "kernels/moe_prefill/moe_prefill.h"

#include <atomic>

#include "kernels/common/cuda_check.h"
#include "kernels/decode/mma_tile.cuh"
#include "kernels/moe_prefill/moe_fp8_device.cuh"

namespace mx::cuda {
namespace {

using fp8_moe::e4m3_rn;
using fp8_moe::e4m3_to_f32;

// out[r] = max over row r's G E8M0 scales (once at load: a thread a row).
__global__ void row_max_k(const uint8_t* scales, size_t rows, int G, uint8_t* out) {
  const size_t r = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const uint8_t* sc = scales + r * G;
  uint32_t m = 0;
  for (int g = 0; g < G; ++g) m = max(m, uint32_t(sc[g]));
  out[r] = uint8_t(m);
}

// One token row -> its hi/lo rows (zeros past K) and 2^-xs; max |x| 2^xs < 256.
__global__ void quant_k(const uint16_t* x, int K, uint8_t* xq, float* xinv) {
  __shared__ float wmax[8];
  const int row = blockIdx.x, tid = threadIdx.x;
  const uint16_t* xr = x + size_t(row) * K;
  float m = 0.f;
  for (int i = tid; i < K; i += blockDim.x) m = fmaxf(m, fabsf(mma::bf16_lo(xr[i])));
  for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (tid % 32 == 0) wmax[tid / 32] = m;
  __syncthreads();
  m = 0.f;
  for (int w = 0; w < int(blockDim.x / 32); ++w) m = fmaxf(m, wmax[w]);
  int ex = 0;
  frexpf(m, &ex);
  const int xs = m > 0.f ? 8 - ex : 0;
  const float scale = ldexpf(1.f, xs);
  if (tid == 0) xinv[row] = ldexpf(1.f, -xs);
  const int Kp = moe_fp8_kpad(K);
  uint8_t* hi = xq + size_t(row) * 2 * Kp;
  for (int p4 = tid; p4 < Kp / 4; p4 += blockDim.x) {  // positions 4p4..4p4+3 hold 4 consecutive values
    const int pos = 4 * p4, v = moe_fp8_value(pos);
    uint32_t h = 0, l = 0;
    if (v < K) {
      const uint2 raw = *reinterpret_cast<const uint2*>(xr + v);
      const float f[4] = {mma::bf16_lo(raw.x), mma::bf16_hi(raw.x), mma::bf16_lo(raw.y), mma::bf16_hi(raw.y)};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float y = f[j] * scale;
        const uint8_t hb = e4m3_rn(y);
        h |= uint32_t(hb) << (8 * j);
        l |= uint32_t(e4m3_rn(y - e4m3_to_f32(hb))) << (8 * j);
      }
    }
    *reinterpret_cast<uint32_t*>(hi + pos) = h;
    *reinterpret_cast<uint32_t*>(hi + Kp + pos) = l;
  }
}

// Whether the sm_90a kernels exist in this binary: a build for plain sm_90 compiles their bodies empty.
__global__ void wgmma_probe_k(int* out) {
#ifdef MX_WGMMA
  *out = 1;
#else
  *out = 0;
#endif
}

// An sm_90 GPU and the sm_90a kernels for it (once per device: 1 no, 2 yes).
bool fp8_runs_here() {
  static std::atomic<int> cache[64];
  return per_device(cache, [](int dev) {
           int major = 0, minor = 0, has = 0;
           MX_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
           MX_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
           if (major == 9 && minor == 0) {
             int* d = nullptr;
             MX_CUDA(cudaMalloc(&d, sizeof(int)));
             wgmma_probe_k<<<1, 1>>>(d);
             MX_CUDA(cudaGetLastError());
             MX_CUDA(cudaMemcpy(&has, d, sizeof(int), cudaMemcpyDeviceToHost));
             MX_CUDA(cudaFree(d));
           }
           return has ? 2 : 1;
         }) == 2;
}

template <bool kFc1>
void launch_fp8(const MoeGemmPrefillParams& p, cudaStream_t s) {
  if (p.max_tiles <= 0) return;
  if (!moe_fp8_available()) throw_error("moe fp8: needs an sm_90 GPU (wgmma)");
  if (p.K % 32 || p.N % 2 || p.K <= 0 || p.N <= 0) throw_error("moe fp8: K must be a multiple of 32 and N even");
  const int most = device_smem_optin();
  if (!p.row_smax) throw_error("moe fp8: needs the rows' largest scales (moe_row_max_scale)");
  if (p.tile_rows == kMoeTileRowsSparse || p.tile_rows == kMoeTileRowsFp8Sparse) fp8_moe::launch_sparse<kFc1>(p, most, s);
  else if (p.tile_rows == kMoeTileRowsFp8Wide || p.tile_rows == kMoeTileRowsFp8Narrow) fp8_moe::launch_wide<kFc1>(p, most, s);
  else throw_error("moe fp8: tiles of 16, 24, 64 or 128 rows");
  MX_CUDA(cudaGetLastError());
}
}  // namespace

bool moe_fp8_available() { return fp8_runs_here(); }

void moe_quant_fp8(const uint16_t* x, int T, int K, uint8_t* xq, float* xinv, cudaStream_t s) {
  if (T <= 0) return;
  if (K % 32) throw_error("moe fp8: K must be a multiple of 32");
  quant_k<<<T, 256, 0, s>>>(x, K, xq, xinv);
  MX_CUDA(cudaGetLastError());
}
void moe_row_max_scale(const uint8_t* scales, size_t rows, int G, uint8_t* out, cudaStream_t s) {
  if (rows == 0) return;
  if (G <= 0) throw_error("moe_row_max_scale: G must be positive");
  row_max_k<<<unsigned((rows + 255) / 256), 256, 0, s>>>(scales, rows, G, out);
  MX_CUDA(cudaGetLastError());
}
void moe_fc1_fp8(const MoeGemmPrefillParams& p, cudaStream_t s) { launch_fp8<true>(p, s); }
void moe_fc2_fp8(const MoeGemmPrefillParams& p, cudaStream_t s) { launch_fp8<false>(p, s); }

}  // namespace mx::cuda
