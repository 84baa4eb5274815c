// One choice's structured output over a harmony completion (harmony/output_constraint.h): the final
// channel held to the request's schema, a call held to its function's parameters, everything else free.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "harmony/output_constraint.h"
#include "tests/unit/harmony/real_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace mx;
using namespace mx::harmony;
using nlohmann::json;

namespace {

using mx::testing::real_tok;

struct Held {
  OutputConstraint& c;
  bool operator()(int32_t id) const {
    auto bits = c.allowed();
    return bits.empty() || (bits[size_t(id) / 64] >> (id % 64) & 1);
  }
};

// The analysis channel is free, the final channel's text is held to one object (each token of a valid
// answer is in the mask before it is taken; <|return|> only once it is complete), and after the end the
// choice is free again; another channel's message is free.
TEST(OutputConstraint, FinalChannelOnly) {
  auto tok = real_tok();
  if (!tok) GTEST_SKIP() << ".assets/tokenizer/tokenizer.json missing";
  const int32_t ret = tok->token_id("<|return|>").value(), call = tok->token_id("<|call|>").value();
  auto mask = std::make_shared<JsonTokenMask>(tok);
  OutputConstraint c(mask, JsonSchema::any_object(), nullptr);
  const Held allowed{c};
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
  EXPECT_FALSE(allowed(call));
  EXPECT_FALSE(allowed(tok->encode("x", false)[0]));
  c.accept(ret);
  EXPECT_FALSE(c.active());
  EXPECT_TRUE(c.allowed().empty());
  OutputConstraint other(mask, JsonSchema::any_object(), nullptr);  // another channel's name: free
  for (int32_t t : tok->encode("<|channel|>commentary<|message|>{", true)) other.accept(t);
  EXPECT_FALSE(other.active());
  EXPECT_TRUE(other.allowed().empty());
}

// A call to a held function is held to its parameters and ends with <|call|>, with the recipient in the
// channel's header or before it; a call to another function is free; the final channel is free without
// a final schema.
TEST(OutputConstraint, HeldCallsFollowTheirParameters) {
  auto tok = real_tok();
  if (!tok) GTEST_SKIP() << ".assets/tokenizer/tokenizer.json missing";
  const int32_t ret = tok->token_id("<|return|>").value(), call = tok->token_id("<|call|>").value();
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "strict": true, "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"],
      "additionalProperties": false}}},
    {"type": "function", "function": {"name": "free_form", "parameters": {"type": "object"}}}])");
  const auto held = held_tool_schemas(tools, json("auto"));
  ASSERT_TRUE(held);
  EXPECT_EQ(held->size(), 1u);  // the strict one only
  auto mask = std::make_shared<JsonTokenMask>(tok);
  for (const char* header : {"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
                             " to=functions.get_weather<|channel|>commentary json<|message|>"}) {
    SCOPED_TRACE(header);
    OutputConstraint c(mask, nullptr, held);
    const Held allowed{c};
    for (int32_t t : tok->encode(std::string("<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant") + header, true))
      c.accept(t);
    ASSERT_TRUE(c.active());
    EXPECT_FALSE(allowed(tok->encode("[", false)[0]));
    for (int32_t t : tok->encode(R"({"city": "Paris", ")", false)) {
      ASSERT_TRUE(allowed(t)) << "'" << tok->token_bytes(t) << "'";
      c.accept(t);
    }
    EXPECT_FALSE(allowed(tok->encode("city", false)[0]));  // given already
    for (int32_t t : tok->encode(R"(unit": "c"})", false)) {
      ASSERT_TRUE(allowed(t)) << "'" << tok->token_bytes(t) << "'";
      EXPECT_FALSE(allowed(call));
      c.accept(t);
    }
    EXPECT_TRUE(allowed(call));
    EXPECT_FALSE(allowed(ret));
    c.accept(call);
    EXPECT_FALSE(c.active());
  }
  OutputConstraint c(mask, nullptr, held);
  for (int32_t t : tok->encode("<|channel|>commentary to=functions.free_form <|constrain|>json<|message|>", true)) c.accept(t);
  EXPECT_FALSE(c.active());
  for (int32_t t : tok->encode("[not json<|call|><|start|>assistant<|channel|>final<|message|>", true)) c.accept(t);
  EXPECT_FALSE(c.active());  // no final schema
}

// tool_choice required holds every function, a named one holds that one; the forced header's tokens,
// accepted as the prompt's, start the held call; a schema it cannot read names its tool.
TEST(OutputConstraint, ForcedCallsAndBadSchemas) {
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "b"}}])");
  EXPECT_EQ(held_tool_schemas(tools, json("auto")), nullptr);
  EXPECT_EQ(held_tool_schemas(tools, json("required"))->size(), 2u);
  const auto named = held_tool_schemas(tools, json::parse(R"({"type": "function", "function": {"name": "b"}})"));
  ASSERT_EQ(named->size(), 1u);
  EXPECT_EQ(named->begin()->first, "b");
  const json bad = json::parse(R"([{"type": "function", "function": {"name": "a", "strict": true,
    "parameters": {"type": "obj"}}}])");
  try {
    held_tool_schemas(bad, json("auto"));
    ADD_FAILURE() << "compiled";
  } catch (const InvalidRequest& e) {
    EXPECT_EQ(e.param(), "tools[0].function.parameters");
  }
  auto tok = real_tok();
  if (!tok) GTEST_SKIP() << ".assets/tokenizer/tokenizer.json missing";
  auto mask = std::make_shared<JsonTokenMask>(tok);
  OutputConstraint c(mask, nullptr, held_tool_schemas(tools, json("required")));
  for (int32_t t : tok->encode("<|channel|>commentary to=functions.", true)) c.accept(t);  // the forced prefix
  EXPECT_FALSE(c.active());
  for (int32_t t : tok->encode("a <|constrain|>json<|message|>", true)) c.accept(t);
  ASSERT_TRUE(c.active());
  const Held allowed{c};
  for (int32_t t : tok->encode(R"({"x": )", false)) c.accept(t);
  EXPECT_FALSE(allowed(tok->encode("\"", false)[0]));  // an integer
  EXPECT_TRUE(allowed(tok->encode("7", false)[0]));
}

}  // namespace
