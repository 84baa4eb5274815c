// Structured output's JSON constraint (harmony/json_constraint.h): the byte recognizer on valid and invalid
// texts, the token mask against feeding every token's bytes one by one, and one choice's constraint over
// a harmony completion (free analysis, then the final channel held to one object).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "harmony/json_constraint.h"
#include "nlohmann/json.hpp"
#include "tests/unit/harmony/real_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace mx;
using namespace mx::harmony;

namespace {

using mx::testing::real_tok;

// How many bytes of text the recognizer takes (text.size() when all), and whether it ends complete.
std::pair<size_t, bool> run(const std::string& text, const JsonSchema& sc = *JsonSchema::any_object()) {
  JsonState s = json_start(sc);
  for (size_t i = 0; i < text.size(); ++i)
    if (!json_feed(sc, s, uint8_t(text[i]))) return {i, false};
  return {text.size(), json_done(sc, s)};
}

std::shared_ptr<const JsonSchema> schema(const char* text) {
  return JsonSchema::compile(nlohmann::json::parse(text), "schema");
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

// A schema with every keyword the recognizer holds: listed keys in any order (required ones present, no
// others), integer, enum, array bounds, anyOf, a recursive $ref.
constexpr const char* kPerson = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "kind": {"enum": ["x", "xy", 7, null]},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    "opt": {"anyOf": [{"type": "number"}, {"type": "null"}]}, "nested": {"$ref": "#/$defs/node"}
  },
  "required": ["name", "age", "kind"],
  "$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
                                                      "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
                     "required": ["value"], "additionalProperties": false}}
})";

TEST(JsonConstraint, SchemaHoldsTheText) {
  const auto sc = schema(kPerson);
  for (const std::string t : {R"({"name":"A","age":3,"kind":"x"})",
                              "{ \"age\" : -3, \"kind\": \"xy\", \"name\": \"B\", \"tags\": [\"a\", \"b\"], \"opt\": null }",
                              R"({"kind":7,"name":"","age":0,"opt":1.5e3,"nested":{"value":1,"next":{"value":2,"next":null}}})",
                              R"({"kind":null,"name":"\"q\"","age":10,"tags":[]})"}) {
    SCOPED_TRACE(t);
    const auto [n, done] = run(t, *sc);
    EXPECT_EQ(n, t.size());
    EXPECT_TRUE(done);
  }
  // {text, the byte the recognizer refuses}
  const std::vector<std::pair<std::string, size_t>> bad = {
      {R"({"name":"A","age":3.5)", 19},         // integer
      {R"({"nam":)", 5},                        // a key that is only a listed key's prefix
      {R"({"name":1)", 8},                      // a string
      {R"({"name":"A"})", 11},                  // required keys missing
      {R"({"name":"A","name")", 14},            // a key given twice ("n" may still be "nested")
      {R"({"age":1,"kind":"z")", 17},           // not in the enum
      {R"({"kind":"xyz")", 11},                 // past the enum's longest
      {R"({"kind":77)", 9},                     // 7, then no literal continues with 7
      {R"({"tags":["a","b","a"])", 16},         // maxItems
      {R"({"tags":["c"])", 10},
      {R"({"extra":1})", 2},                    // no other keys
      {R"({"opt":"x")", 7},                     // neither alternative begins with '"'
      {R"({"nested":{"value":1,"x":1})", 22},   // additionalProperties false
      {R"({"nested":{})", 11},                  // the nested node's required value
      {"[1]", 0}};
  for (const auto& [t, at] : bad) {
    SCOPED_TRACE(t);
    EXPECT_EQ(run(t, *sc).first, at);
  }
}

TEST(JsonConstraint, SchemaRootsAndFreeObjects) {
  const auto ints = schema(R"({"type":"array","items":{"type":"integer"},"minItems":1})");
  EXPECT_EQ(run("[]", *ints).first, 1u);
  EXPECT_EQ(run("[1, 2]", *ints), std::make_pair(size_t(6), true));
  EXPECT_EQ(run("[1, 2.0]", *ints).first, 5u);
  const auto e = schema(R"({"enum":[1, 12]})");
  EXPECT_EQ(run("1", *e), std::make_pair(size_t(1), true));  // complete, though 12 may still follow
  EXPECT_EQ(run("12", *e), std::make_pair(size_t(2), true));
  EXPECT_EQ(run("13", *e).first, 1u);
  EXPECT_EQ(run("1 ", *e), std::make_pair(size_t(2), true));
  const auto num = schema(R"({"type":"number"})");
  EXPECT_EQ(run("-1.5", *num), std::make_pair(size_t(4), true));
  EXPECT_FALSE(run("1.", *num).second);
  const auto map = schema(R"({"type":"object","additionalProperties":{"type":"integer"}})");
  EXPECT_EQ(run(R"({"a":1,"b":2})", *map), std::make_pair(size_t(13), true));
  EXPECT_EQ(run(R"({"a":"x"})", *map).first, 5u);
  const auto none = schema(R"({"type":"object","additionalProperties":false})");
  EXPECT_EQ(run("{}", *none), std::make_pair(size_t(2), true));
  EXPECT_EQ(run(R"({"a":1})", *none).first, 1u);
  const auto nullable = schema(R"({"type":["string","null"]})");
  EXPECT_TRUE(run("null", *nullable).second);
  EXPECT_TRUE(run(R"("s")", *nullable).second);
  EXPECT_EQ(run("1", *nullable).first, 0u);
  const auto keys = schema(R"({"properties":{"a\"b":{"const":true}},"required":["a\"b"]})");  // escaped key
  EXPECT_TRUE(run(R"({"a\"b":true})", *keys).second);
  EXPECT_EQ(run(R"({"a\"b":false})", *keys).first, 8u);
}

