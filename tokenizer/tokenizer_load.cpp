// tokenizer.json -> BpeTokenizer. The vocab and merges (almost all of the 27 MB) are read with
// JsonScanner straight into the model's tables; the small sections go through nlohmann::json.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_scan.h"
#include "tokenizer/utf8.h"

namespace mx::tok {
namespace {

constexpr int64_t kMaxId = 1 << 24;

// The ids harmony relies on (gpt-oss-spec.md section 4).
struct RequiredSpecial {
  const char* text;
  int32_t id;
};
constexpr RequiredSpecial kGptOssSpecials[] = {
    {"<|start|>", 200006}, {"<|message|>", 200008}, {"<|end|>", 200007},       {"<|return|>", 200002},
    {"<|call|>", 200012},  {"<|channel|>", 200005}, {"<|constrain|>", 200003}, {"<|endoftext|>", 199999},
};

// Byte-level vocab text -> raw bytes; false if a character is outside the byte alphabet.
bool byte_level_decode(std::string_view s, std::string& out) {
  const auto& alpha = byte_level_alphabet();
  out.clear();
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 33 && c <= 126) {  // maps to itself
      out.push_back(char(c));
      ++i;
      continue;
    }
    const utf8::Step st = utf8::step(s, i);
    if (!st.valid) return false;
    const int b = alpha.byte_of(utf8::decode_valid(reinterpret_cast<const uint8_t*>(s.data() + i), st.len));
    if (b < 0) return false;
    out.push_back(char(b));
    i += st.len;
  }
  return true;
}

struct ModelSection {
  std::vector<std::string> tokens;
  std::string merge_arena;                                 // raw bytes of every merge side
  std::vector<std::pair<uint32_t, uint32_t>> merge_spans;  // (offset, length) pairs, 2 per merge
  bool ignore_merges = false;
  bool saw_type = false, saw_vocab = false, saw_merges = false;
};

void read_vocab(JsonScanner& js, ModelSection& m, const std::string& source) {
  std::string scratch, bytes;
  m.tokens.reserve(1 << 18);
  js.expect('{');
  if (js.consume('}')) return;
  do {
    const std::string_view key = js.string(scratch);
    if (!byte_level_decode(key, bytes) || bytes.empty())
      fail("{}: model.vocab token '{}' is not byte-level encoded (not a byte-level BPE tokenizer)", source,
           key);
    js.expect(':');
    const int64_t id = js.integer();
    if (id < 0 || id >= kMaxId) fail("{}: model.vocab id {} is out of range", source, id);
    if (size_t(id) >= m.tokens.size()) m.tokens.resize(size_t(id) + 1);
    if (!m.tokens[size_t(id)].empty()) fail("{}: model.vocab id {} appears twice", source, id);
    m.tokens[size_t(id)] = bytes;
  } while (js.consume(','));
  js.expect('}');
}

void read_merges(JsonScanner& js, ModelSection& m, const std::string& source) {
  std::string scratch, bytes;
  m.merge_arena.reserve(8 << 20);
  m.merge_spans.reserve(1 << 20);
  auto add_side = [&](std::string_view side) {
    if (!byte_level_decode(side, bytes) || bytes.empty())
      fail("{}: merge #{} token '{}' is not byte-level encoded", source, m.merge_spans.size() / 2, side);
    m.merge_spans.emplace_back(uint32_t(m.merge_arena.size()), uint32_t(bytes.size()));
    m.merge_arena += bytes;
  };
  js.expect('[');
  if (js.consume(']')) return;
  do {
    if (js.peek() == '[') {  // ["a", "b"]
      js.expect('[');
      add_side(js.string(scratch));
      js.expect(',');
      add_side(js.string(scratch));
      js.expect(']');
    } else {  // "a b" (older format)
      const std::string_view line = js.string(scratch);
      const size_t sp = line.find(' ');
      if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
        fail("{}: merge #{} '{}' is not two tokens separated by one space", source, m.merge_spans.size() / 2,
             line);
      const std::string right(line.substr(sp + 1));  // line may live in scratch, reused by add_side
      add_side(line.substr(0, sp));
      add_side(right);
    }
  } while (js.consume(','));
  js.expect(']');
}

bool json_bool(std::string_view span, const std::string& source, const char* what) {
  if (span == "true") return true;
  if (span == "false" || span == "null") return false;
  fail("{}: model.{} must be a boolean", source, what);
}

