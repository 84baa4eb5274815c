// The pre-tokenizer of a tokenizer.json: Split steps (regex or literal, with HF's split
// behaviours) and ByteLevel, run with PCRE2 (8-bit, UTF + UCP, JIT when available).
// Oniguruma (what HF tokenizers runs) and PCRE2 differ on \s: translate_pattern() rewrites it to
// Oniguruma's Unicode definition so the split is the same.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;

namespace mx::tok {

class Pretokenizer {
 public:
  enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

  // Reads tokenizer.json's "pre_tokenizer" value. Throws mx::Error naming `source` for anything
  // this tokenizer cannot honour exactly.
  void configure(const nlohmann::json& pre, const std::string& source);

  // Calls sink(ctx, piece) for each non-empty pre-token of `text`, in order. `text` must be valid
  // UTF-8 (the caller splits invalid bytes off first).
  using Sink = void (*)(void* ctx, std::string_view piece);
  void split(std::string_view text, Sink sink, void* ctx) const { run(0, text, sink, ctx); }

  // Oniguruma-syntax pattern -> PCRE2 pattern with the same meaning (see the file comment).
  static std::string translate_pattern(std::string_view onig);
  bool jit() const { return jit_; }

 private:
  struct Step {
    std::shared_ptr<pcre2_real_code_8> code;
    Behavior behavior;
    bool invert;
  };
  void add_regex_step(const std::string& pcre2_pattern, Behavior b, bool invert, const std::string& source);
  void run(size_t k, std::string_view text, Sink sink, void* ctx) const;

  std::vector<Step> steps_;
  bool jit_ = true;
};

}  // namespace mx::tok
