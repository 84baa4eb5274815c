// Strict UTF-8 scanning shared by the tokenizer, its decoders and the CLI.
// "Strict" = RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mx::utf8 {

// One step of a scan at s[i]. `len` is the length of the character when `valid`; otherwise the
// length of the maximal invalid subpart (>= 1), the unit that one U+FFFD replaces (the Unicode /
// WHATWG "maximal subpart" practice, as Rust's String::from_utf8_lossy does). `truncated` is set
// when the subpart is a valid prefix of a character cut off by the end of the buffer.
struct Step {
  uint32_t len;
  bool valid;
  bool truncated;
};

inline Step step(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  const uint8_t b0 = p[i];
  if (b0 < 0x80) return {1, true, false};
  uint32_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // > U+10FFFF
  } else {
    return {1, false, false};
  }
  uint32_t k = 0;
  for (; k < need; ++k) {
    if (i + 1 + k >= n) return {1 + k, false, true};
    const uint8_t b = p[i + 1 + k];
    const bool ok = k == 0 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {1 + k, false, false};
  }
  return {1 + need, true, false};
}

// Code point of a character already known to be valid (step().valid).
inline uint32_t decode_valid(const uint8_t* p, uint32_t len) {
  switch (len) {
    case 1:
      return p[0];
    case 2:
      return (uint32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3:
      return (uint32_t(p[0] & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
      return (uint32_t(p[0] & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) | (uint32_t(p[2] & 0x3F) << 6) |
             (p[3] & 0x3F);
  }
}

inline void append_code_point(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// Offset of the first invalid byte, or s.size() when all of s is valid UTF-8.
size_t first_invalid(std::string_view s);
inline bool is_valid(std::string_view s) { return first_invalid(s) == s.size(); }

// Appends s to out with each maximal invalid subpart replaced by U+FFFD.
void append_lossy(std::string& out, std::string_view s);

// Length of the tail of s that is a valid but incomplete prefix of a character (0..3): the bytes
// a streaming decoder must hold back until the next chunk arrives.
size_t incomplete_tail(std::string_view s);

}  // namespace mx::utf8
