// The Tokenizer implementation (internal: tests and the benchmark include it; everything else
// uses tokenizer/tokenizer.h).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace mx::tok {

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(BpeModel bpe, Pretokenizer pre, std::vector<AddedToken> added);

  std::vector<int32_t> encode(std::string_view text, bool allow_special) const override;
  std::string decode_bytes(const std::vector<int32_t>& ids) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  const std::string& token_bytes(int32_t id) const override;
  std::optional<int32_t> token_id(std::string_view token_text) const override;
  bool is_special(int32_t id) const override;
  int32_t vocab_size() const override { return vocab_size_; }

  // Encodes text with no added-token matching, appending to out.
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;
  const BpeModel& bpe() const { return bpe_; }
  const Pretokenizer& pretokenizer() const { return pre_; }
  const std::vector<AddedToken>& added_tokens() const { return added_; }

 private:
  BpeModel bpe_;
  Pretokenizer pre_;
  std::vector<AddedToken> added_;
  std::vector<const std::string*> id_bytes_;  // id -> bytes (vocab or added content); null = hole
  std::vector<uint8_t> special_;
  int32_t vocab_size_ = 0;
};

// Parses the text of a tokenizer.json. `source` names it in errors. Checks that it is the
// gpt-oss (o200k_harmony) tokenizer when require_gpt_oss is set.
std::shared_ptr<const BpeTokenizer> parse_tokenizer_json(std::string_view text, const std::string& source,
                                                         bool require_gpt_oss = true);

}  // namespace mx::tok
