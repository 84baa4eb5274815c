#include "harmony/json_constraint.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace mx::harmony {
namespace {

enum Mode : uint8_t {
  kTop,            // before the object: whitespace or '{'
  kValue,          // a value (after ':' or an array's ',')
  kValueOrClose,   // a value or ']' (after '[')
  kKeyOrClose,     // a key or '}' (after '{')
  kKey,            // a key (after an object's ',')
  kColon,          // ':' after a key
  kCommaOrClose,   // ',' or the container's closing bracket, after a value
  kString,         // inside a value string
  kKeyString,      // inside a key
  kEscape,         // after '\' in a value string (kKeyEscape in a key)
  kKeyEscape,
  kUnicode,        // \u's hex digits (aux of 4) in a value string (kKeyUnicode in a key)
  kKeyUnicode,
  kNumber,         // aux: its part (below)
  kLiteral,        // true / false / null: lit, aux bytes matched
  kDone,           // the object is complete: whitespace only
};
// A number's part, in order; the ones marked "end" may be its last byte.
enum NumPart : uint8_t { kMinus, kZero /*end*/, kInt /*end*/, kDot, kFrac /*end*/, kExp, kExpSign, kExpDigits /*end*/ };

constexpr const char* kLiterals[3] = {"true", "false", "null"};

bool is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// A value just ended: the container's next separator, or done at the top.
void value_done(JsonState& s) { s.mode = s.depth == 0 ? kDone : kCommaOrClose; }

bool open(JsonState& s, bool array) {
  if (s.depth >= kJsonMaxDepth) return false;
  const uint64_t bit = uint64_t(1) << s.depth;
  s.arrays = array ? s.arrays | bit : s.arrays & ~bit;
  ++s.depth;
  s.mode = array ? kValueOrClose : kKeyOrClose;
  return true;
}

bool close(JsonState& s, bool array) {
  if (s.depth == 0 || bool(s.arrays >> (s.depth - 1) & 1) != array) return false;
  --s.depth;
  value_done(s);
  return true;
}

bool start_value(JsonState& s, uint8_t c) {
  switch (c) {
    case '"': s.mode = kString; return true;
    case '{': return open(s, false);
    case '[': return open(s, true);
    case '-': s.mode = kNumber; s.aux = kMinus; return true;
    case 't': case 'f': case 'n':
      s.mode = kLiteral;
      s.lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
      s.aux = 1;
      return true;
    default:
      if (!is_digit(c)) return false;
      s.mode = kNumber;
      s.aux = c == '0' ? kZero : kInt;
      return true;
  }
}

bool number(JsonState& s, uint8_t c) {
  switch (s.aux) {
    case kMinus: if (!is_digit(c)) return false; s.aux = c == '0' ? kZero : kInt; return true;
    case kInt: if (is_digit(c)) return true; [[fallthrough]];
    case kZero:
      if (c == '.') { s.aux = kDot; return true; }
      if (c == 'e' || c == 'E') { s.aux = kExp; return true; }
      break;
    case kDot: if (!is_digit(c)) return false; s.aux = kFrac; return true;
    case kFrac:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') { s.aux = kExp; return true; }
      break;
    case kExp:
      if (c == '+' || c == '-') { s.aux = kExpSign; return true; }
      [[fallthrough]];
    case kExpSign: if (!is_digit(c)) return false; s.aux = kExpDigits; return true;
    case kExpDigits: if (is_digit(c)) return true; break;
  }
  // The number ended before c (its part may end one): c is the container's.
  if (s.aux != kZero && s.aux != kInt && s.aux != kFrac && s.aux != kExpDigits) return false;
  value_done(s);
  return json_feed(s, c);
}

}  // namespace

JsonState json_object_start() { return JsonState{}; }

bool json_done(const JsonState& s) { return s.mode == kDone; }

