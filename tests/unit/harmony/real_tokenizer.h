// The real gpt-oss tokenizer for the harmony tests (scripts/setup.sh fetches it), loaded once; null when it
// is missing (the tests that need it skip).
#pragma once
#include <filesystem>
#include <memory>

#include "tokenizer/tokenizer.h"

namespace mx::testing {

inline std::shared_ptr<const Tokenizer> real_tok() {
  static std::shared_ptr<const Tokenizer> tok = [] {
    const std::filesystem::path p = std::filesystem::path(MX_SOURCE_DIR) / ".assets/tokenizer/tokenizer.json";
    return std::filesystem::exists(p) ? Tokenizer::load(p.string()) : nullptr;
  }();
  return tok;
}

}  // namespace mx::testing
