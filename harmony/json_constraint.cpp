#include "harmony/json_constraint.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>

#include "core/error.h"

namespace mx::harmony {
namespace {

enum Mode : uint8_t {
  kTop,            // before the value: whitespace or its first byte
  kValue,          // a value of node `value` (after ':' or an array's ',')
  kValueOrClose,   // an item or ']' (after '[')
  kKeyOrClose,     // a key or '}' (after '{')
  kKey,            // a key (after an object's ',')
  kColon,          // ':' after a key
  kCommaOrClose,   // ',' or the container's closing bracket, after a value
  kString,         // inside a value string
  kKeyString,      // inside a key of an object without listed properties
  kKeyMatch,       // inside a listed key: its bytes against the candidates' (keys, aux bytes matched)
  kEscape,         // after '\' in a value string (kKeyEscape in a free key)
  kKeyEscape,
  kUnicode,        // \u's hex digits (aux of 4) in a value string (kKeyUnicode in a free key)
  kKeyUnicode,
  kNumber,         // aux: its part (below)
  kLiteral,        // true / false / null: lit, aux bytes matched
  kEnum,           // an enum / const value's JSON text: literals [lo, hi) of node `value`, aux bytes matched
  kPatternString,  // inside a string with node `value`'s pattern: its automaton's state in lo
  kRegex,          // a guided_regex text: node `value`'s pattern, its state in lo
  kDone,           // the value is complete: whitespace only
};
// A number's part, in order; the ones marked "end" may be its last byte.
enum NumPart : uint8_t { kMinus, kZero /*end*/, kInt /*end*/, kDot, kFrac /*end*/, kExp, kExpSign, kExpDigits /*end*/ };

constexpr const char* kLiterals[3] = {"true", "false", "null"};

bool is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool number_may_end(uint8_t part) { return part == kZero || part == kInt || part == kFrac || part == kExpDigits; }

bool feed(const JsonSchema& sc, JsonState& s, uint8_t c);

// A value just ended: the container's next separator, or done at the top.
void value_done(JsonState& s) { s.mode = s.depth == 0 ? kDone : kCommaOrClose; }

bool open(JsonState& s, int32_t node, bool array) {
  if (s.depth >= kJsonMaxDepth) return false;
  s.frames[s.depth] = JsonFrame{0, uint16_t(node), 0, uint8_t(array)};
  ++s.depth;
  s.mode = array ? kValueOrClose : kKeyOrClose;
  return true;
}

bool close(const JsonSchema& sc, JsonState& s, bool array) {
  if (s.depth == 0) return false;
  const JsonFrame& f = s.frames[s.depth - 1];
  if (bool(f.array) != array) return false;
  const JsonSchemaNode& n = sc.node(f.node);
  if (array && f.count < n.min_items) return false;
  if (!array)
    for (size_t i = 0; i < n.props.size(); ++i)
      if (n.props[i].required && !(f.seen >> i & 1)) return false;
  --s.depth;
  value_done(s);
  return true;
}

// An object's next key may come: an unseen listed property, or any key where none are listed.
bool more_keys(const JsonSchema& sc, const JsonFrame& f) {
  const JsonSchemaNode& n = sc.node(f.node);
  if (n.props.empty()) return n.extra >= 0;
  return f.seen != (n.props.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << n.props.size()) - 1);
}

bool start_key(const JsonSchema& sc, JsonState& s) {
  const JsonFrame& f = s.frames[s.depth - 1];
  const JsonSchemaNode& n = sc.node(f.node);
  if (n.props.empty()) {
    if (n.extra < 0) return false;
    s.mode = kKeyString;
    return true;
  }
  const uint64_t all = n.props.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << n.props.size()) - 1;
  s.keys = all & ~f.seen;
  if (!s.keys) return false;
  s.mode = kKeyMatch;
  s.aux = 0;
  return true;
}

