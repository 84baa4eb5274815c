// Dense weight quantization on the GPU (kernels/dense_quant) against core/dense_quant.h. Label gpu.
// Everything is bit-exact: the quantizer must write the host's codes, scale bytes and row scales, and the
// dequantizer the host's decoded values rounded to bf16 (they are exact except below bf16's subnormals).
// The one allowance: an E4M3 NaN code decodes to some bf16 NaN (the GPU's canonical one, not x86's).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>

#include "core/dense_quant.h"
#include "core/error.h"
#include "kernels/dense_quant/dense_quant.h"
#include "tests/kernels/gpu_test_util.h"

namespace {
using namespace mx;
using namespace mx::test;

struct Packed {
  std::vector<uint8_t> data, scales;  // kMxfp4: scale bytes
  std::vector<float> row_scale;       // kFp8: 2^s
};

std::vector<float> row_f32(const std::vector<uint16_t>& x, int r, int K) {
  std::vector<float> f(K);
  for (int k = 0; k < K; ++k) f[k] = bf16_to_f32(x[size_t(r) * K + k]);
  return f;
}

Packed host_pack(DenseFormat fmt, const std::vector<uint16_t>& x, int rows, int K) {
  Packed p;
  if (fmt == DenseFormat::kMxfp4) {
    p.data.resize(size_t(rows) * K / 2), p.scales.resize(size_t(rows) * K / 32);
    for (int r = 0; r < rows; ++r)
      mxfp4_pack_row(row_f32(x, r, K).data(), K, &p.data[size_t(r) * K / 2], &p.scales[size_t(r) * K / 32]);
  } else {
    p.data.resize(size_t(rows) * K), p.row_scale.resize(rows);
    for (int r = 0; r < rows; ++r)
      p.row_scale[r] = std::ldexp(1.0f, fp8_pack_row(row_f32(x, r, K).data(), K, &p.data[size_t(r) * K]));
  }
  return p;
}

// Host decode of packed rows to bf16 (as the dequantizer must produce).
std::vector<uint16_t> host_decode(DenseFormat fmt, const Packed& p, int rows, int K) {
  std::vector<uint16_t> out(size_t(rows) * K);
  for (size_t i = 0; i < out.size(); ++i) {
    const size_t r = i / K;
    const float v = fmt == DenseFormat::kMxfp4
                        ? kFp4Values[i % 2 ? p.data[i / 2] >> 4 : p.data[i / 2] & 15] * e8m0_to_f32(p.scales[i / 32])
                        : e4m3_to_f32(p.data[i]) * p.row_scale[r];
    out[i] = f32_to_bf16(v);
  }
  return out;
}

// bytes[i] must be want[i - off] inside [off, off + want.size()) and the poison 0xFF elsewhere.
template <class T>
void expect_placed(const std::vector<T>& got, const std::vector<T>& want, size_t off, const char* what) {
  ASSERT_GE(got.size(), off + want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    T poison;
    std::memset(&poison, 0xFF, sizeof(T));
    const T w = i >= off && i < off + want.size() ? want[i - off] : poison;
    ASSERT_EQ(std::memcmp(&got[i], &w, sizeof(T)), 0) << what << " at " << i << " (rows from " << off << ")";
  }
}

// Quantizes x [rows, K] on the GPU into rows [row0, row0 + rows) of a poisoned [row0 + rows + 2, K]
// destination and checks every byte against the host packing (and the untouched rows).
Packed check_quantize(DenseFormat fmt, const std::vector<uint16_t>& x, int rows, int K, size_t row0) {
  const size_t total = row0 + rows + 2;
  const bool mx4 = fmt == DenseFormat::kMxfp4;
  DevBuf<uint16_t> src(x);
  DevBuf<uint8_t> data(mx4 ? total * K / 2 : total * K), scales(mx4 ? total * K / 32 : 0);
  DevBuf<float> row_scale(mx4 ? 0 : total);
  data.poison(), scales.poison(), row_scale.poison();
  cuda::quantize_dense_rows(src.p, rows, K, {.fmt = fmt, .data = data.p, .scales = scales.p, .row_scale = row_scale.p},
                            row0, 0);
  const Packed want = host_pack(fmt, x, rows, K);
  SCOPED_TRACE(std::string(mx4 ? "mxfp4" : "fp8") + " rows=" + std::to_string(rows) + " K=" + std::to_string(K));
  if (mx4) {
    expect_placed(data.get(), want.data, row0 * K / 2, "E2M1 bytes");
    expect_placed(scales.get(), want.scales, row0 * K / 32, "E8M0 scales");
  } else {
    expect_placed(data.get(), want.data, row0 * K, "E4M3 codes");
    expect_placed(row_scale.get(), want.row_scale, row0, "row scales");
  }
  return want;
}

// Dequantizes rows [row0, row0 + rows) of packed p (all `total` rows) on the GPU into a poisoned buffer
// (dst_off elements in, to reach the unaligned path) and checks it against the host decode.
void check_dequantize(DenseFormat fmt, const Packed& p, const std::vector<uint16_t>& bf16, int total, int K,
                      size_t row0, int rows, size_t dst_off = 0) {
  DevBuf<uint8_t> data(p.data), scales(p.scales);
  DevBuf<float> row_scale(p.row_scale);
  DevBuf<uint16_t> w16(bf16), out(dst_off + size_t(rows) * K + 8);
  out.poison();
  const void* sc = fmt == DenseFormat::kMxfp4 ? static_cast<const void*>(scales.p) : row_scale.p;
  const cuda::DenseWeight w{fmt, fmt == DenseFormat::kBf16 ? static_cast<const void*>(w16.p) : data.p, sc};
  cuda::dequantize_dense_rows(w, row0, rows, K, out.p + dst_off, 0);
  const std::vector<uint16_t> all = fmt == DenseFormat::kBf16 ? bf16 : host_decode(fmt, p, total, K);
  const std::vector<uint16_t> want(all.begin() + row0 * K, all.begin() + (row0 + rows) * K);
  auto got = out.get();
  SCOPED_TRACE("fmt=" + std::to_string(int(fmt)) + " rows=" + std::to_string(rows) + " K=" + std::to_string(K) +
               " row0=" + std::to_string(row0) + " dst_off=" + std::to_string(dst_off));
  for (size_t i = 0; i < got.size(); ++i) {
    const bool in = i >= dst_off && i < dst_off + want.size();
    const uint16_t w16i = in ? want[i - dst_off] : uint16_t(0xFFFF);
    if (in && std::isnan(bf16_to_f32(w16i))) ASSERT_TRUE(std::isnan(bf16_to_f32(got[i]))) << "at " << i;
    else ASSERT_EQ(got[i], w16i) << "at " << i;
  }
}

// Random bf16 whose 32-value blocks span magnitudes 2^-30 .. 2^20 (varied block and row scales).
std::vector<uint16_t> varied_bf16(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> e(-30, 20);
  std::vector<uint16_t> v = random_bf16(n, rng);
  for (size_t b = 0; b < n; b += 32) {
    const float m = std::ldexp(1.0f, e(rng));
    for (size_t i = b; i < std::min(n, b + 32); ++i) v[i] = f32_to_bf16(bf16_to_f32(v[i]) * m);
  }
  return v;
}

TEST(DenseQuantGpu, Mxfp4MatchesHostOddShapes) {
  std::mt19937 rng(1);
  for (auto [rows, K, row0] : {std::tuple{3, 32, 0}, std::tuple{7, 96, 5}, std::tuple{5, 2880, 2}, std::tuple{64, 2880, 0}})
    check_quantize(DenseFormat::kMxfp4, varied_bf16(size_t(rows) * K, rng), rows, K, row0);
}

TEST(DenseQuantGpu, Fp8MatchesHostOddShapes) {
  std::mt19937 rng(2);
  for (auto [rows, K, row0] : {std::tuple{3, 32, 0}, std::tuple{7, 96, 5}, std::tuple{5, 2880, 2}, std::tuple{4, 33, 1},
                               std::tuple{6, 1, 3}, std::tuple{64, 2880, 0}})
    check_quantize(DenseFormat::kFp8, varied_bf16(size_t(rows) * K, rng), rows, K, row0);
}

// Hand-built rows (K = 256, eight MXFP4 blocks a row) on every edge of the two roundings.
std::vector<uint16_t> special_rows(int K, int* rows_out) {
  std::vector<std::vector<float>> rows;
  auto row = [&]() -> std::vector<float>& { return rows.emplace_back(K, 0.0f); };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  row();                                                          // all zeros
  for (float& v : row()) v = -0.0f;                              // all negative zeros
  {
    auto& r = row();  // one huge value, many tiny ones: E2M1 code 0, E4M3 subnormals and their ties
    r[0] = 1000.0f;
    for (int k = 1; k < K; ++k) r[k] = (k % 2 ? -1.0f : 1.0f) * std::ldexp(float(k % 24), -9);
    r[40] = -0.0f, r[41] = 0.0f;
  }
  {
    auto& r = row();  // E2M1 ties (midpoint * 2^s) and their bf16 neighbours, per block s = -3, 5, 0, ...
    const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    for (int b = 0; b < K / 32; ++b) {
      const int s = b * 3 - 6;
      r[32 * b] = std::ldexp(6.0f, s);  // exactly top * 2^s: s, not s + 1
      for (int i = 0; i < 7; ++i) {
        const uint16_t m = f32_to_bf16(std::ldexp(mids[i], s));
        r[32 * b + 1 + i] = bf16_to_f32(m);
        r[32 * b + 8 + i] = -bf16_to_f32(m);
        r[32 * b + 15 + i] = bf16_to_f32(uint16_t(m + 1));
        r[32 * b + 22 + i] = bf16_to_f32(uint16_t(m - 1));
      }
      r[32 * b + 29] = -0.0f;
    }
    r[32] = bf16_to_f32(uint16_t(f32_to_bf16(r[32]) + 1));  // just past 6 * 2^s: s + 1
  }
  {
    auto& r = row();  // every E4M3 tie (midpoints of consecutive codes) at a row scale of 2^-2
    r[0] = 112.0f;
    for (int c = 0; c < 0x7D && c + 1 < K; ++c)
      r[c + 1] = (c % 2 ? -1.0f : 1.0f) * std::ldexp((e4m3_to_f32(uint8_t(c)) + e4m3_to_f32(uint8_t(c + 1))) / 2, -2);
  }
  {
    auto& r = row();  // NaNs of both signs among finite values
    for (int k = 0; k < K; ++k) r[k] = std::ldexp(float(k % 7) - 3.0f, k % 11 - 5);
    r[3] = nan, r[70] = -nan, r[200] = nan;
  }
  {
    auto& r = row();  // infinities: a non-finite amax gives s = -127
    for (int k = 0; k < K; ++k) r[k] = std::ldexp(float(k % 9) - 4.0f, -(k % 13));
    r[5] = inf, r[100] = -inf;
  }
  {
    auto& r = row();  // tiny values (bf16 subnormals included): s clamps at -127 (MXFP4: the first half's
    for (int k = 0; k < K; ++k)  // blocks, at most 0x00C0 = 6 * 2^-128)
      r[k] = bf16_to_f32(uint16_t((k % 2 ? 0x8000 : 0) | (k < K / 2 ? k * 37 % 0xC1 : k * 37 % 0x140)));
  }
  {
    auto& r = row();  // the largest bf16 magnitudes
    for (int k = 0; k < K; ++k) r[k] = bf16_to_f32(uint16_t((k % 3 ? 0x7F00 : 0xFF00) | (k % 0x80)));
  }
  *rows_out = int(rows.size());
  std::vector<uint16_t> x;
  for (auto& r : rows)
    for (float v : r) x.push_back(f32_to_bf16(v));
  return x;
}

TEST(DenseQuantGpu, SpecialValuesMatchHost) {
  const int K = 256;
  int rows = 0;
  const auto x = special_rows(K, &rows);
  for (DenseFormat fmt : {DenseFormat::kMxfp4, DenseFormat::kFp8}) {
    const Packed p = check_quantize(fmt, x, rows, K, 3);
    check_dequantize(fmt, p, x, rows, K, 0, rows);
  }
}

TEST(DenseQuantGpu, RoundTripMatchesHostDecode) {
  std::mt19937 rng(3);
  for (auto [rows, K] : {std::tuple{9, 96}, std::tuple{40, 2880}}) {
    const auto x = varied_bf16(size_t(rows) * K, rng);
    for (DenseFormat fmt : {DenseFormat::kMxfp4, DenseFormat::kFp8}) {
      const Packed p = check_quantize(fmt, x, rows, K, 0);
      check_dequantize(fmt, p, x, rows, K, 0, rows);
      check_dequantize(fmt, p, x, rows, K, 4, rows - 5);
      check_dequantize(fmt, p, x, rows, K, 2, 3, 1);  // unaligned destination: the scalar path
    }
  }
}

// Packed bytes the quantizer never writes: every E8M0 scale byte but NaN's 255 (0 is the subnormal
// 2^-127), every E2M1 code, E4M3 codes but NaN with row scales 2^-127 .. 2^127 (bf16 subnormal rounding).
TEST(DenseQuantGpu, DequantizeAllCodesAndScales) {
  std::mt19937 rng(4);
  {
    const int total = 12, K = 96;
    Packed p;
    p.data = random_u8(size_t(total) * K / 2, rng);
    p.scales.resize(size_t(total) * K / 32);
    for (size_t i = 0; i < p.scales.size(); ++i) p.scales[i] = uint8_t(i * 7 % 255);
    p.scales[0] = 0, p.scales[1] = 254, p.scales[2] = 1;
    check_dequantize(DenseFormat::kMxfp4, p, {}, total, K, 0, total);
    check_dequantize(DenseFormat::kMxfp4, p, {}, total, K, 3, 7);
    check_dequantize(DenseFormat::kMxfp4, p, {}, total, K, 5, 4, 3);
  }
  for (int K : {96, 33, 1, 2880}) {
    const int total = 9;
    Packed p;
    p.data = random_u8(size_t(total) * K, rng);
    for (auto& c : p.data)
      if ((c & 0x7F) == 0x7F) c ^= 1;
    std::uniform_int_distribution<int> s(-127, 127);
    for (int r = 0; r < total; ++r) p.row_scale.push_back(std::ldexp(1.0f, r == 0 ? -127 : r == 1 ? 127 : s(rng)));
    check_dequantize(DenseFormat::kFp8, p, {}, total, K, 0, total);
    check_dequantize(DenseFormat::kFp8, p, {}, total, K, 2, 6);
    check_dequantize(DenseFormat::kFp8, p, {}, total, K, 1, 5, 5);
  }
  for (int K : {96, 33}) {
    const auto x = random_bf16(size_t(7) * K, rng);
    check_dequantize(DenseFormat::kBf16, Packed{}, x, 7, K, 2, 4);
  }
}

TEST(DenseQuantGpu, RejectsBadArguments) {
  DevBuf<uint16_t> src(64), out(64);
  DevBuf<uint8_t> data(64), scales(8);
  DevBuf<float> rs(4);
  const cuda::DenseWeightOut mx4{.fmt = DenseFormat::kMxfp4, .data = data.p, .scales = scales.p};
  const cuda::DenseWeightOut f8{.fmt = DenseFormat::kFp8, .data = data.p, .row_scale = rs.p};
  EXPECT_THROW(cuda::quantize_dense_rows(src.p, 1, 32, {.fmt = DenseFormat::kBf16, .data = data.p}, 0, 0), Error);
  EXPECT_THROW(cuda::quantize_dense_rows(src.p, 1, 48, mx4, 0, 0), Error);
  EXPECT_THROW(cuda::quantize_dense_rows(src.p, -1, 32, f8, 0, 0), Error);
  EXPECT_THROW(cuda::quantize_dense_rows(src.p, 1, 0, f8, 0, 0), Error);
  const cuda::DenseWeight w{DenseFormat::kMxfp4, data.p, scales.p};
  EXPECT_THROW(cuda::dequantize_dense_rows(w, 0, 1, 48, out.p, 0), Error);
  EXPECT_THROW(cuda::dequantize_dense_rows(w, 0, -1, 32, out.p, 0), Error);
  EXPECT_THROW(cuda::dequantize_dense_rows(w, 0, 1, 0, out.p, 0), Error);
  EXPECT_NO_THROW(cuda::quantize_dense_rows(src.p, 0, 32, mx4, 0, 0));  // nothing to do
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
