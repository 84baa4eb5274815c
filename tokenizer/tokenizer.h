// Byte-level BPE tokenizer for gpt-oss (o200k_harmony), loaded from a Hugging Face tokenizer.json.
// Encoding matches HF tokenizers id for id. Thread-safe for concurrent const use.
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
  // Throws mx::Error (one line) for a missing file, bad JSON, or a tokenizer of another model.
  static std::shared_ptr<const Tokenizer> load(const std::string& tokenizer_json_path);
  virtual ~Tokenizer() = default;

  // allow_special: special/added tokens in the text are matched as single ids; otherwise their
  // text is tokenized as ordinary text. Invalid UTF-8 bytes are encoded as their byte tokens.
  virtual std::vector<int32_t> encode(std::string_view text, bool allow_special) const = 0;
  // Raw bytes of the concatenated tokens (may be invalid UTF-8 if cut mid-character).
  virtual std::string decode_bytes(const std::vector<int32_t>& ids) const = 0;
  // As decode_bytes, with invalid UTF-8 replaced by U+FFFD.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The byte string of one token (special tokens: their text, e.g. "<|start|>").
  virtual const std::string& token_bytes(int32_t id) const = 0;
  virtual std::optional<int32_t> token_id(std::string_view token_text) const = 0;  // exact vocab/special lookup
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
