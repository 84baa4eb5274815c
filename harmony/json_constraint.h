// Structured output (response_format json_object / json_schema): the assistant's final channel constrained
// to one JSON value (an object unless a schema says otherwise), token by token. A byte-level JSON
// recognizer (JsonState), the vocabulary walked as a trie to find the tokens that keep the text valid
// (JsonTokenMask); output_constraint.h holds a choice to it. The text follows the request's schema
// (json_schema.h; json_object: any object).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "harmony/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace mx::harmony {

constexpr int kJsonMaxDepth = 63;
constexpr int kJsonMaxWhitespace = 16;

// An open container: its schema node and what it holds so far.
struct JsonFrame {
  uint64_t seen = 0;  // objects with listed properties: bit i, property i was given
  uint16_t node = 0;
  uint8_t count = 0;  // arrays: items begun (at most 255)
  uint8_t array = 0;
};

// Where a JSON text is, after some bytes, against a schema (json_schema.h): POD, so a trie walk copies it
// a byte (json_copy: the header and the open frames only).
struct JsonState {
  uint64_t keys = 0;        // a listed key being read: the properties its bytes so far may still be
  uint16_t value = 0;       // the node of the value that comes next (a literal list's node while in one)
  uint16_t lo = 0, hi = 0;  // in an enum / const: the literals [lo, hi) still matching; lo: a pattern's state
  uint8_t depth = 0;        // open containers (at most kJsonMaxDepth)
  uint8_t mode = 0;         // what may come next (json_constraint.cpp)
  uint8_t aux = 0;          // a literal's or key's matched bytes, a \u escape's hex digits, a number's part
  uint8_t lit = 0;          // which literal (true, false, null)
  uint8_t ws = 0;           // whitespace bytes in a row (at most kJsonMaxWhitespace: no endless blank output)
  uint8_t int_only = 0;     // in a number that must be an integer
  JsonFrame frames[kJsonMaxDepth];
  bool operator==(const JsonState& o) const;  // the header and the open frames
};

JsonState json_start(const JsonSchema& schema);  // before the text: the schema's root value
// Feeds one byte; false when it cannot come next (s is then unspecified).
bool json_feed(const JsonSchema& schema, JsonState& s, uint8_t c);
bool json_done(const JsonSchema& schema, const JsonState& s);  // the value is complete (only whitespace may follow)
void json_copy(JsonState& to, const JsonState& from);  // the header and the open frames

// The ordinary tokens sorted by their bytes, each with its common prefix with the one before, so the
// tokens that may follow a state are found in one walk that skips every token under a rejected prefix.
class JsonTokenMask {
 public:
  explicit JsonTokenMask(std::shared_ptr<const Tokenizer> tok);
  int vocab_size() const { return vocab_; }
  const Tokenizer& tokenizer() const { return *tok_; }
  // bits[vocab_size / 64 rounded up]: the ordinary tokens whose bytes keep s valid (the caller adds its end
  // ids when json_done).
  void allowed(const JsonSchema& schema, const JsonState& s, std::vector<uint64_t>& bits) const;

 private:
  // Tokens sorted by bytes and each one's common prefix with the one before; past a token whose first
  // (second) byte fails, the next token of another first byte (first two bytes): a failed prefix's
  // tokens skipped at once, as in a trie.
  struct Sorted {
    std::vector<int32_t> ids;
    std::vector<uint16_t> lcp;
    std::vector<int32_t> skip1, skip2;
    std::string blob;            // the tokens' bytes in this order, one after another (read in order: no
    std::vector<uint32_t> off;   // cache miss a token); token i is blob[off[i], off[i + 1])
    std::string_view bytes(size_t i) const { return std::string_view(blob).substr(off[i], off[i + 1] - off[i]); }
    void index();
  };
  void walk(const Sorted& list, const JsonSchema& schema, const JsonState& s, std::vector<uint64_t>& bits) const;
  void walk_pattern(const JsonSchema& schema, const JsonState& s, std::vector<uint64_t>& bits) const;
  std::shared_ptr<const Tokenizer> tok_;
  Sorted all_;
  // Inside a string most tokens are plain text (no quote, backslash or control byte): those are allowed
  // at once and only the others walked (~1 ms instead of ~30 for the whole vocabulary).
  std::vector<uint64_t> plain_bits_;
  Sorted other_;
  int vocab_ = 0;
  size_t max_len_ = 0;
};

}  // namespace mx::harmony
