#include "model/dense_quant.h"

#include <sstream>

#include "core/bf16.h"
#include "core/dense_quant.h"
#include "core/error.h"

namespace mx {

const char* dense_format_name(DenseFormat f) {
  return f == DenseFormat::kMxfp4 ? "mxfp4" : f == DenseFormat::kFp8 ? "fp8" : "bf16";
}

bool DenseQuant::any() const {
  return qkv != DenseFormat::kBf16 || o != DenseFormat::kBf16 || lm_head != DenseFormat::kBf16;
}

std::string DenseQuant::describe() const {
  return std::string("qkv ") + dense_format_name(qkv) + ", o " + dense_format_name(o) + ", lm_head " +
         dense_format_name(lm_head);
}

namespace {

// Sets the layers `value` names to `f`.
void parse_one(const char* flag, const std::string& value, DenseFormat f, DenseQuant& q, DenseFormat other) {
  if (value == "none") return;
  std::vector<std::string> names;
  if (value == "all") {
    names = {"qkv", "o", "lm_head"};
  } else {
    std::stringstream ss(value);
    for (std::string n; std::getline(ss, n, ',');) names.push_back(n);
    if (names.empty() || value.back() == ',') fail("{} {}: expected none, all or a list of qkv, o, lm_head", flag, value);
  }
  for (const std::string& n : names) {
    DenseFormat* slot = n == "qkv" ? &q.qkv : n == "o" ? &q.o : n == "lm_head" ? &q.lm_head : nullptr;
    if (!slot) fail("{} {}: unknown layer '{}' (expected none, all or a list of qkv, o, lm_head)", flag, value, n);
    if (*slot == other && other != DenseFormat::kBf16)
      fail("{}: layer '{}' is also in --{}-layers; a layer takes one format", flag, n, dense_format_name(other));
    *slot = f;
  }
}

// A copy of n bf16 values as rows of `cols`, each row rounded by `round_row`.
template <class F>
const uint16_t* rounded_copy(const uint16_t* src, size_t rows, int cols, F round_row,
                             std::vector<std::vector<uint16_t>>& storage) {
  std::vector<uint16_t>& out = storage.emplace_back(rows * size_t(cols));
  std::vector<float> row(static_cast<size_t>(cols));
  for (size_t r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) row[size_t(c)] = bf16_to_f32(src[r * size_t(cols) + size_t(c)]);
    round_row(row.data(), cols);
    for (int c = 0; c < cols; ++c) out[r * size_t(cols) + size_t(c)] = f32_to_bf16(row[size_t(c)]);  // exact
  }
  return out.data();
}

const uint16_t* quantized(DenseFormat f, const uint16_t* src, size_t rows, int cols,
                          std::vector<std::vector<uint16_t>>& storage) {
  if (f == DenseFormat::kMxfp4) {
    if (cols % 32) fail("--mxfp4-layers: a row of {} values is not whole blocks of 32", cols);
    return rounded_copy(src, rows, cols, mxfp4_round_row, storage);
  }
  if (f == DenseFormat::kFp8) return rounded_copy(src, rows, cols, fp8_round_row, storage);
  return src;
}

}  // namespace

DenseQuant parse_dense_quant(const std::string& mxfp4_layers, const std::string& fp8_layers) {
  DenseQuant q;
  parse_one("--mxfp4-layers", mxfp4_layers, DenseFormat::kMxfp4, q, DenseFormat::kBf16);
  parse_one("--fp8-layers", fp8_layers, DenseFormat::kFp8, q, DenseFormat::kMxfp4);
  return q;
}

void apply_dense_quant(const DenseQuant& q, const ModelConfig& cfg, ModelWeights& w,
                       std::vector<std::vector<uint16_t>>& storage) {
  const int H = cfg.hidden_size, qd = cfg.num_heads * cfg.head_dim, kvd = cfg.kv_dim();
  for (LayerWeights& L : w.layers) {
    L.q_w = quantized(q.qkv, L.q_w, size_t(qd), H, storage);
    L.k_w = quantized(q.qkv, L.k_w, size_t(kvd), H, storage);
    L.v_w = quantized(q.qkv, L.v_w, size_t(kvd), H, storage);
    L.o_w = quantized(q.o, L.o_w, size_t(H), qd, storage);
  }
  w.lm_head = quantized(q.lm_head, w.lm_head, size_t(cfg.vocab_size), H, storage);
}

}  // namespace mx
