// A dense weight for the kernel tests in any format (dense_weight.h): bf16 rows packed on the host as
// core/dense_quant.h says, uploaded, and the values the kernels must compute with (exact in bf16).
#pragma once
#include <memory>
#include <vector>

#include "core/dense_quant.h"
#include "kernels/common/dense_weight.h"
#include "tests/kernels/gpu_test_util.h"

namespace mx::test {

class DenseTestWeight {
 public:
  DenseTestWeight(DenseFormat f, const std::vector<uint16_t>& W, int N, int K) : values(W.size()) {
    std::vector<uint8_t> data, scales;
    std::vector<float> row_scale;
    std::vector<float> row(static_cast<size_t>(K));
    for (int r = 0; r < N; ++r) {
      for (int k = 0; k < K; ++k) row[size_t(k)] = bf16_to_f32(W[size_t(r) * K + k]);
      float* v = values.data() + size_t(r) * K;
      if (f == DenseFormat::kBf16) {
        std::copy(row.begin(), row.end(), v);
      } else if (f == DenseFormat::kMxfp4) {
        std::vector<uint8_t> b(size_t(K) / 2), s(size_t(K) / 32);
        mxfp4_pack_row(row.data(), K, b.data(), s.data());
        for (int k = 0; k < K; ++k) v[k] = mxfp4_at(b.data(), s.data(), k);
        data.insert(data.end(), b.begin(), b.end());
        scales.insert(scales.end(), s.begin(), s.end());
      } else {
        std::vector<uint8_t> c(static_cast<size_t>(K));
        const float sc = std::ldexp(1.0f, fp8_pack_row(row.data(), K, c.data()));
        for (int k = 0; k < K; ++k) v[k] = e4m3_to_f32(c[size_t(k)]) * sc;
        data.insert(data.end(), c.begin(), c.end());
        row_scale.push_back(sc);
      }
    }
    if (f == DenseFormat::kBf16) {
      const auto* p = reinterpret_cast<const uint8_t*>(W.data());
      data.assign(p, p + W.size() * 2);
    }
    data_ = std::make_unique<DevBuf<uint8_t>>(data);
    w = cuda::DenseWeight{f, data_->p, nullptr};
    if (f == DenseFormat::kMxfp4) w.scales = (scales_ = std::make_unique<DevBuf<uint8_t>>(scales))->p;
    if (f == DenseFormat::kFp8) w.scales = (row_scale_ = std::make_unique<DevBuf<float>>(row_scale))->p;
  }
  std::vector<float> values;  // [N, K]
  cuda::DenseWeight w;

 private:
  std::unique_ptr<DevBuf<uint8_t>> data_, scales_;
  std::unique_ptr<DevBuf<float>> row_scale_;
};

inline const DenseFormat kDenseFormats[] = {DenseFormat::kBf16, DenseFormat::kMxfp4, DenseFormat::kFp8};
inline const char* format_name(DenseFormat f) {
  return f == DenseFormat::kMxfp4 ? "mxfp4" : f == DenseFormat::kFp8 ? "fp8" : "bf16";
}

}  // namespace mx::test
