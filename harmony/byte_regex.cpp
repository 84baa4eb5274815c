#include "harmony/byte_regex.h"

#include <algorithm>
#include <cctype>
#include <fmt/format.h>
#include <map>

#include "core/error.h"

namespace mx::harmony {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code point ranges, inclusive
constexpr uint32_t kMaxCode = 0x10FFFF;

// The pattern as a tree: a set of code points, a sequence, alternatives, or a repetition.
struct Re {
  enum Kind { kSet, kCat, kAlt, kRep } kind = kCat;
  Ranges set;
  std::vector<Re> kids;
  int lo = 0, hi = 0;  // kRep: hi < 0 is unbounded
};

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [a, b] : r)
    if (!out.empty() && a <= out.back().second + 1) out.back().second = std::max(out.back().second, b);
    else out.push_back({a, b});
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges n = normalized(r), out;
  uint32_t next = 0;
  for (auto [a, b] : n) {
    if (a > next) out.push_back({next, a - 1});
    next = b + 1;
  }
  if (next <= kMaxCode) out.push_back({next, kMaxCode});
  return out;
}

class Parser {
 public:
  Parser(const std::string& p, const std::string& param) : p_(p), param_(param) {}

  Re parse() {
    if (at('^')) ++i_;
    Re r = alt();
    if (i_ < p_.size()) fail(fmt::format("unexpected '{}' at {}", p_[i_], i_));
    return r;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    throw InvalidRequest(param_, fmt::format("the pattern cannot be used: {}", msg));
  }
  bool at(char c) const { return i_ < p_.size() && p_[i_] == c; }

  Re alt() {
    Re r;
    r.kind = Re::kAlt;
    r.kids.push_back(cat());
    while (at('|')) {
      ++i_;
      r.kids.push_back(cat());
    }
    return r.kids.size() == 1 ? std::move(r.kids[0]) : r;
  }

  Re cat() {
    Re r;
    r.kind = Re::kCat;
    while (i_ < p_.size() && !at('|') && !at(')')) {
      if (at('$') && i_ + 1 == p_.size()) {  // the end anchor: the whole text matches anyway
        ++i_;
        break;
      }
      Re a = atom();
      while (i_ < p_.size() && (at('*') || at('+') || at('?') || at('{'))) a = quantified(std::move(a));
      r.kids.push_back(std::move(a));
    }
    return r;
  }

  Re quantified(Re a) {
    Re r;
    r.kind = Re::kRep;
    const char q = p_[i_++];
    if (q == '*') r.lo = 0, r.hi = -1;
    else if (q == '+') r.lo = 1, r.hi = -1;
    else if (q == '?') r.lo = 0, r.hi = 1;
    else {
      r.lo = number();
      r.hi = r.lo;
      if (at(',')) {
        ++i_;
        r.hi = at('}') ? -1 : number();
      }
      if (!at('}')) fail("a '{' quantifier must be {n}, {n,} or {n,m}");
      ++i_;
      if (r.hi >= 0 && r.hi < r.lo) fail("a quantifier's maximum is below its minimum");
      if (r.lo > 1000 || r.hi > 1000) fail("quantifiers above 1000 are not supported");
    }
    if (at('?') || at('+')) ++i_;  // lazy or possessive: the same texts match
    r.kids.push_back(std::move(a));
    return r;
  }

  int number() {
    size_t j = i_;
    while (j < p_.size() && std::isdigit(uint8_t(p_[j])) && j - i_ < 6) ++j;
    if (j == i_) fail("a '{' quantifier must be {n}, {n,} or {n,m}");
    const int v = std::stoi(p_.substr(i_, j - i_));
    i_ = j;
    return v;
  }

