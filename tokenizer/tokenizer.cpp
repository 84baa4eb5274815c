#include <algorithm>

#include "core/error.h"
#include "core/mmap_file.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/utf8.h"

namespace mx {

std::shared_ptr<const Tokenizer> Tokenizer::load(const std::string& tokenizer_json_path) {
  MappedFile f(tokenizer_json_path);
  return tok::parse_tokenizer_json(std::string_view(reinterpret_cast<const char*>(f.data()), f.size()),
                                   tokenizer_json_path);
}

IncrementalDecoder::IncrementalDecoder(std::shared_ptr<const Tokenizer> tok) : tok_(std::move(tok)) {
  MX_CHECK(tok_ != nullptr, "IncrementalDecoder needs a tokenizer");
}

std::string IncrementalDecoder::push(int32_t id) {
  pending_ += tok_->token_bytes(id);
  const size_t keep = utf8::incomplete_tail(pending_);
  std::string out;
  utf8::append_lossy(out, std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out;
  utf8::append_lossy(out, pending_);
  pending_.clear();
  return out;
}

namespace tok {

BpeTokenizer::BpeTokenizer(BpeModel bpe, Pretokenizer pre, std::vector<AddedToken> added)
    : bpe_(std::move(bpe)), pre_(std::move(pre)), added_(std::move(added)) {
  size_t n = bpe_.size();
  for (const auto& a : added_) n = std::max(n, size_t(a.id) + 1);
  vocab_size_ = int32_t(n);
  id_bytes_.assign(n, nullptr);
  special_.assign(n, 0);
  for (size_t id = 0; id < bpe_.size(); ++id)
    if (!bpe_.bytes_of(int32_t(id)).empty()) id_bytes_[id] = &bpe_.bytes_of(int32_t(id));
  for (const auto& a : added_) {
    id_bytes_[size_t(a.id)] = &a.content;
    special_[size_t(a.id)] = a.special;
  }
}

void BpeTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  struct Ctx {
    const BpeModel* bpe;
    std::vector<int32_t>* out;
  } ctx{&bpe_, &out};
  const auto sink = [](void* c, std::string_view piece) {
    auto* x = static_cast<Ctx*>(c);
    x->bpe->encode_piece(piece, *x->out);
  };
  size_t i = 0;
  while (i < text.size()) {
    const size_t bad = i + utf8::first_invalid(text.substr(i));
    if (bad > i) pre_.split(text.substr(i, bad - i), sink, &ctx);
    if (bad == text.size()) break;
    // Invalid UTF-8: each byte of the maximal invalid subpart becomes its own byte token.
    const size_t n = utf8::step(text, bad).len;
    for (size_t k = 0; k < n; ++k) bpe_.encode_piece(text.substr(bad + k, 1), out);
    i = bad + n;
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (!allow_special || added_.empty()) {
    encode_ordinary(text, out);
    return out;
  }
  // Added tokens split the text first, leftmost-longest (HF's added-vocabulary matching).
  constexpr size_t npos = std::string_view::npos;
  std::vector<size_t> next(added_.size(), 0);
  std::vector<bool> fresh(added_.size(), false);
  size_t pos = 0;
  while (true) {
    size_t best = npos, best_len = 0;
    int32_t best_id = -1;
    for (size_t k = 0; k < added_.size(); ++k) {
      const std::string& c = added_[k].content;
      if (c.empty()) continue;
      if (!fresh[k] || (next[k] != npos && next[k] < pos)) {
        next[k] = text.find(c, pos);
        fresh[k] = true;
      }
      if (next[k] == npos) continue;
      if (next[k] < best || (next[k] == best && c.size() > best_len)) {
        best = next[k];
        best_len = c.size();
        best_id = added_[k].id;
      }
    }
    if (best == npos) break;
    encode_ordinary(text.substr(pos, best - pos), out);
    out.push_back(best_id);
    pos = best + best_len;
  }
  encode_ordinary(text.substr(pos), out);
  return out;
}

const std::string& BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size_) fail("token id {} is out of range [0, {})", id, vocab_size_);
  static const std::string kEmpty;
  const std::string* s = id_bytes_[size_t(id)];
  return s ? *s : kEmpty;
}

std::string BpeTokenizer::decode_bytes(const std::vector<int32_t>& ids) const {
  size_t n = 0;
  for (int32_t id : ids) n += token_bytes(id).size();
  std::string out;
  out.reserve(n);
  for (int32_t id : ids)
    if (const std::string* s = id_bytes_[size_t(id)]) out += *s;
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  const std::string raw = decode_bytes(ids);
  std::string out;
  out.reserve(raw.size());
  utf8::append_lossy(out, raw);
  return out;
}

std::optional<int32_t> BpeTokenizer::token_id(std::string_view token_text) const {
  for (const auto& a : added_)
    if (a.content == token_text) return a.id;
  const int32_t id = bpe_.lookup(token_text);
  if (id >= 0) return id;
  return std::nullopt;
}

bool BpeTokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size_ && special_[size_t(id)];
}

}  // namespace tok
}  // namespace mx
