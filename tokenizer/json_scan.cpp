#include "tokenizer/json_scan.h"

#include <cstring>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace mx::tok {

void JsonScanner::error(std::string_view what) const {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
    if (s_[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  fail("{}: invalid JSON at line {} column {}: {}", src_, line, col, what);
}

void JsonScanner::expect(char c) {
  if (!consume(c)) error(fmt::format("expected '{}'", c));
}

uint32_t JsonScanner::hex4() {
  if (pos_ + 4 > s_.size()) error("truncated \\u escape");
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k) {
    const char c = s_[pos_++];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= uint32_t(c - '0');
    else if (c >= 'a' && c <= 'f')
      v |= uint32_t(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      v |= uint32_t(c - 'A' + 10);
    else
      error("bad hex digit in \\u escape");
  }
  return v;
}

std::string_view JsonScanner::string(std::string& scratch) {
  skip_ws();
  if (pos_ >= s_.size() || s_[pos_] != '"') error("expected a string");
  const size_t start = ++pos_;
  // Fast path: no escapes.
  while (pos_ < s_.size()) {
    const auto c = static_cast<unsigned char>(s_[pos_]);
    if (c == '"') return s_.substr(start, pos_++ - start);
    if (c == '\\') break;
    if (c < 0x20) error("control character in string");
    ++pos_;
  }
  if (pos_ >= s_.size()) error("unterminated string");
  scratch.assign(s_.data() + start, pos_ - start);
  while (true) {
    if (pos_ >= s_.size()) error("unterminated string");
    const auto c = static_cast<unsigned char>(s_[pos_++]);
    if (c == '"') return scratch;
    if (c < 0x20) error("control character in string");
    if (c != '\\') {
      scratch.push_back(char(c));
      continue;
    }
    if (pos_ >= s_.size()) error("unterminated string");
    const char e = s_[pos_++];
    switch (e) {
      case '"':
        scratch.push_back('"');
        break;
      case '\\':
        scratch.push_back('\\');
        break;
      case '/':
        scratch.push_back('/');
        break;
      case 'b':
        scratch.push_back('\b');
        break;
      case 'f':
        scratch.push_back('\f');
        break;
      case 'n':
        scratch.push_back('\n');
        break;
      case 'r':
        scratch.push_back('\r');
        break;
      case 't':
        scratch.push_back('\t');
        break;
      case 'u': {
        uint32_t cp = hex4();
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (pos_ + 2 > s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u')
            error("unpaired surrogate in \\u escape");
          pos_ += 2;
          const uint32_t lo = hex4();
          if (lo < 0xDC00 || lo > 0xDFFF) error("unpaired surrogate in \\u escape");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          error("unpaired surrogate in \\u escape");
        }
        utf8::append_code_point(scratch, cp);
        break;
      }
      default:
        error("bad escape in string");
    }
  }
}

void JsonScanner::skip_number() {
  const size_t start = pos_;
  if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
  auto digits = [&] {
    const size_t d = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    return pos_ - d;
  };
  if (digits() == 0) {
    pos_ = start;
    error("expected a value");
  }
  if (pos_ < s_.size() && s_[pos_] == '.') {
    ++pos_;
    if (digits() == 0) error("bad number");
  }
  if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
    ++pos_;
    if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
    if (digits() == 0) error("bad number");
  }
}

int64_t JsonScanner::integer() {
  skip_ws();
  const size_t start = pos_;
  bool neg = false;
  if (pos_ < s_.size() && s_[pos_] == '-') {
    neg = true;
    ++pos_;
  }
  int64_t v = 0;
  size_t nd = 0;
  while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
    if (++nd > 15) error("integer out of range");
    v = v * 10 + (s_[pos_++] - '0');
  }
  if (nd == 0 || (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))) {
    pos_ = start;
    error("expected an integer");
  }
  return neg ? -v : v;
}

void JsonScanner::skip_value(int depth) {
  if (depth > 128) error("nesting too deep");
  skip_ws();
  if (pos_ >= s_.size()) error("unexpected end of input");
  std::string scratch;
  const char c = s_[pos_];
  if (c == '"') {
    string(scratch);
  } else if (c == '{') {
    ++pos_;
    if (consume('}')) return;
    do {
      string(scratch);
      expect(':');
      skip_value(depth + 1);
    } while (consume(','));
    expect('}');
  } else if (c == '[') {
    ++pos_;
    if (consume(']')) return;
    do skip_value(depth + 1);
    while (consume(','));
    expect(']');
  } else if (s_.compare(pos_, 4, "true") == 0 || s_.compare(pos_, 4, "null") == 0) {
    pos_ += 4;
  } else if (s_.compare(pos_, 5, "false") == 0) {
    pos_ += 5;
  } else {
    skip_number();
  }
}

std::string_view JsonScanner::value_span() {
  skip_ws();
  const size_t start = pos_;
  skip_value(0);
  return s_.substr(start, pos_ - start);
}

}  // namespace mx::tok