bool key_match(const JsonSchema& sc, JsonState& s, uint8_t c) {
  JsonFrame& f = s.frames[s.depth - 1];
  const auto& props = sc.node(f.node).props;
  // The candidates share the key's bytes so far: after an odd run of backslashes, '"' is the key's own.
  const std::string& some = props[size_t(__builtin_ctzll(s.keys))].key;
  size_t slashes = 0;
  while (slashes < s.aux && some[s.aux - 1 - slashes] == '\\') ++slashes;
  if (c == '"' && slashes % 2 == 0) {
    for (size_t i = 0; i < props.size(); ++i)
      if ((s.keys >> i & 1) && props[i].key.size() == s.aux) {
        f.seen |= uint64_t(1) << i;
        s.value = uint16_t(props[i].node);
        s.mode = kColon;
        return true;
      }
    return false;
  }
  uint64_t next = 0;
  for (size_t i = 0; i < props.size(); ++i)
    if ((s.keys >> i & 1) && props[i].key.size() > s.aux && uint8_t(props[i].key[s.aux]) == c) next |= uint64_t(1) << i;
  if (!next) return false;
  s.keys = next;
  ++s.aux;
  return true;
}

// The next byte of an enum / const value: the literals [lo, hi) share their first aux bytes (sorted, so a
// literal of exactly aux bytes is the first); a byte none continues ends a complete literal before it.
bool enum_step(const JsonSchema& sc, JsonState& s, uint8_t c) {
  const auto& lits = sc.literals(sc.node(s.value).literals);
  const size_t pos = s.aux;
  const bool complete = lits[s.lo].size() == pos;
  auto at = [&](int i) { return uint8_t(lits[size_t(i)][pos]); };
  int first = s.lo + (complete ? 1 : 0), last = s.hi;
  while (first < last && at(first) < c) ++first;  // (enums are short: a scan, not a search)
  int end = first;
  while (end < last && at(end) == c) ++end;
  if (first < end) {
    s.lo = uint16_t(first);
    s.hi = uint16_t(end);
    s.aux = uint8_t(pos + 1);
    if (end - first == 1 && lits[size_t(first)].size() == pos + 1) value_done(s);
    return true;
  }
  if (!complete) return false;
  value_done(s);
  return feed(sc, s, c);
}

// A pattern string's or a guided_regex text's next byte, through the automaton.
bool pattern_step(const JsonSchema& sc, JsonState& s, uint8_t c) {
  const ByteDfa& d = sc.pattern(sc.node(s.value).pattern);
  if (s.mode == kPatternString) {
    if (c == '"') {
      if (!d.accepting(s.lo)) return false;
      value_done(s);
      return true;
    }
    if (c < 0x20 || c == '\\') return false;  // (a pattern string is written without escapes)
  }
  const int to = d.next(s.lo, c);
  if (to == ByteDfa::kDead) return false;
  s.lo = uint16_t(to);
  return true;
}

bool start_value(const JsonSchema& sc, JsonState& s, int32_t node, uint8_t c) {
  const JsonSchemaNode& n = sc.node(node);
  if (n.pattern >= 0 && sc.raw()) {  // guided_regex: the text from its first byte
    s.mode = kRegex;
    s.value = uint16_t(node);
    s.lo = uint16_t(sc.pattern(n.pattern).start());
    return pattern_step(sc, s, c);
  }
  if (n.literals >= 0) {
    s.mode = kEnum;
    s.value = uint16_t(node);
    s.lo = 0;
    s.hi = uint16_t(sc.literals(n.literals).size());
    s.aux = 0;
    return enum_step(sc, s, c);
  }
  if (!n.any_of.empty()) {
    for (int32_t a : n.any_of)
      if (sc.may_start(a, c)) return start_value(sc, s, a, c);
    return false;
  }
  if (!sc.may_start(node, c)) return false;
  switch (c) {
    case '"':
      if (n.pattern >= 0) {
        s.mode = kPatternString;
        s.value = uint16_t(node);
        s.lo = uint16_t(sc.pattern(n.pattern).start());
      } else {
        s.mode = kString;
      }
      return true;
    case '{': return open(s, node, false);
    case '[': return open(s, node, true);
    case 't': case 'f': case 'n':
      s.mode = kLiteral;
      s.lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
      s.aux = 1;
      return true;
    default:  // '-' or a digit
      s.mode = kNumber;
      s.int_only = !(n.types & kJsonNumber);
      s.aux = c == '-' ? kMinus : c == '0' ? kZero : kInt;
      return true;
  }
}

