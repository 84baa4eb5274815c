// The tile-packed MXFP4 layout (kernels/mxfp4_layout/mxfp4_tiles.h): the offsets are a permutation of
// each tile that the segment walk of the decode pipes reproduces, and the GPU repack equals the CPU
// reference byte for byte (tolerance: exact, it is data movement).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/mxfp4_layout/mxfp4_tiles.h"
#include "tests/kernels/gpu_test_util.h"

namespace mx::cuda {
namespace {

using test::DevBuf;
using test::random_u8;

// groups % 4 = 1, 2, 3, 0, and K = 6144 (a tile past 48 KB of shared memory).
const int kKs[] = {32, 64, 96, 128, 2880, 6144};

TEST(Mxfp4Tiles, OffsetsPermuteEachTileInvertAndMatchTheSegmentWalk) {
  for (int K : kKs) {
    const int groups = K / 32, full = groups / 4;
    const size_t rows = 48;
    std::vector<int> seen(rows * groups, 0);
    for (size_t r = 0; r < rows; ++r)
      for (int G = 0; G < groups; ++G) {
        const size_t o = mxfp4_tile_off(r, G, groups);
        ASSERT_LT(o, rows * groups);
        EXPECT_EQ(o / (16 * groups), r / 16) << "K " << K << " row " << r << " group " << G;  // stays in its tile
        ++seen[o];
        int rr = -1, gg = -1;
        mxfp4_tile_at(int(o % (16 * groups)), groups, rr, gg);  // the inverse
        EXPECT_EQ(rr, int(r % 16));
        EXPECT_EQ(gg, G);
        const int s = G / 4;
        const size_t walk = mxfp4_row_base(r, groups) + s * 64 + G % 4 - (s < full ? 0 : mxfp4_tail_fix(r, groups));
        EXPECT_EQ(walk, o) << "K " << K << " row " << r << " group " << G;
      }
    for (int n : seen) ASSERT_EQ(n, 1) << "K " << K;
  }
}

TEST(Mxfp4Tiles, FullSegmentsAreOneKilobyteOfSixteenRows) {
  const int groups = 90;  // gpt-oss: K = 2880
  for (int s = 0; s < 22; ++s)
    for (int r = 0; r < 16; ++r)
      for (int q = 0; q < 4; ++q) EXPECT_EQ(mxfp4_tile_off(16 + r, 4 * s + q, groups), 16u * groups + 64 * s + 4 * r + q);
  for (int r = 0; r < 16; ++r)  // the last segment: two groups a row
    for (int q = 0; q < 2; ++q) EXPECT_EQ(mxfp4_tile_off(r, 88 + q, groups), 22u * 64 + 2 * r + q);
}

TEST(Mxfp4Tiles, GpuRepackEqualsReference) {
  std::mt19937 rng(11);
  for (int K : kKs) {
    const size_t rows = K > 2880 ? 32 : 80;
    auto blocks = random_u8(rows * K / 2, rng), scales = random_u8(rows * K / 32, rng);
    DevBuf<uint8_t> db(blocks), ds(scales);
    mxfp4_pack_tiles(db.p, ds.p, rows, K, nullptr);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    mxfp4_pack_tiles_ref(blocks.data(), scales.data(), rows, K);
    EXPECT_EQ(db.get(), blocks) << "K " << K;
    EXPECT_EQ(ds.get(), scales) << "K " << K;
  }
}

TEST(Mxfp4Tiles, RejectsShapesItCannotPack) {
  DevBuf<uint8_t> b(24 * 64 / 2), s(24 * 64 / 32);
  EXPECT_THROW(mxfp4_pack_tiles(b.p, s.p, 24, 64, nullptr), Error);  // not a whole tile
  EXPECT_THROW(mxfp4_pack_tiles(b.p, s.p, 16, 48, nullptr), Error);  // K not a multiple of 32
  std::vector<uint8_t> hb(16 * 48 / 2), hs(2);
  EXPECT_THROW(mxfp4_pack_tiles_ref(hb.data(), hs.data(), 16, 48), Error);
}

}  // namespace
}  // namespace mx::cuda
