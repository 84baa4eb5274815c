// A small pull-style JSON reader for the large parts of tokenizer.json (vocab, merges), where a
// DOM parser would spend most of the load time building maps; the small parts are handed to
// nlohmann::json through value_span(). Errors throw mx::Error naming the source and line:col.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mx::tok {

class JsonScanner {
 public:
  JsonScanner(std::string_view text, std::string source) : s_(text), src_(std::move(source)) {}

  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t'))
      ++pos_;
  }
  // Skips whitespace, then consumes c if it is next.
  bool consume(char c) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c);
  char peek() {
    skip_ws();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  bool at_end() {
    skip_ws();
    return pos_ >= s_.size();
  }

  // A string value, unescaped. The view points into the input when there were no escapes,
  // otherwise into `scratch`.
  std::string_view string(std::string& scratch);
  int64_t integer();
  // Skips one value (checking its syntax) and returns its raw text.
  std::string_view value_span();

  [[noreturn]] void error(std::string_view what) const;
  size_t pos() const { return pos_; }

 private:
  void skip_value(int depth);
  void skip_number();
  uint32_t hex4();

  std::string_view s_;
  std::string src_;
  size_t pos_ = 0;
};

}  // namespace mx::tok
