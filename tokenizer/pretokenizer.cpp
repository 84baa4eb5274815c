#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace mx::tok {
namespace {

// Oniguruma's Unicode \s: TAB..CR, NEL and the separators (Zs, Zl, Zp). PCRE2's UCP \s also
// takes U+180E (via \h), which Oniguruma does not.
constexpr std::string_view kOnigSpaceClassBody = "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}";

// The GPT-2 pattern ByteLevel applies when its use_regex is true.
constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// Per-thread match scratch, shared by every Pretokenizer (match data of one pair fits any
// pattern: only the whole-match offsets are read).
struct MatchScratch {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* mc = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchScratch() {
    if (mc && js) pcre2_jit_stack_assign(mc, nullptr, js);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  if (!s.md || !s.mc) fail("tokenizer: out of memory for regex match data");
  return s;
}

std::string escape_literal(std::string_view lit) {
  std::string out;
  for (char c : lit) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

Pretokenizer::Behavior parse_behavior(const std::string& b, const std::string& source) {
  using B = Pretokenizer::Behavior;
  if (b == "Isolated") return B::Isolated;
  if (b == "Removed") return B::Removed;
  if (b == "MergedWithPrevious") return B::MergedWithPrevious;
  if (b == "MergedWithNext") return B::MergedWithNext;
  if (b == "Contiguous") return B::Contiguous;
  fail("{}: pre_tokenizer Split has unknown behavior '{}'", source, b);
}

}  // namespace

std::string Pretokenizer::translate_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  int class_depth = 0;  // Oniguruma allows nested classes; PCRE2 sees the same brackets
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        if (class_depth > 0)
          out += kOnigSpaceClassBody;
        else
          out += fmt::format("[{}]", kOnigSpaceClassBody);
      } else if (e == 'S') {
        if (class_depth > 0) fail("regex: \\S inside a character class is not supported");
        out += fmt::format("[^{}]", kOnigSpaceClassBody);
      } else {
        out.push_back('\\');
        out.push_back(e);
      }
      continue;
    }
    if (c == '[') {
      ++class_depth;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out.push_back(c);
  }
  return out;
}

void Pretokenizer::add_regex_step(const std::string& pattern, Behavior b, bool invert,
                                  const std::string& source) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    fail("{}: pre_tokenizer regex does not compile at offset {}: {}", source, err_off,
         reinterpret_cast<const char*>(msg));
  }
  // No JIT (e.g. an unsupported CPU) is not an error: the interpreter gives the same matches.
  if (pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) != 0) jit_ = false;
  steps_.push_back({std::shared_ptr<pcre2_real_code_8>(code, pcre2_code_free), b, invert});
}

void Pretokenizer::configure(const nlohmann::json& pre, const std::string& source) {
  steps_.clear();
  if (pre.is_null()) return;
  if (!pre.is_object() || !pre.contains("type") || !pre["type"].is_string())
    fail("{}: pre_tokenizer is not an object with a type", source);
  const std::string type = pre["type"].get<std::string>();
  if (type == "Sequence") {
    if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array())
      fail("{}: pre_tokenizer Sequence has no pretokenizers array", source);
    for (const auto& p : pre["pretokenizers"]) {
      Pretokenizer sub;
      sub.configure(p, source);
      for (auto& s : sub.steps_) steps_.push_back(std::move(s));
      jit_ = jit_ && sub.jit_;
    }
    return;
  }
  if (type == "Split") {
    const auto& pat = pre.value("pattern", nlohmann::json());
    std::string pattern;
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string())
      pattern = translate_pattern(pat["Regex"].get<std::string>());
    else if (pat.is_object() && pat.contains("String") && pat["String"].is_string())
      pattern = escape_literal(pat["String"].get<std::string>());
    else
      fail("{}: pre_tokenizer Split has no Regex or String pattern", source);
    const auto behavior = parse_behavior(pre.value("behavior", std::string("Isolated")), source);
    add_regex_step(pattern, behavior, pre.value("invert", false), source);
    return;
  }
  if (type == "ByteLevel") {
    // The byte mapping itself happens in the BPE model, which works on raw bytes.
    if (pre.value("add_prefix_space", false))
      fail("{}: ByteLevel pre_tokenizer with add_prefix_space=true is not supported", source);
    if (pre.value("use_regex", true))
      add_regex_step(translate_pattern(kGpt2Pattern), Behavior::Isolated, false, source);
    return;
  }
  fail("{}: pre_tokenizer type '{}' is not supported (expected Split/ByteLevel)", source, type);
}

void Pretokenizer::run(size_t k, std::string_view text, Sink sink, void* ctx) const {
  if (text.empty()) return;
  if (k == steps_.size()) {
    sink(ctx, text);
    return;
  }
  const Step& st = steps_[k];
  MatchScratch& ms = scratch();
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t len = text.size();

  // Pieces as (begin, end, is_match); emitted directly for Isolated/Removed, else collected.
  struct Piece {
    size_t b, e;
    bool match;
  };
  const bool stream = st.behavior == Behavior::Isolated || st.behavior == Behavior::Removed;
  std::vector<Piece> pieces;
  auto piece = [&](size_t b, size_t e, bool is_match) {
    if (b == e) return;
    is_match = is_match != st.invert;
    if (stream) {
      if (st.behavior == Behavior::Isolated || !is_match) run(k + 1, text.substr(b, e - b), sink, ctx);
    } else {
      pieces.push_back({b, e, is_match});
    }
  };

  size_t pos = 0, last = 0;
  while (pos < len) {
    int rc = pcre2_match(st.code.get(), subj, len, pos, PCRE2_NO_UTF_CHECK, ms.md, ms.mc);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)  // e.g. JIT stack exhausted: the interpreter can go on
      rc = pcre2_match(st.code.get(), subj, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, ms.md, ms.mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      fail("tokenizer: regex match failed: {}", reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ms.md);
    const size_t b = ov[0], e = ov[1];
    piece(last, b, false);
    piece(b, e, true);
    last = e;
    if (e > b) {
      pos = e;
    } else {  // empty match: step over one character
      if (b >= len) break;
      pos = b + utf8::step(text, b).len;
    }
  }
  piece(last, len, false);
  if (stream) return;

  // HF's NormalizedString::split merging rules for the other behaviours.
  std::vector<Piece> merged;
  if (st.behavior == Behavior::MergedWithPrevious) {
    bool prev_match = false;
    for (const auto& p : pieces) {
      if (p.match && !prev_match && !merged.empty())
        merged.back().e = p.e;
      else
        merged.push_back(p);
      prev_match = p.match;
    }
  } else if (st.behavior == Behavior::MergedWithNext) {
    bool prev_match = false;
    for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
      if (it->match && !prev_match && !merged.empty())
        merged.back().b = it->b;
      else
        merged.push_back(*it);
      prev_match = it->match;
    }
    std::reverse(merged.begin(), merged.end());
  } else {  // Contiguous
    for (const auto& p : pieces) {
      if (!merged.empty() && merged.back().match == p.match)
        merged.back().e = p.e;
      else
        merged.push_back(p);
    }
  }
  for (const auto& p : merged) run(k + 1, text.substr(p.b, p.e - p.b), sink, ctx);
}

}  // namespace mx::tok