// guided_choice: the text is one of the strings as they are, with nothing around it.
TEST(JsonConstraint, ChoiceIsOneOfTheStrings) {
  const auto c = JsonSchema::choice({"New York", "New", "Boston", "New"}, "guided_choice");
  EXPECT_EQ(run("New York", *c), std::make_pair(size_t(8), true));
  EXPECT_EQ(run("New", *c), std::make_pair(size_t(3), true));  // complete, though " York" may still follow
  EXPECT_EQ(run("Boston", *c), std::make_pair(size_t(6), true));
  EXPECT_FALSE(run("Bos", *c).second);
  EXPECT_EQ(run(" New", *c).first, 0u);
  EXPECT_EQ(run("New York ", *c).first, 8u);
  EXPECT_EQ(run("\"New\"", *c).first, 0u);
  EXPECT_THROW(JsonSchema::choice({}, "guided_choice"), InvalidRequest);
  EXPECT_THROW(JsonSchema::choice({"a", ""}, "guided_choice"), InvalidRequest);
}

// A string's pattern (the text between the quotes, written without escapes) and guided_regex's whole text.
TEST(JsonConstraint, PatternsHoldStringsAndTexts) {
  const auto zip = schema(R"({"type":"object","properties":{"zip":{"type":"string","pattern":"^\\d{5}$"}},"required":["zip"]})");
  EXPECT_EQ(run(R"({"zip":"12345"})", *zip), std::make_pair(size_t(15), true));
  EXPECT_EQ(run(R"({"zip":"1234"})", *zip).first, 12u);
  EXPECT_EQ(run(R"({"zip":"12a)", *zip).first, 10u);
  EXPECT_EQ(run(R"({"zip":"123456)", *zip).first, 13u);
  const auto re = JsonSchema::regex("(yes|no)!?", "guided_regex");
  EXPECT_EQ(run("yes", *re), std::make_pair(size_t(3), true));
  EXPECT_EQ(run("no!", *re), std::make_pair(size_t(3), true));
  EXPECT_FALSE(run("ye", *re).second);
  EXPECT_EQ(run(" yes", *re).first, 0u);
  EXPECT_EQ(run("no!!", *re).first, 3u);
  EXPECT_THROW(schema(R"j({"type":"string","pattern":"(?=x)"})j"), InvalidRequest);
}

// The mask holds exactly the ordinary tokens whose bytes the recognizer takes from the state; the special
// tokens never (output_constraint.h adds its end ids).
TEST(JsonConstraint, MaskIsEveryTokenThatFits) {
  auto tok = real_tok();
  if (!tok) GTEST_SKIP() << ".assets/tokenizer/tokenizer.json missing";
  auto mask = std::make_shared<JsonTokenMask>(tok);
  std::vector<uint64_t> bits;
  const auto any = JsonSchema::any_object();
  const auto person = schema(kPerson);
  const auto zip = schema(R"({"properties":{"zip":{"type":"string","pattern":"[0-9]{5}"}}})");
  const auto re = JsonSchema::regex("(yes|no)!?", "guided_regex");
  const std::vector<std::pair<const JsonSchema*, std::string>> cases = {
      {any.get(), ""}, {any.get(), "{"}, {any.get(), "{\"a\":"}, {any.get(), "{\"a\":\"some te"}, {any.get(), "{\"a\":12"},
      {any.get(), "{\"a\":[1, tr"}, {any.get(), "{\"a\":{}}"}, {any.get(), "{\"a\":\"\\u00"},
      {person.get(), "{"}, {person.get(), "{\"na"}, {person.get(), "{\"name\": \"Ada\", \""}, {person.get(), "{\"age\":1"},
      {person.get(), "{\"kind\":\"x"}, {person.get(), "{\"tags\":[\"a\","}, {person.get(), "{\"opt\":"},
      {person.get(), "{\"name\":\"A\",\"age\":3,\"kind\":\"x\"}"}, {zip.get(), "{\"zip\":\"12"}, {zip.get(), "{\"zip\":"},
      {re.get(), ""}, {re.get(), "ye"}, {re.get(), "yes"}};
  for (const auto& [sc, prefix] : cases) {
    SCOPED_TRACE(prefix);
    JsonState s = json_start(*sc);
    for (char c : prefix) ASSERT_TRUE(json_feed(*sc, s, uint8_t(c)));
    mask->allowed(*sc, s, bits);
    int n = 0;
    for (int32_t id = 0; id < tok->vocab_size(); ++id) {
      bool fits = !tok->is_special(id) && !tok->token_bytes(id).empty();
      JsonState t = s;
      for (char c : tok->token_bytes(id)) fits = fits && json_feed(*sc, t, uint8_t(c));
      const bool got = bits[size_t(id) / 64] >> (id % 64) & 1;
      ASSERT_EQ(got, fits) << "token " << id << " '" << tok->token_bytes(id) << "'";
      n += got;
    }
    EXPECT_GT(n, json_done(*sc, s) ? -1 : 0);  // (a complete guided_regex text may take nothing more)
  }
}

}  // namespace
