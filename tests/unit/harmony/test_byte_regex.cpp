// The byte-level regex automaton of structured output (harmony/byte_regex.h): whole-text matches against
// std::regex (ECMAScript) on ASCII patterns and texts, UTF-8 classes and dots by code point, and the
// refusals with their messages.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "harmony/byte_regex.h"

using namespace mx;
using namespace mx::harmony;

namespace {

bool matches(const ByteDfa& d, const std::string& text) {
  int s = d.start();
  for (char c : text) {
    s = d.next(s, uint8_t(c));
    if (s == ByteDfa::kDead) return false;
  }
  return d.accepting(s);
}

TEST(ByteRegex, MatchesLikeStdRegex) {
  const std::vector<std::string> patterns = {
      "abc", "a|bc|", "(ab)*c", "a+b?", "[a-c]{2,3}", "x{2}", "x{2,}", "\\d{3}-\\d{4}", "[^0-9]+", "\\w+@\\w+\\.com",
      "(?:yes|no|maybe)", "(?<word>[A-Z][a-z]*)( [A-Z][a-z]*)*", "\\s*\\S+\\s*", "[-+]?[0-9]*\\.?[0-9]+([eE][-+]?[0-9]+)?",
      "a.c", "[\\]\\\\-]+", "(a|b)*abb", "(a*)*b", "\\(\\)\\[\\]\\{\\}\\.\\*", "^start$", "a{0,2}?b+?", "[a-z-]+"};
  const std::vector<std::string> texts = {
      "", "a", "abc", "bc", "c", "ababc", "ab", "aab", "b", "ac", "abcc", "xx", "x", "xxxx", "555-1234", "55-1234",
      "hello", "h3llo", "me@site.com", "me@site.org", "yes", "maybe", "nope", "New York", "New york", "  hi ", "hi there",
      "-1.5e+3", ".5", "1.", "a\nc", "abc", "]\\-", "]", "abb", "aababb", "aaab", "()[]{}.*", "start", "aab", "bbb",
      "a-b-c", "A"};
  for (const std::string& p : patterns) {
    const auto d = ByteDfa::compile(p, "regex");
    const std::string ecma = (p.size() > 1 && p[0] == '^') ? p.substr(1, p.size() - 2) : p;
    const std::regex ref(ecma == "(?<word>[A-Z][a-z]*)( [A-Z][a-z]*)*" ? "([A-Z][a-z]*)( [A-Z][a-z]*)*" : ecma);
    for (const std::string& t : texts) EXPECT_EQ(matches(*d, t), std::regex_match(t, ref)) << "/" << p << "/ on '" << t << "'";
  }
}

TEST(ByteRegex, CodePointsNotBytes) {
  const auto dot = ByteDfa::compile("a.c", "regex");
  EXPECT_TRUE(matches(*dot, "aéc"));       // two bytes, one code point
  EXPECT_TRUE(matches(*dot, "a😀c"));      // four bytes
  EXPECT_FALSE(matches(*dot, "aééc"));
  EXPECT_FALSE(matches(*dot, "a\xC3"));    // a cut sequence
  const auto cls = ByteDfa::compile("[à-ÿ一-龥]+", "regex");
  EXPECT_TRUE(matches(*cls, "éü中文"));
  EXPECT_FALSE(matches(*cls, "ée"));
  const auto neg = ByteDfa::compile("[^é]+", "regex");
  EXPECT_TRUE(matches(*neg, "aü中"));
  EXPECT_FALSE(matches(*neg, "aé"));
  const auto u = ByteDfa::compile("\\u00e9\\u4e2d", "regex");
  EXPECT_TRUE(matches(*u, "é中"));
}

TEST(ByteRegex, RefusesWhatItCannotHold) {
  for (const char* p : {"(?=a)b", "(?!a)", "(?<=a)b", "(a)\\1", "\\bword", "a^b", "a$b", "(ab", "[ab", "*a", "a{2,1}",
                        "a{5000}", "\\q", "\\u12"}) {
    try {
      ByteDfa::compile(p, "guided_regex");
      ADD_FAILURE() << p << " compiled";
    } catch (const InvalidRequest& e) {
      EXPECT_EQ(e.param(), "guided_regex") << p;
      EXPECT_NE(std::string(e.what()).find("the pattern cannot be used"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(ByteDfa::compile("(a|b|c|d|e|f|g|h)*a(a|b|c|d|e|f|g|h){14}", "guided_regex"), InvalidRequest);  // 2^15 states
}

}  // namespace