void read_model(JsonScanner& js, ModelSection& m, const std::string& source) {
  std::string scratch;
  js.expect('{');
  if (js.consume('}')) return;
  do {
    const std::string key(js.string(scratch));
    js.expect(':');
    if (key == "vocab") {
      read_vocab(js, m, source);
      m.saw_vocab = true;
    } else if (key == "merges") {
      read_merges(js, m, source);
      m.saw_merges = true;
    } else {
      const std::string_view span = js.value_span();
      if (key == "type") {
        if (span != "\"BPE\"") fail("{}: model.type is {}, expected \"BPE\"", source, span);
        m.saw_type = true;
      } else if (key == "ignore_merges") {
        m.ignore_merges = json_bool(span, source, "ignore_merges");
      } else if (key == "byte_fallback" || key == "fuse_unk") {
        json_bool(span, source, key.c_str());  // no effect: every byte has a token
      } else if (key == "dropout") {
        if (span != "null" && span != "0" && span != "0.0")
          fail("{}: model.dropout {} is not supported", source, span);
      } else if (key == "continuing_subword_prefix" || key == "end_of_word_suffix") {
        if (span != "null" && span != "\"\"") fail("{}: model.{} {} is not supported", source, key, span);
      }
    }
  } while (js.consume(','));
  js.expect('}');
}

nlohmann::json parse_small(std::string_view span, const std::string& source, const char* what) {
  try {
    return nlohmann::json::parse(span);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON in {}: {}", source, what, e.what());
  }
}

std::vector<AddedToken> read_added(const nlohmann::json& j, const std::string& source) {
  std::vector<AddedToken> out;
  if (j.is_null()) return out;
  if (!j.is_array()) fail("{}: added_tokens is not an array", source);
  for (const auto& t : j) {
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
        !t["content"].is_string())
      fail("{}: added_tokens entry {} lacks an integer id or a string content", source, out.size());
    const int64_t id = t["id"].get<int64_t>();
    if (id < 0 || id >= kMaxId) fail("{}: added token id {} is out of range", source, id);
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      if (t.value(flag, false))
        fail("{}: added token {} has {}=true, which this tokenizer does not support", source, id, flag);
    out.push_back({int32_t(id), t["content"].get<std::string>(), t.value("special", false)});
  }
  return out;
}

}  // namespace

std::shared_ptr<const BpeTokenizer> parse_tokenizer_json(std::string_view text, const std::string& source,
                                                         bool require_gpt_oss) {
  JsonScanner js(text, source);
  ModelSection model;
  bool saw_model = false;
  std::string_view added_span = "null", pre_span = "null", norm_span = "null", dec_span = "null";
  std::string scratch;
  if (js.peek() != '{') js.error("expected a JSON object (is this a tokenizer.json?)");
  js.expect('{');
  if (!js.consume('}')) {
    do {
      const std::string key(js.string(scratch));
      js.expect(':');
      if (key == "model") {
        read_model(js, model, source);
        saw_model = true;
        continue;
      }
      const std::string_view span = js.value_span();
      if (key == "added_tokens")
        added_span = span;
      else if (key == "pre_tokenizer")
        pre_span = span;
      else if (key == "normalizer")
        norm_span = span;
      else if (key == "decoder")
        dec_span = span;
    } while (js.consume(','));
    js.expect('}');
  }
  if (!js.at_end()) js.error("unexpected text after the JSON object");

  if (!saw_model) fail("{}: no \"model\" section (not a tokenizer.json?)", source);
  if (!model.saw_type) fail("{}: model has no \"type\" (expected \"BPE\")", source);
  if (!model.saw_vocab || !model.saw_merges) fail("{}: model lacks vocab or merges", source);
  if (!parse_small(norm_span, source, "normalizer").is_null())
    fail("{}: a normalizer is not supported (gpt-oss has none)", source);
  const nlohmann::json dec = parse_small(dec_span, source, "decoder");
  if (!dec.is_object() || dec.value("type", std::string()) != "ByteLevel")
    fail("{}: decoder is not ByteLevel (not a byte-level BPE tokenizer)", source);

  Pretokenizer pre;
  pre.configure(parse_small(pre_span, source, "pre_tokenizer"), source);
  std::vector<AddedToken> added = read_added(parse_small(added_span, source, "added_tokens"), source);

  std::vector<std::pair<std::string_view, std::string_view>> merges;
  merges.reserve(model.merge_spans.size() / 2);
  const std::string_view arena = model.merge_arena;
  for (size_t i = 0; i + 1 < model.merge_spans.size(); i += 2)
    merges.emplace_back(arena.substr(model.merge_spans[i].first, model.merge_spans[i].second),
                        arena.substr(model.merge_spans[i + 1].first, model.merge_spans[i + 1].second));
  BpeModel bpe;
  bpe.build(std::move(model.tokens), merges, model.ignore_merges, source);

  if (require_gpt_oss) {
    for (const auto& r : kGptOssSpecials) {
      const AddedToken* found = nullptr;
      for (const auto& a : added)
        if (a.content == r.text) found = &a;
      if (!found)
        fail("{}: not the gpt-oss (o200k_harmony) tokenizer: special token {} is missing", source, r.text);
      if (found->id != r.id)
        fail("{}: not the gpt-oss (o200k_harmony) tokenizer: {} has id {}, expected {}", source, r.text,
             found->id, r.id);
    }
  }
  return std::make_shared<BpeTokenizer>(std::move(bpe), std::move(pre), std::move(added));
}

}  // namespace mx::tok