// An array's next item begins with c.
bool array_item(const JsonSchema& sc, JsonState& s, uint8_t c) {
  JsonFrame& f = s.frames[s.depth - 1];
  const JsonSchemaNode& n = sc.node(f.node);
  if (f.count >= n.max_items) return false;
  if (f.count < 255) ++f.count;
  return start_value(sc, s, n.items, c);
}

bool number(const JsonSchema& sc, JsonState& s, uint8_t c) {
  switch (s.aux) {
    case kMinus: if (!is_digit(c)) return false; s.aux = c == '0' ? kZero : kInt; return true;
    case kInt: if (is_digit(c)) return true; [[fallthrough]];
    case kZero:
      if (s.int_only) break;
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
  if (!number_may_end(s.aux)) return false;
  value_done(s);
  return feed(sc, s, c);
}

bool feed(const JsonSchema& sc, JsonState& s, uint8_t c) {
  // Where whitespace may go (a choice's text stands alone).
  const bool between = (s.mode <= kCommaOrClose || s.mode == kDone) && !(sc.raw() && s.depth == 0);
  if (between && is_ws(c)) {
    if (s.ws >= kJsonMaxWhitespace) return false;
    ++s.ws;
    return true;
  }
  s.ws = 0;
  switch (s.mode) {
    case kTop:
    case kValue: return start_value(sc, s, s.value, c);
    case kValueOrClose: return c == ']' ? close(sc, s, true) : array_item(sc, s, c);
    case kKeyOrClose:
      if (c == '}') return close(sc, s, false);
      [[fallthrough]];
    case kKey: return c == '"' && start_key(sc, s);
    case kColon:
      if (c != ':') return false;
      s.mode = kValue;
      return true;
    case kCommaOrClose: {
      JsonFrame& f = s.frames[s.depth - 1];
      if (c != ',') return c == (f.array ? ']' : '}') && close(sc, s, f.array);
      if (!f.array) {
        if (!more_keys(sc, f)) return false;
        s.mode = kKey;
        return true;
      }
      const JsonSchemaNode& n = sc.node(f.node);
      if (f.count >= n.max_items) return false;
      if (f.count < 255) ++f.count;
      s.value = uint16_t(n.items);
      s.mode = kValue;
      return true;
    }
    case kString:
    case kKeyString: {
      const bool key = s.mode == kKeyString;
      if (c == '"') {
        if (key) {
          s.value = uint16_t(sc.node(s.frames[s.depth - 1].node).extra);
          s.mode = kColon;
        } else {
          value_done(s);
        }
        return true;
      }
      if (c == '\\') {
        s.mode = key ? kKeyEscape : kEscape;
        return true;
      }
      return c >= 0x20;  // control characters must be escaped; other bytes (UTF-8 too) pass
    }
    case kKeyMatch: return key_match(sc, s, c);
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
    case kNumber: return number(sc, s, c);
    case kLiteral: {
      const char* lit = kLiterals[s.lit];
      if (c != uint8_t(lit[s.aux])) return false;
      if (lit[++s.aux] == '\0') value_done(s);
      return true;
    }
    case kEnum: return enum_step(sc, s, c);
    case kPatternString:
    case kRegex: return pattern_step(sc, s, c);
    default: return false;  // kDone: whitespace only
  }
}

}  // namespace