  uint32_t utf8() {  // the code point at i_ (a byte that is not UTF-8 stands for itself)
    const uint8_t c = uint8_t(p_[i_]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i_ + size_t(n) > p_.size()) fail("the pattern is not valid UTF-8");
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) cp = cp << 6 | (uint8_t(p_[i_ + size_t(k)]) & 0x3F);
    i_ += size_t(n);
    return cp;
  }

  static Re set(Ranges r) {
    Re s;
    s.kind = Re::kSet;
    s.set = normalized(std::move(r));
    return s;
  }

  // A backslash escape (i_ past the backslash): a class (\d ...) or one code point.
  Ranges escape() {
    if (i_ >= p_.size()) fail("the pattern ends in a backslash");
    const char c = p_[i_++];
    static const Ranges digit = {{'0', '9'}}, word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}},
                        space = {{'\t', '\r'}, {' ', ' '}};
    switch (c) {
      case 'd': return digit;
      case 'D': return complement(digit);
      case 'w': return word;
      case 'W': return complement(word);
      case 's': return space;
      case 'S': return complement(space);
      case 'n': return {{'\n', '\n'}};
      case 'r': return {{'\r', '\r'}};
      case 't': return {{'\t', '\t'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case 'u': {
        uint32_t cp = 0;
        for (int k = 0; k < 4; ++k, ++i_) {
          const char h = i_ < p_.size() ? p_[i_] : '\0';
          if (!std::isxdigit(uint8_t(h))) fail("\\u needs four hex digits");
          cp = cp * 16 + uint32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        return {{cp, cp}};
      }
      case 'b': case 'B': fail("word boundaries (\\b) are not supported");
      default:
        if (std::isdigit(uint8_t(c))) fail("backreferences are not supported");
        if (std::isalnum(uint8_t(c))) fail(fmt::format("unknown escape \\{}", c));
        return {{uint32_t(uint8_t(c)), uint32_t(uint8_t(c))}};
    }
  }

  Re atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (at('?')) {
        ++i_;
        if (at(':')) ++i_;
        else if (at('<') || at('P')) {
          if (at('P')) ++i_;
          if (!at('<') || p_.compare(i_, 2, "<=") == 0 || p_.compare(i_, 2, "<!") == 0) fail("lookbehind is not supported");
          const size_t e = p_.find('>', i_);
          if (e == std::string::npos) fail("an unterminated group name");
          i_ = e + 1;
        } else {
          fail("lookahead and group flags are not supported");
        }
      }
      Re r = alt();
      if (!at(')')) fail("an unclosed '('");
      ++i_;
      return r;
    }
    if (c == '[') return cls();
    if (c == '.') {
      ++i_;
      return set(complement({{'\n', '\n'}}));
    }
    if (c == '\\') {
      ++i_;
      return set(escape());
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') fail(fmt::format("'{}' has nothing to repeat", c));
    if (c == '^' || c == '$') fail("anchors are supported only at the pattern's ends");
    const uint32_t cp = utf8();
    return set({{cp, cp}});
  }

  Re cls() {
    ++i_;  // '['
    const bool neg = at('^');
    if (neg) ++i_;
    Ranges r;
    bool first = true;
    while (i_ < p_.size() && (!at(']') || first)) {
      first = false;
      Ranges lo;
      if (at('\\')) {
        ++i_;
        lo = escape();
      } else {
        const uint32_t cp = utf8();
        lo = {{cp, cp}};
      }
      if (lo.size() == 1 && lo[0].first == lo[0].second && at('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        uint32_t hi;
        if (at('\\')) {
          ++i_;
          const Ranges h = escape();
          if (h.size() != 1 || h[0].first != h[0].second) fail("a class range must end in one character");
          hi = h[0].first;
        } else {
          hi = utf8();
        }
        if (hi < lo[0].first) fail("a class range is reversed");
        lo[0].second = hi;
      }
      r.insert(r.end(), lo.begin(), lo.end());
    }
    if (!at(']')) fail("an unclosed '['");
    ++i_;
    return set(neg ? complement(r) : r);
  }

  const std::string& p_;
  const std::string& param_;
  size_t i_ = 0;
};

}  // namespace

// Thompson's construction over bytes (a code point set becomes its UTF-8 byte-range sequences), then the
// subset construction.
class ByteDfaBuilder {
 public:
  explicit ByteDfaBuilder(const std::string& param) : param_(param) {}

  std::shared_ptr<ByteDfa> build(const Re& re) {
    const int s = add(), e = add();
    frag(re, s, e);
    return determinize(s, e);
  }

 private:
  struct Edge {
    uint8_t lo, hi;
    int to;
  };
  struct State {
    std::vector<Edge> edges;
    std::vector<int> eps;
  };

  [[noreturn]] void fail(const std::string& msg) const {
    throw InvalidRequest(param_, fmt::format("the pattern cannot be used: {}", msg));
  }
  int add() {
    if (nfa_.size() >= 20000) fail("it is too large (over 20,000 automaton states before determinizing)");
    nfa_.emplace_back();
    return int(nfa_.size() - 1);
  }