namespace {
bool feed(JsonState& s, uint8_t c) {
  const bool between = s.mode <= kCommaOrClose || s.mode == kDone;  // where whitespace may go
  if (between && is_ws(c)) {
    if (s.ws >= kJsonMaxWhitespace) return false;
    ++s.ws;
    return true;
  }
  s.ws = 0;
  switch (s.mode) {
    case kTop: return c == '{' && open(s, false);
    case kValue: return start_value(s, c);
    case kValueOrClose: return c == ']' ? close(s, true) : start_value(s, c);
    case kKeyOrClose:
      if (c == '}') return close(s, false);
      [[fallthrough]];
    case kKey:
      if (c != '"') return false;
      s.mode = kKeyString;
      return true;
    case kColon:
      if (c != ':') return false;
      s.mode = kValue;
      return true;
    case kCommaOrClose: {
      const bool array = s.arrays >> (s.depth - 1) & 1;
      if (c == ',') {
        s.mode = array ? kValue : kKey;
        return true;
      }
      return c == (array ? ']' : '}') && close(s, array);
    }
    case kString:
    case kKeyString: {
      const bool key = s.mode == kKeyString;
      if (c == '"') {
        if (key) s.mode = kColon;
        else value_done(s);
        return true;
      }
      if (c == '\\') {
        s.mode = key ? kKeyEscape : kEscape;
        return true;
      }
      return c >= 0x20;  // control characters must be escaped; other bytes (UTF-8 too) pass
    }
    case kEscape:
    case kKeyEscape: {
      const bool key = s.mode == kKeyEscape;
      if (c == 'u') {
        s.mode = key ? kKeyUnicode : kUnicode;
        s.aux = 0;
        return true;
      }
      if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't') return false;
      s.mode = key ? kKeyString : kString;
      return true;
    }
    case kUnicode:
    case kKeyUnicode:
      if (!is_hex(c)) return false;
      if (++s.aux == 4) s.mode = s.mode == kKeyUnicode ? kKeyString : kString;
      return true;
    case kNumber: return number(s, c);
    case kLiteral: {
      const char* lit = kLiterals[s.lit];
      if (c != uint8_t(lit[s.aux])) return false;
      if (lit[++s.aux] == '\0') value_done(s);
      return true;
    }
    default: return false;  // kDone: whitespace only
  }
}
}  // namespace

bool json_feed(JsonState& s, uint8_t c) {
  if (!feed(s, c)) return false;
  if (s.mode != kNumber && s.mode != kLiteral && s.mode != kUnicode && s.mode != kKeyUnicode)
    s.aux = s.lit = 0;  // one state a place, so a string's bytes leave it as it was (FinalChannelJson's cache)
  return true;
}

JsonTokenMask::JsonTokenMask(std::shared_ptr<const Tokenizer> tok, std::vector<int32_t> end_ids)
    : tok_(std::move(tok)), end_ids_(std::move(end_ids)), vocab_(tok_->vocab_size()) {
  plain_bits_.assign(size_t(vocab_ + 63) / 64, 0);
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < vocab_; ++id)
    if (!tok_->is_special(id) && !tok_->token_bytes(id).empty()) ids.push_back(id);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return tok_->token_bytes(a) < tok_->token_bytes(b); });
  auto add = [&](Sorted& list, int32_t id) {
    const std::string& b = tok_->token_bytes(id);
    size_t l = 0;
    if (!list.ids.empty()) {
      const std::string& a = tok_->token_bytes(list.ids.back());
      while (l < a.size() && l < b.size() && a[l] == b[l]) ++l;
    }
    list.ids.push_back(id);
    list.lcp.push_back(uint16_t(std::min<size_t>(l, 65535)));
  };
  for (int32_t id : ids) {
    const std::string& b = tok_->token_bytes(id);
    max_len_ = std::max(max_len_, b.size());
    add(all_, id);
    const bool plain = std::all_of(b.begin(), b.end(), [](char c) { return uint8_t(c) >= 0x20 && c != '"' && c != '\\'; });
    if (plain) plain_bits_[size_t(id) / 64] |= uint64_t(1) << (id % 64);
    else add(other_, id);
  }
}