bool JsonState::operator==(const JsonState& o) const {
  if (keys != o.keys || value != o.value || lo != o.lo || hi != o.hi || depth != o.depth || mode != o.mode ||
      aux != o.aux || lit != o.lit || ws != o.ws || int_only != o.int_only)
    return false;
  for (int i = 0; i < depth; ++i) {
    const JsonFrame &a = frames[i], &b = o.frames[i];
    if (a.seen != b.seen || a.node != b.node || a.count != b.count || a.array != b.array) return false;
  }
  return true;
}

void json_copy(JsonState& to, const JsonState& from) {
  std::memcpy(static_cast<void*>(&to), &from, offsetof(JsonState, frames) + size_t(from.depth) * sizeof(JsonFrame));
}

JsonState json_start(const JsonSchema& schema) {
  JsonState s;
  s.value = uint16_t(schema.root());
  return s;
}

bool json_done(const JsonSchema& schema, const JsonState& s) {
  if (s.mode == kDone) return true;
  if (s.depth != 0) return false;  // a number or an enum's literal at the top ends where the text does
  if (s.mode == kNumber) return number_may_end(s.aux);
  if (s.mode == kRegex) return schema.pattern(schema.node(s.value).pattern).accepting(s.lo);
  return s.mode == kEnum && schema.literals(schema.node(s.value).literals)[s.lo].size() == s.aux;
}

bool json_feed(const JsonSchema& schema, JsonState& s, uint8_t c) {
  if (!feed(schema, s, c)) return false;
  // One state a place, so a string's bytes leave it as it was (FinalChannelJson's cache).
  const uint8_t m = s.mode;
  if (m != kNumber && m != kLiteral && m != kUnicode && m != kKeyUnicode && m != kEnum && m != kKeyMatch) s.aux = s.lit = 0;
  if (m != kKeyMatch) s.keys = 0;
  const bool automaton = m == kPatternString || m == kRegex;
  if (m != kEnum && !automaton) s.lo = 0;
  if (m != kEnum) s.hi = 0;
  if (m != kTop && m != kValue && m != kColon && m != kEnum && !automaton) s.value = 0;
  if (m != kNumber) s.int_only = 0;
  return true;
}

JsonTokenMask::JsonTokenMask(std::shared_ptr<const Tokenizer> tok) : tok_(std::move(tok)), vocab_(tok_->vocab_size()) {
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
    if (list.off.empty()) list.off.push_back(0);
    list.blob += b;
    list.off.push_back(uint32_t(list.blob.size()));
  };
  for (int32_t id : ids) {
    const std::string& b = tok_->token_bytes(id);
    max_len_ = std::max(max_len_, b.size());
    add(all_, id);
    const bool plain = std::all_of(b.begin(), b.end(), [](char c) { return uint8_t(c) >= 0x20 && c != '"' && c != '\\'; });
    if (plain) plain_bits_[size_t(id) / 64] |= uint64_t(1) << (id % 64);
    else add(other_, id);
  }
  all_.index();
  other_.index();
}

void JsonTokenMask::Sorted::index() {
  const size_t n = ids.size();
  skip1.assign(n, int32_t(n));
  skip2.assign(n, int32_t(n));
  for (int64_t i = int64_t(n) - 2; i >= 0; --i) {
    const size_t u = size_t(i);
    skip1[u] = lcp[u + 1] < 1 ? int32_t(u + 1) : skip1[u + 1];
    skip2[u] = lcp[u + 1] < 2 ? int32_t(u + 1) : skip2[u + 1];
  }
}