  // The UTF-8 byte-range sequences of the code points [lo, hi] (surrogates left out), each from s to e.
  void utf8(uint32_t lo, uint32_t hi, int s, int e) {
    if (lo > hi) return;
    if (lo <= 0xDFFF && hi >= 0xD800) {  // not encodable
      utf8(lo, 0xD7FF, s, e);
      utf8(0xE000, hi, s, e);
      return;
    }
    for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu})
      if (lo <= edge && hi > edge) {
        utf8(lo, edge, s, e);
        utf8(edge + 1, hi, s, e);
        return;
      }
    const int n = lo <= 0x7F ? 1 : lo <= 0x7FF ? 2 : lo <= 0xFFFF ? 3 : 4;
    for (int i = 1; i < n; ++i) {  // split until each continuation byte spans a whole or a single range
      const uint32_t m = (1u << (6 * i)) - 1;
      if ((lo & ~m) != (hi & ~m)) {
        if ((lo & m) != 0) {
          utf8(lo, lo | m, s, e);
          utf8((lo | m) + 1, hi, s, e);
          return;
        }
        if ((hi & m) != m) {
          utf8(lo, (hi & ~m) - 1, s, e);
          utf8(hi & ~m, hi, s, e);
          return;
        }
      }
    }
    auto bytes = [n](uint32_t cp, uint8_t* b) {
      if (n == 1) b[0] = uint8_t(cp);
      else {
        for (int k = n - 1; k > 0; --k, cp >>= 6) b[k] = uint8_t(0x80 | (cp & 0x3F));
        b[0] = uint8_t((0xF00u >> n) | cp);
      }
    };
    uint8_t a[4], b[4];
    bytes(lo, a);
    bytes(hi, b);
    int cur = s;
    for (int k = 0; k < n; ++k) {
      const int to = k + 1 == n ? e : add();
      nfa_[size_t(cur)].edges.push_back({a[k], b[k], to});
      cur = to;
    }
  }

  void frag(const Re& re, int s, int e) {
    switch (re.kind) {
      case Re::kSet:
        for (auto [lo, hi] : re.set) utf8(lo, hi, s, e);
        return;
      case Re::kCat: {
        int cur = s;
        for (size_t k = 0; k < re.kids.size(); ++k) {
          const int to = k + 1 == re.kids.size() ? e : add();
          frag(re.kids[k], cur, to);
          cur = to;
        }
        if (re.kids.empty()) nfa_[size_t(s)].eps.push_back(e);
        return;
      }
      case Re::kAlt:
        for (const Re& k : re.kids) frag(k, s, e);
        return;
      case Re::kRep: {
        int cur = s;
        for (int k = 0; k < re.lo; ++k) {  // the required copies
          const int to = add();
          frag(re.kids[0], cur, to);
          cur = to;
        }
        if (re.hi < 0) {  // then a loop
          const int loop = add();
          nfa_[size_t(cur)].eps.push_back(loop);
          frag(re.kids[0], loop, loop);
          nfa_[size_t(loop)].eps.push_back(e);
          return;
        }
        for (int k = re.lo; k < re.hi; ++k) {  // then optional copies
          const int to = add();
          nfa_[size_t(cur)].eps.push_back(e);
          frag(re.kids[0], cur, to);
          cur = to;
        }
        nfa_[size_t(cur)].eps.push_back(e);
        return;
      }
    }
  }

  // The set and every state its epsilon edges reach, sorted (mark_ stamps this call's states: no clearing).
  void closure(std::vector<int>& set) {
    if (mark_.size() < nfa_.size()) mark_.resize(nfa_.size(), 0);
    ++stamp_;
    stack_.assign(set.begin(), set.end());
    for (int x : set) mark_[size_t(x)] = stamp_;
    while (!stack_.empty()) {
      const int x = stack_.back();
      stack_.pop_back();
      for (int y : nfa_[size_t(x)].eps)
        if (mark_[size_t(y)] != stamp_) mark_[size_t(y)] = stamp_, set.push_back(y), stack_.push_back(y);
    }
    std::sort(set.begin(), set.end());
  }

  std::shared_ptr<ByteDfa> determinize(int s, int e) {
    auto dfa = std::make_shared<ByteDfa>();
    std::map<std::vector<int>, int> ids;
    std::vector<std::vector<int>> sets;
    auto intern = [&](std::vector<int> set) {
      closure(set);
      auto [it, fresh] = ids.emplace(set, int(sets.size()));
      if (fresh) {
        if (sets.size() >= size_t(ByteDfa::kMaxStates))
          fail(fmt::format("it needs over {} automaton states", ByteDfa::kMaxStates));
        sets.push_back(set);
        dfa->accept_.push_back(std::binary_search(set.begin(), set.end(), e));
        dfa->next_.resize(sets.size() * 256, int16_t(ByteDfa::kDead));
      }
      return it->second;
    };
    intern({s});
    for (size_t d = 0; d < sets.size(); ++d) {
      std::vector<int> targets[256];
      for (int x : sets[d])
        for (const Edge& ed : nfa_[size_t(x)].edges)
          for (int c = ed.lo; c <= ed.hi; ++c) targets[c].push_back(ed.to);
      for (int c = 0; c < 256; ++c) {
        if (targets[c].empty()) continue;
        std::sort(targets[c].begin(), targets[c].end());
        targets[c].erase(std::unique(targets[c].begin(), targets[c].end()), targets[c].end());
        const int to = intern(std::move(targets[c]));
        dfa->next_[d * 256 + size_t(c)] = int16_t(to);
      }
    }
    return dfa;
  }

  const std::string& param_;
  std::vector<State> nfa_;
  std::vector<uint32_t> mark_;
  uint32_t stamp_ = 0;
  std::vector<int> stack_;
};

std::shared_ptr<const ByteDfa> ByteDfa::compile(const std::string& pattern, const std::string& param) {
  const Re re = Parser(pattern, param).parse();
  return ByteDfaBuilder(param).build(re);
}

}  // namespace mx::harmony