void JsonTokenMask::walk(const Sorted& list, const JsonState& s, std::vector<uint64_t>& bits) const {
  thread_local std::vector<JsonState> st;  // a state a prefix byte; no allocation after a thread's first walk
  st.resize(max_len_ + 1);
  st[0] = s;
  constexpr int kNone = 1 << 30;
  int have = 0;     // st[0..have] are the states after the current prefix's first bytes
  int fail = kNone; // the last token walked failed on this byte
  for (size_t i = 0; i < list.ids.size(); ++i) {
    const int l = list.lcp[i];
    if (l > fail) continue;  // it begins with the prefix that failed
    const std::string& b = tok_->token_bytes(list.ids[i]);
    int k = std::min(l, have);
    fail = kNone;
    for (; k < int(b.size()); ++k) {
      st[size_t(k) + 1] = st[size_t(k)];
      if (!json_feed(st[size_t(k) + 1], uint8_t(b[size_t(k)]))) {
        fail = k;
        break;
      }
    }
    have = fail == kNone ? int(b.size()) : fail;
    if (fail == kNone) bits[size_t(list.ids[i]) / 64] |= uint64_t(1) << (list.ids[i] % 64);
  }
}

void JsonTokenMask::allowed(const JsonState& s, std::vector<uint64_t>& bits) const {
  if (s.mode == kString || s.mode == kKeyString) {
    bits = plain_bits_;  // plain text stays inside the string
    walk(other_, s, bits);
  } else {
    bits.assign(size_t(vocab_ + 63) / 64, 0);
    walk(all_, s, bits);
  }
  if (json_done(s))
    for (int32_t id : end_ids_) bits[size_t(id) / 64] |= uint64_t(1) << (id % 64);
}

FinalChannelJson::FinalChannelJson(std::shared_ptr<const JsonTokenMask> mask, bool from_start)
    : mask_(std::move(mask)), tok_(mask_->tokenizer()), phase_(from_start ? Phase::kJson : Phase::kFree) {
  auto id = [&](const char* t) { return tok_.token_id(t).value_or(-1); };
  channel_ = id("<|channel|>");
  message_ = id("<|message|>");
  constrain_ = id("<|constrain|>");
}

std::span<const uint64_t> FinalChannelJson::allowed() {
  if (phase_ != Phase::kJson) return {};
  if (!have_cache_ || !(cached_ == state_)) {
    mask_->allowed(state_, bits_);
    cached_ = state_;
    have_cache_ = true;
    // (Never nothing: byte tokens continue any valid prefix, but a mask with no bit must not starve a row.)
    any_ = std::any_of(bits_.begin(), bits_.end(), [](uint64_t w) { return w != 0; });
  }
  return any_ ? std::span<const uint64_t>(bits_) : std::span<const uint64_t>{};
}

void FinalChannelJson::accept(int32_t token) {
  switch (phase_) {
    case Phase::kFree:
    case Phase::kDone:
      if (token == channel_) {
        phase_ = Phase::kChannelName;
        name_.clear();
      }
      return;
    case Phase::kChannelName:
    case Phase::kHeader:
      if (token == message_) {  // "final", or "final <|constrain|>json": the name's first word
        const size_t a = name_.find_first_not_of(" \t\n"), b = name_.find_first_of(" \t\n", a);
        const bool final = a != std::string::npos && name_.substr(a, b == std::string::npos ? b : b - a) == "final";
        phase_ = final ? Phase::kJson : Phase::kFree;
        state_ = json_object_start();
      } else if (token == constrain_) {
        phase_ = Phase::kHeader;
      } else if (tok_.is_special(token)) {
        phase_ = token == channel_ ? Phase::kChannelName : Phase::kFree;
        name_.clear();
      } else if (phase_ == Phase::kChannelName) {
        name_ += tok_.token_bytes(token);
      }
      return;
    case Phase::kJson: {
      if (tok_.is_special(token)) {  // an end id once the object is complete
        phase_ = Phase::kDone;
        return;
      }
      for (char c : tok_.token_bytes(token))
        if (!json_feed(state_, uint8_t(c))) {  // (not from the mask: leave the rest free)
          phase_ = Phase::kDone;
          return;
        }
      return;
    }
  }
}

}  // namespace mx::harmony
