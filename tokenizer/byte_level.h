// GPT-2 byte-level alphabet: every byte has a printable stand-in character, so byte strings can
// live in a JSON vocab. Printable Latin-1 bytes map to themselves; the other 68 bytes map in order
// to U+0100..U+0143.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/utf8.h"

namespace mx::tok {

struct ByteLevelAlphabet {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<int16_t, 324> cp_to_byte{};  // -1 where the code point is not in the alphabet

  ByteLevelAlphabet() {
    cp_to_byte.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      byte_to_cp[b] = printable ? b : next++;
      cp_to_byte[byte_to_cp[b]] = int16_t(b);
    }
  }
  int byte_of(uint32_t cp) const { return cp < cp_to_byte.size() ? cp_to_byte[cp] : -1; }
};

inline const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet a;
  return a;
}

// Bytes as the vocabulary writes them (each byte's stand-in, UTF-8 encoded): " world" -> "\u0120world", what
// Hugging Face's convert_ids_to_tokens returns.
inline std::string byte_level_text(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) utf8::append_code_point(out, byte_level_alphabet().byte_to_cp[uint8_t(c)]);
  return out;
}

}  // namespace mx::tok
