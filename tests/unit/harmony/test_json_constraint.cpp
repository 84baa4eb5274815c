// Structured output's JSON constraint (harmony/json_constraint.h): the byte recognizer on valid and invalid
// texts, the token mask against feeding every token's bytes one by one, and one choice's constraint over
// a harmony completion (free analysis, then the final channel held to one object).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "harmony/json_constraint.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace mx;
using namespace mx::harmony;

namespace {

std::shared_ptr<const Tokenizer> real_tok() {
  static std::shared_ptr<const Tokenizer> tok = [] {
    fs::path p = fs::path(MX_SOURCE_DIR) / ".assets/tokenizer/tokenizer.json";
    return fs::exists(p) ? Tokenizer::load(p.string()) : nullptr;
  }();
  return tok;
}

// How many bytes of text the recognizer takes (text.size() when all), and whether it ends complete.
std::pair<size_t, bool> run(const std::string& text) {
  JsonState s = json_object_start();
  for (size_t i = 0; i < text.size(); ++i)
    if (!json_feed(s, uint8_t(text[i]))) return {i, false};
  return {text.size(), json_done(s)};
}

TEST(JsonConstraint, ValidObjects) {
  for (const std::string t : {R"({})", R"({"a":1})", " {\n  \"a\" : [ 1 , 2.5 , -3e+2, 0, -0.5E-7 ] \n}\t",
                              R"({"k":{"n":null,"t":true,"f":false,"s":"x\n\"\\\/\b\f\r\t\u00e9 é 😀"},"e":[],"o":{}})",
                              R"({"":""})", R"({"a":[[[{"b":[{}]}]]]})"}) {
    SCOPED_TRACE(t);
    const auto [n, done] = run(t);
    EXPECT_EQ(n, t.size());
    EXPECT_TRUE(done);
    EXPECT_FALSE(run(t.substr(0, t.find_last_of('}'))).second);  // one byte short of the close: not done
  }
}

TEST(JsonConstraint, InvalidTexts) {
  // {text, the byte the recognizer refuses}
  const std::vector<std::pair<std::string, size_t>> bad = {
      {"[1]", 0}, {"\"a\"", 0}, {"{\"a\" 1}", 5}, {"{\"a\":01}", 6}, {"{\"a\":1,}", 7}, {"{,}", 1},
      {"{\"a\":tru}", 8}, {"{\"a\":\"\x01\"}", 6}, {"{\"a\":\"\\x\"}", 7}, {"{\"a\":\"\\u12g4\"}", 10},
      {"{\"a\":1.}", 7}, {"{\"a\":1e}", 7}, {"{\"a\":-}", 6}, {"{\"a\":[1}", 7}, {"{\"a\":{\"b\":1]}", 11},
      {"{}x", 2}, {"{}{}", 2}, {"{\"a\":1 2}", 7}, {"{a:1}", 1}};
  for (const auto& [t, at] : bad) {
    SCOPED_TRACE(t);
    EXPECT_EQ(run(t).first, at);
  }
  std::string deep = "{\"a\":";  // 63 containers open at most
  for (int i = 1; i < kJsonMaxDepth; ++i) deep += "[";
  EXPECT_EQ(run(deep).first, deep.size());
  EXPECT_EQ(run(deep + "[").first, deep.size());
  const std::string ws(kJsonMaxWhitespace, ' ');
  EXPECT_EQ(run("{" + ws + "}").first, ws.size() + 2);
  EXPECT_EQ(run("{" + ws + " }").first, ws.size() + 1);  // no endless blank output
}

// The mask holds exactly the tokens whose bytes the recognizer takes from the state, and the end ids only
// once the object is complete; the special tokens never.
TEST(JsonConstraint, MaskIsEveryTokenThatFits) {
  auto tok = real_tok();
  if (!tok) GTEST_SKIP() << ".assets/tokenizer/tokenizer.json missing";
  const int32_t ret = tok->token_id("<|return|>").value();
  auto mask = std::make_shared<JsonTokenMask>(tok, std::vector<int32_t>{ret});
  std::vector<uint64_t> bits;
  for (const std::string prefix : {"", "{", "{\"a\":", "{\"a\":\"some te", "{\"a\":12", "{\"a\":[1, tr", "{\"a\":{}}", "{\"a\":\"\\u00"}) {
    SCOPED_TRACE(prefix);
    JsonState s = json_object_start();
    for (char c : prefix) ASSERT_TRUE(json_feed(s, uint8_t(c)));
    mask->allowed(s, bits);
    int n = 0;
    for (int32_t id = 0; id < tok->vocab_size(); ++id) {
      bool fits = !tok->is_special(id) && !tok->token_bytes(id).empty();
      JsonState t = s;
      for (char c : tok->token_bytes(id)) fits = fits && json_feed(t, uint8_t(c));
      if (id == ret) fits = json_done(s);
      const bool got = bits[size_t(id) / 64] >> (id % 64) & 1;
      ASSERT_EQ(got, fits) << "token " << id << " '" << tok->token_bytes(id) << "'";
      n += got;
    }
    EXPECT_GT(n, 0);
  }
}

// A harmony completion: the analysis channel is free, the final channel's text is held to one object
// (each token of a valid answer is in the mask before it is taken; <|return|> only once it is complete),
// and after the end the choice is free again.
TEST(JsonConstraint, FinalChannelOnly) {
  auto tok = real_tok();
  if (!tok) GTEST_SKIP() << ".assets/tokenizer/tokenizer.json missing";
  const int32_t ret = tok->token_id("<|return|>").value(), end = tok->token_id("<|end|>").value();
  auto mask = std::make_shared<JsonTokenMask>(tok, std::vector<int32_t>{ret, end});
  FinalChannelJson c(mask);
  auto allowed = [&](int32_t id) {
    auto bits = c.allowed();
    return bits.empty() || (bits[size_t(id) / 64] >> (id % 64) & 1);
  };
  for (int32_t t : tok->encode("<|channel|>analysis<|message|>Think: [1, 2}<|end|><|start|>assistant", true)) {
    EXPECT_TRUE(c.allowed().empty());
    c.accept(t);
  }
  for (int32_t t : tok->encode("<|channel|>final <|constrain|>json<|message|>", true)) {
    EXPECT_FALSE(c.active());
    c.accept(t);
  }
  ASSERT_TRUE(c.active());
  EXPECT_FALSE(allowed(ret));
  EXPECT_FALSE(allowed(tok->encode("[", false)[0]));
  EXPECT_FALSE(allowed(tok->encode("Sure", false)[0]));
  for (int32_t t : tok->encode("{\"name\": \"Ada\", \"born\": 1815, \"tags\": [\"math\", null]}", false)) {
    ASSERT_TRUE(allowed(t)) << "'" << tok->token_bytes(t) << "'";
    EXPECT_FALSE(allowed(ret));
    c.accept(t);
  }
  EXPECT_TRUE(allowed(ret));
  EXPECT_FALSE(allowed(tok->encode("x", false)[0]));
  c.accept(ret);
  EXPECT_FALSE(c.active());
  EXPECT_TRUE(c.allowed().empty());
  FinalChannelJson other(mask);  // another channel's name: free
  for (int32_t t : tok->encode("<|channel|>commentary<|message|>{", true)) c.accept(t), other.accept(t);
  EXPECT_FALSE(other.active());
  EXPECT_TRUE(other.allowed().empty());
}

}  // namespace
