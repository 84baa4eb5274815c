// CPU reference of the tile repack (mxfp4_tiles.h): the tests compare the GPU repack with it byte for byte.
#include <cstring>
#include <vector>

#include "kernels/common/cuda_check.h"
#include "kernels/mxfp4_layout/mxfp4_tiles.h"

namespace mx::cuda {

void mxfp4_pack_tiles_ref(uint8_t* blocks, uint8_t* scales, size_t rows, int K) {
  if (rows % kMxfp4TileRows || K <= 0 || K % 32) throw_error("mxfp4 tiles ref: rows must be a multiple of 16 and K a positive multiple of 32");
  const int groups = K / 32, n = kMxfp4TileRows * groups;
  std::vector<uint8_t> b(size_t(n) * 16), sc(n);
  for (size_t t = 0; t < rows / kMxfp4TileRows; ++t) {
    uint8_t* tb = blocks + t * n * 16;
    uint8_t* ts = scales + t * n;
    std::memcpy(b.data(), tb, b.size());
    std::memcpy(sc.data(), ts, sc.size());
    for (int i = 0; i < n; ++i) {
      const size_t o = mxfp4_tile_off(size_t(i / groups), i % groups, groups);
      std::memcpy(tb + o * 16, &b[size_t(i) * 16], 16);
      ts[i] = sc[i];
    }
  }
}

}  // namespace mx::cuda
