// Byte-level BPE tokenizer for gpt-oss (o200k_harmony), loaded from a Hugging Face tokenizer.json.
// Encoding matches HF tokenizers id for id (tests/data/tokenizer/goldens.jsonl, made by HF's own
// library). Thread-safe for concurrent const use. Implementation: tokenizer/bpe_tokenizer.h.
//
// Invalid UTF-8 policy (deliberate; HF itself only ever sees valid strings):
// - encode(): each byte of an invalid sequence (each byte of a maximal invalid subpart, e.g. a
//   lone 0xFF or a truncated "\xE4\xB8") becomes its own single-byte token, and acts as a
//   boundary: the valid text on either side is pre-tokenized separately. decode_bytes() of the
//   result gives the input back byte for byte.
// - decode(): every maximal invalid subpart becomes one U+FFFD (as Rust's from_utf8_lossy, so
//   equal to HF's decode).
// - The CLI (`mxserve tokenize`) rejects invalid UTF-8 on stdin instead.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mx {

class Tokenizer {
 public:
  // Throws mx::Error (one line) for a missing file, bad JSON, or a tokenizer of another model
  // (not byte-level BPE, a config this code cannot honour exactly, or lacking the gpt-oss special
  // tokens at their ids: <|start|> 200006, <|message|> 200008, <|return|> 200002, ...).
  // ~0.3 s for the real 27 MB file.
  static std::shared_ptr<const Tokenizer> load(const std::string& tokenizer_json_path);
  virtual ~Tokenizer() = default;

  // allow_special: special/added tokens in the text are matched as single ids (leftmost-longest,
  // before pre-tokenization, as HF does); otherwise their text is tokenized as ordinary text (HF's
  // encode_special_tokens=true; harmony's encode_ordinary). Invalid UTF-8: see the file comment.
  virtual std::vector<int32_t> encode(std::string_view text, bool allow_special) const = 0;
  // Raw bytes of the concatenated tokens (may be invalid UTF-8 if cut mid-character).
  // decode_bytes, decode and token_bytes throw mx::Error for an id outside [0, vocab_size).
  virtual std::string decode_bytes(const std::vector<int32_t>& ids) const = 0;
  // As decode_bytes, with invalid UTF-8 replaced by U+FFFD.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The byte string of one token (special tokens: their text, e.g. "<|start|>"; empty for an id
  // in range that has no token).
  virtual const std::string& token_bytes(int32_t id) const = 0;
  // Exact lookup of a token's raw bytes (" hello") or a special token's text ("<|end|>").
  virtual std::optional<int32_t> token_id(std::string_view token_text) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;  // ids are in [0, vocab_size)
};

// Streaming detokenizer: push ids, get text that is always whole UTF-8 characters.
// Incomplete trailing bytes are held back until completed; flush() emits them (as U+FFFD).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(std::shared_ptr<const Tokenizer> tok);
  std::string push(int32_t id);
  std::string flush();

 private:
  std::shared_ptr<const Tokenizer> tok_;
  std::string pending_;
};

}  // namespace mx
