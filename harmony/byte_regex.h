// A regular expression compiled to a DFA over bytes, for structured output (vLLM's guided_regex, a JSON
// schema's `pattern`): the whole text must match (^ and $ at the ends are accepted and mean nothing more).
// Syntax: literals (UTF-8 too), `.` (one code point, not a newline), classes `[a-z\d]` / `[^...]`, escapes
// \d \D \w \W \s \S \n \r \t \f \v \uXXXX and escaped punctuation, groups `( )`, `(?: )`, `(?<name> )`,
// alternation, quantifiers `* + ? {n} {n,} {n,m}` (lazy forms match the same texts). Refused with a clear
// error: lookaround, backreferences, \b, anchors inside the pattern, and patterns over kMaxDfaStates states.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mx::harmony {

class ByteDfa {
 public:
  static constexpr int kMaxStates = 4096;
  // Throws mx::InvalidRequest(param, ...) on a pattern it cannot compile.
  static std::shared_ptr<const ByteDfa> compile(const std::string& pattern, const std::string& param);

  static constexpr int kDead = -1;
  int start() const { return 0; }
  int next(int state, uint8_t c) const { return next_[size_t(state) * 256 + c]; }
  bool accepting(int state) const { return accept_[size_t(state)]; }
  int num_states() const { return int(accept_.size()); }

 private:
  std::vector<int16_t> next_;  // [state][byte]: the next state or kDead
  std::vector<uint8_t> accept_;
  friend class ByteDfaBuilder;
};

}  // namespace mx::harmony
