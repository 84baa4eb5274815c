// The tile-packed layout of the MXFP4 expert weights on the GPU.
//
// The checkpoint stores an expert matrix [N rows, K/32 groups] as blocks [N, K/32, 16 bytes] and
// scales [N, K/32] (E8M0). Every MXFP4 kernel has one warp read a 16-row tile 128 values (4 groups,
// a "segment") at a time, rows g and g + 8 per lane: in the checkpoint layout one warp load then
// touches eight 64-byte pieces 1,440 bytes apart, and HBM streams that pattern at ~2.3 TB/s; read
// as 1 KB contiguous pieces the same bytes stream ~10 % faster (docs/perf.md, sessions 12, 14, 15).
// So the engine repacks each 16-row tile once at load, in place (a tile occupies the same bytes in
// both layouts):
//   tile T (rows 16T .. 16T + 15) = [segment s][row r of 16][the segment's groups of that row]
// A full segment holds 4 groups a row (16 rows x 64 bytes of blocks = 1 KB, 16 x 4 scale bytes);
// the last segment holds the K/32 % 4 groups left over (rows packed as densely), so nothing is padded
// and the buffers keep their checkpoint sizes. Scales follow the same order as the blocks, one byte
// a group where the blocks have 16.
//
// Offsets are in groups ("units": 16 bytes of blocks or 1 byte of scales). N must be a multiple of 16
// (gpt-oss: N = 2 I or H, multiples of 32 by the config's checks).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

namespace mx::cuda {

constexpr int kMxfp4TileRows = 16;
constexpr int kMxfp4SegGroups = 4;

// Unit offset of group G of row r of a [N, groups] matrix in the tile-packed layout.
__host__ __device__ inline size_t mxfp4_tile_off(size_t r, int G, int groups) {
  const int full = groups / kMxfp4SegGroups, rem = groups % kMxfp4SegGroups;
  const int seg = G / kMxfp4SegGroups, rr = int(r % kMxfp4TileRows);
  const int width = seg < full ? kMxfp4SegGroups : rem;
  return (r / kMxfp4TileRows) * kMxfp4TileRows * size_t(groups) + size_t(seg) * kMxfp4TileRows * kMxfp4SegGroups +
         size_t(rr) * width + G % kMxfp4SegGroups;
}

// Readers that walk a row segment by segment keep the row's base (its tile's start plus 4 units a
// row above it) and add seg * 64 + (G % 4); in the last, partial segment the rows above are only
// `rem` units wide, so subtract mxfp4_tail_fix(row, groups) there.
__host__ __device__ inline size_t mxfp4_row_base(size_t r, int groups) {
  return (r / kMxfp4TileRows) * kMxfp4TileRows * size_t(groups) + (r % kMxfp4TileRows) * kMxfp4SegGroups;
}
__host__ __device__ inline int mxfp4_tail_fix(size_t r, int groups) {
  return int(r % kMxfp4TileRows) * (kMxfp4SegGroups - groups % kMxfp4SegGroups);
}

// The inverse within a tile: unit w (< 16 groups) of a packed tile holds group G of tile row r.
__host__ __device__ inline void mxfp4_tile_at(int w, int groups, int& r, int& G) {
  const int full = groups / kMxfp4SegGroups, rem = groups % kMxfp4SegGroups;
  const int seg = w / (kMxfp4TileRows * kMxfp4SegGroups);
  if (seg < full) {
    r = (w / kMxfp4SegGroups) % kMxfp4TileRows;
    G = seg * kMxfp4SegGroups + w % kMxfp4SegGroups;
  } else {
    const int v = w - full * kMxfp4TileRows * kMxfp4SegGroups;
    r = v / rem;
    G = full * kMxfp4SegGroups + v % rem;
  }
}

// Repacks `rows` rows (a multiple of 16) of MXFP4 blocks [rows, K/32, 16] and scales [rows, K/32]
// from the checkpoint layout into the tile-packed one, in place, on `s`.
void mxfp4_pack_tiles(uint8_t* blocks, uint8_t* scales, size_t rows, int K, cudaStream_t s);

// CPU reference of the same (host buffers).
void mxfp4_pack_tiles_ref(uint8_t* blocks, uint8_t* scales, size_t rows, int K);

}  // namespace mx::cuda
