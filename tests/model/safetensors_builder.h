// Builds safetensors bytes from a header JSON text and a data-section size (data bytes are a
// simple pattern), for header-validation tests and fuzzing.
#pragma once
#include <cstdint>
#include <string>

namespace mx::test {

inline std::string build_safetensors(const std::string& header, uint64_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = char(uint8_t(n >> (8 * i)));
  out += header;
  for (uint64_t i = 0; i < data_bytes; ++i) out.push_back(char(i * 31 + 7));
  return out;
}

}  // namespace mx::test