namespace {

// What a walk's step says of a token's byte k: it continues the prefix (state k + 1 written), fails it
// (every token under that prefix is skipped), or decides this token alone from here (states 0..k stay).
enum class Byte { kNext, kFail, kTokenOk, kTokenBad };

// The sorted tokens walked as a trie: a token reuses the states of the prefix it shares with the one
// before, and a prefix that failed skips its tokens at once (a first or second byte in one jump).
template <class List, class Step>
void walk_sorted(const List& list, Step&& step, std::vector<uint64_t>& bits) {
  constexpr int kNone = 1 << 30;
  int have = 0;      // states 0..have are those after the current prefix's first bytes
  int fail = kNone;  // the last token walked failed on this byte
  const size_t n = list.ids.size();
  for (size_t i = 0; i < n;) {
    const int l = list.lcp[i];
    if (l > fail) {  // it begins with the prefix that failed
      ++i;
      continue;
    }
    const std::string_view b = list.bytes(i);
    int k = std::min(l, have);
    fail = kNone;
    bool ok = true;
    for (; k < int(b.size()); ++k) {
      const Byte r = step(k, uint8_t(b[size_t(k)]), b);
      if (r == Byte::kNext) continue;
      if (r == Byte::kFail) fail = k;
      ok = r == Byte::kTokenOk;
      break;
    }
    have = k;
    if (ok) bits[size_t(list.ids[i]) / 64] |= uint64_t(1) << (list.ids[i] % 64);
    i = fail == 0 ? size_t(list.skip1[i]) : fail == 1 ? size_t(list.skip2[i]) : i + 1;
  }
}

}  // namespace

void JsonTokenMask::walk(const Sorted& list, const JsonSchema& schema, const JsonState& s, std::vector<uint64_t>& bits) const {
  thread_local std::vector<JsonState> st;  // a state a prefix byte; no allocation after a thread's first walk
  st.resize(max_len_ + 1);
  json_copy(st[0], s);
  walk_sorted(list, [&](int k, uint8_t c, std::string_view) {
    json_copy(st[size_t(k) + 1], st[size_t(k)]);
    return json_feed(schema, st[size_t(k) + 1], c) ? Byte::kNext : Byte::kFail;
  }, bits);
}

// In a pattern the walk steps the automaton alone (a table lookup a byte, not the recognizer); a byte that
// may end a pattern string (or is one a string cannot hold) hands the rest of that token to the recognizer.
void JsonTokenMask::walk_pattern(const JsonSchema& schema, const JsonState& s, std::vector<uint64_t>& bits) const {
  const ByteDfa& d = schema.pattern(schema.node(s.value).pattern);
  const bool str = s.mode == kPatternString;
  thread_local std::vector<int> q;
  q.resize(max_len_ + 1);
  q[0] = s.lo;
  walk_sorted(all_, [&](int k, uint8_t c, std::string_view b) {
    if (str && (c == '"' || c == '\\' || c < 0x20)) {  // (rare) the recognizer takes the rest from here
      JsonState t;
      json_copy(t, s);
      t.lo = uint16_t(q[size_t(k)]);
      bool ok = true;
      for (size_t j = size_t(k); ok && j < b.size(); ++j) ok = json_feed(schema, t, uint8_t(b[j]));
      return ok ? Byte::kTokenOk : Byte::kTokenBad;  // (no skip: a longer token may continue differently)
    }
    const int to = d.next(q[size_t(k)], c);
    if (to == ByteDfa::kDead) return Byte::kFail;
    q[size_t(k) + 1] = to;
    return Byte::kNext;
  }, bits);
}

void JsonTokenMask::allowed(const JsonSchema& schema, const JsonState& s, std::vector<uint64_t>& bits) const {
  if (s.mode == kString || s.mode == kKeyString) {
    bits = plain_bits_;  // plain text stays inside the string
    walk(other_, schema, s, bits);
  } else if (s.mode == kPatternString || s.mode == kRegex) {
    bits.assign(size_t(vocab_ + 63) / 64, 0);
    walk_pattern(schema, s, bits);
  } else {
    bits.assign(size_t(vocab_ + 63) / 64, 0);
    walk(all_, schema, s, bits);
  }
}

}  // namespace mx::harmony
