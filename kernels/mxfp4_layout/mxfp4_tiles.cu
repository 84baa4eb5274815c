// In-place repack of MXFP4 expert tiles into the tile-packed layout (mxfp4_tiles.h), once at load.
#include "kernels/mxfp4_layout/mxfp4_tiles.h"

#include <string>

#include "kernels/common/cuda_check.h"

namespace mx::cuda {
namespace {

// One CTA a 16-row tile: its blocks and scales are read whole into shared memory, then written back
// in the packed order over the same bytes.
__global__ void __launch_bounds__(256) pack_tiles_k(uint8_t* blocks, uint8_t* scales, int groups) {
  extern __shared__ __align__(16) uint4 tile_sm[];
  const int n = kMxfp4TileRows * groups;
  uint4* b = reinterpret_cast<uint4*>(blocks) + size_t(blockIdx.x) * n;
  uint8_t* sc = scales + size_t(blockIdx.x) * n;
  uint8_t* ssm = reinterpret_cast<uint8_t*>(tile_sm + n);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    tile_sm[i] = b[i];
    ssm[i] = sc[i];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const size_t o = mxfp4_tile_off(size_t(i / groups), i % groups, groups);
    b[o] = tile_sm[i];
    sc[i] = ssm[i];
  }
}

void check_shape(size_t rows, int K) {
  if (rows % kMxfp4TileRows) throw_error("mxfp4 tiles: the row count must be a multiple of 16, got " + std::to_string(rows));
  if (K <= 0 || K % 32) throw_error("mxfp4 tiles: K must be a positive multiple of 32, got " + std::to_string(K));
}

}  // namespace

void mxfp4_pack_tiles(uint8_t* blocks, uint8_t* scales, size_t rows, int K, cudaStream_t s) {
  check_shape(rows, K);
  if (rows == 0) return;
  const int groups = K / 32;
  const size_t smem = size_t(kMxfp4TileRows) * groups * 17;
  if (smem > 48 * 1024) MX_CUDA(cudaFuncSetAttribute(pack_tiles_k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  pack_tiles_k<<<unsigned(rows / kMxfp4TileRows), 256, smem, s>>>(blocks, scales, groups);
  MX_CUDA(cudaGetLastError());
}

}  // namespace mx::cuda
