// Harmony rendering (goldens from the official chat template via @huggingface/jinja), request
// validation and the streaming parser. Tests that need the real tokenizer skip without it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "harmony/harmony.h"
#include "tests/unit/harmony/real_tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace mx;
using namespace mx::harmony;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

using mx::testing::real_tok;

#define NEED_TOK()                                                  \
  auto tok = real_tok();                                            \
  if (!tok) GTEST_SKIP() << ".assets/tokenizer/tokenizer.json missing"

std::string param_of(const json& body) {
  try {
    chat_request_from_json(body);
  } catch (const InvalidRequest& e) {
    return e.param();
  }
  return "<no error>";
}

}  // namespace

TEST(HarmonyGolden, MatchesOfficialTemplate) {
  NEED_TOK();
  fs::path dir = fs::path(MX_SOURCE_DIR) / "tests/data/harmony";
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir / "requests")) {
    ChatRequest req = chat_request_from_json(nlohmann::ordered_json::parse(slurp(e.path())));
    req.current_date = "2026-11-23";
    Rendered r = render_chat(req, *tok);
    std::string expected = slurp(dir / "expected" / (e.path().stem().string() + ".txt"));
    EXPECT_EQ(r.text, expected) << e.path().filename();
    EXPECT_EQ(tok->decode(r.tokens), r.text) << e.path().filename();
    ++n;
  }
  EXPECT_GE(n, 12);
}

TEST(HarmonyRender, TokensEndWithAssistantHeader) {
  NEED_TOK();
  ChatRequest req = chat_request_from_json(json::parse(R"({"messages":[{"role":"user","content":"hi <|end|>"}]})"));
  Rendered r = render_chat(req, *tok);
  ASSERT_GE(r.tokens.size(), 2u);
  EXPECT_EQ(r.tokens[r.tokens.size() - 2], 200006);
  EXPECT_EQ(r.tokens.back(), 173781);
  EXPECT_EQ(r.tokens.front(), 200006);
  // User text that spells a special token is not a special token.
  int ends = 0;
  for (int32_t t : r.tokens) ends += t == 200007;
  EXPECT_EQ(ends, 2);  // system and user; the "<|end|>" inside the user text is plain text
  auto stops = stop_token_ids(*tok);
  EXPECT_EQ(stops, (std::vector<int32_t>{200002, 200012}));
}

TEST(HarmonyRender, ToolCallHistoryFollowsHarmony) {
  NEED_TOK();
  json body = json::parse(R"({
    "tools":[{"type":"function","function":{"name":"get_weather","description":"Weather.",
      "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],
    "messages":[{"role":"user","content":"Weather in Oslo?"},
      {"role":"assistant","reasoning_content":"Need the tool.","tool_calls":[{"id":"call_1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"{\"temp\":3}"}]})");
  ChatRequest req = chat_request_from_json(body);
  Rendered r = render_chat(req, *tok);
  EXPECT_NE(r.text.find("<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
                        "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
                        "<|message|>{\"city\":\"Oslo\"}<|call|>"
                        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"temp\":3}<|end|>"
                        "<|start|>assistant"),
            std::string::npos)
      << r.text;
  EXPECT_NE(r.text.find("Calls to these tools must go to the commentary channel: 'functions'."), std::string::npos);
  EXPECT_NE(r.text.find("type get_weather = (_: {\ncity: string,\n}) => any;"), std::string::npos) << r.text;
  EXPECT_EQ(tok->decode(r.tokens), r.text);
}

TEST(HarmonyRender, TypeScriptSchemas) {
  NEED_TOK();
  auto body = nlohmann::ordered_json::parse(R"({"messages":[{"role":"user","content":"x"}],
    "tools":[{"type":"function","function":{"name":"f","description":"Does f.","parameters":{"type":"object",
      "properties":{
        "unit":{"type":"string","enum":["c","f"],"description":"Unit.","default":"c"},
        "n":{"type":"integer","default":3},
        "tags":{"type":"array","items":{"type":"string"}},
        "opt":{"type":"string","nullable":true},
        "any":{"oneOf":[{"type":"string"},{"type":"number"}]},
        "obj":{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]}},
      "required":["unit"]}}},
     {"type":"function","function":{"name":"g"}}]})");
  Rendered r = render_chat(chat_request_from_json(body), *tok);
  const char* want =
      "// Does f.\ntype f = (_: {\n// Unit.\nunit: \"c\" | \"f\", // default: c,\nn?: number, // default: 3,\n"
      "tags?: string[],\nopt?: string | null,\nany?: string | number,\nobj?: {\na: boolean},\n}) => any;\n\n"
      "type g = () => any;\n\n} // namespace functions";
  EXPECT_NE(r.text.find(want), std::string::npos) << r.text;
}

// response_format json_schema: the harmony guide's "# Response Formats" section ends the developer
// message, after the instructions or the tools, or alone; json_object adds nothing to the prompt.
TEST(HarmonyRender, ResponseFormatSection) {
  NEED_TOK();
  const std::string rf =
      R"("response_format":{"type":"json_schema","json_schema":{"name":"shopping_list","description":"Items.",
        "schema":{"type":"object","properties":{"items":{"type":"array","items":{"type":"string"}}}}}})";
  Rendered a = render_chat(chat_request_from_json(json::parse(
                               R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"x"}],)" + rf + "}")),
                           *tok);
  EXPECT_NE(a.text.find("<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Response Formats\n\n"
                        "## shopping_list\n\n// Items.\n"
                        R"({"properties":{"items":{"items":{"type":"string"},"type":"array"}},"type":"object"}<|end|>)"),
            std::string::npos)
      << a.text;
  Rendered b = render_chat(chat_request_from_json(json::parse(R"({"messages":[{"role":"user","content":"x"}],)" + rf + "}")), *tok);
  EXPECT_NE(b.text.find("<|start|>developer<|message|># Response Formats\n\n## shopping_list"), std::string::npos) << b.text;
  Rendered c = render_chat(
      chat_request_from_json(json::parse(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",
        "function":{"name":"g"}}],)" + rf + "}")),
      *tok);
  EXPECT_NE(c.text.find("} // namespace functions\n\n# Response Formats\n\n## shopping_list"), std::string::npos) << c.text;
  Rendered d = render_chat(chat_request_from_json(json::parse(
                               R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})")),
                           *tok);
  EXPECT_EQ(d.text.find("developer"), std::string::npos);
  EXPECT_EQ(tok->decode(a.tokens), a.text);
}

TEST(HarmonyRequest, Errors) {
  EXPECT_EQ(param_of(json::parse("[]")), "");
  EXPECT_EQ(param_of(json::parse("{}")), "messages");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[]})")), "messages");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"bot","content":"x"}]})")), "messages[0].role");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"user"}]})")), "messages[0].content");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}]})")),
            "messages[0].content[1].type");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"max"})")),
            "reasoning_effort");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"bad name"}}]})")),
            "tools[0].function.name");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":[1]}}]})")),
            "tools[0].function.parameters");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval"}]})")),
            "tools[0].type");
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"get_weather"}}])";
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"user","content":"x"}],)" + tools +
                                 R"(,"tool_choice":{"type":"function","function":{"name":"get_time"}}})")),
            "tool_choice");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"user","content":"x"}],)" + tools + R"(,"tool_choice":"sometimes"})")),
            "tool_choice");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})")), "tool_choice");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function"}})")),
            "tool_choice");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"user","content":"x"}],)" + tools +
                                 R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}}})")),
            "<no error>");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"auto"})")), "<no error>");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"tool","tool_call_id":"nope","content":"x"}]})")),
            "messages[0].tool_call_id");
  EXPECT_EQ(param_of(json::parse(R"({"messages":[{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":5}}]}]})")),
            "messages[0].tool_calls[0].function.arguments");
}

TEST(HarmonyRequest, Fields) {
  ChatRequest r = chat_request_from_json(json::parse(R"({"reasoning_effort":"high","messages":[
    {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
    {"role":"assistant","reasoning":"think","content":"ans","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"c1","content":"out"}]})"));
  EXPECT_EQ(r.reasoning_effort, "high");
  EXPECT_EQ(r.messages[0].content, "ab");
  EXPECT_EQ(r.messages[1].reasoning_content, "think");
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].name, "f");
}

// ---- parser ----
namespace {

std::vector<int32_t> enc(const Tokenizer& t, const std::string& s) { return t.encode(s, /*allow_special=*/true); }

struct Collected {
  std::string reasoning, content, tool_name, args;
  int begins = 0, ends = 0;
};

Collected run(const std::shared_ptr<const Tokenizer>& tok, const std::vector<int32_t>& ids, bool* call_end = nullptr) {
  StreamParser p(tok);
  Collected c;
  auto take = [&](const std::vector<Event>& ev) {
    for (const auto& e : ev) switch (e.kind) {
        case Event::Kind::kReasoning: c.reasoning += e.text; break;
        case Event::Kind::kContent: c.content += e.text; break;
        case Event::Kind::kToolCallBegin: c.tool_name = e.name; ++c.begins; break;
        case Event::Kind::kToolCallArguments: c.args += e.text; break;
        case Event::Kind::kToolCallEnd: ++c.ends; break;
      }
  };
  for (int32_t t : ids) take(p.push(t));
  take(p.finish());
  if (call_end) *call_end = p.saw_tool_call_end();
  return c;
}

// tool_choice forcing: the prompt ends with the call's start; the parser reads it first, then the
// generated arguments (a random model's too) belong to that call.
TEST(Harmony, ForcedToolCallPrefix) {
  EXPECT_EQ(forced_tool_call_prefix(json("auto")), "");
  EXPECT_EQ(forced_tool_call_prefix(json("none")), "");
  EXPECT_EQ(forced_tool_call_prefix(json()), "");
  EXPECT_EQ(forced_tool_call_prefix(json("required")), "<|channel|>commentary to=functions.");
  const json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  EXPECT_EQ(forced_tool_call_prefix(named), "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>");
  NEED_TOK();
  bool call_end = false;
  Collected c = run(tok, enc(*tok, forced_tool_call_prefix(named) + "{\"city\":\"Oslo\"}<|call|>"), &call_end);
  EXPECT_EQ(c.begins, 1);
  EXPECT_EQ(c.tool_name, "get_weather");
  EXPECT_EQ(c.args, "{\"city\":\"Oslo\"}");
  EXPECT_TRUE(call_end);
  // required: the model names the function.
  c = run(tok, enc(*tok, forced_tool_call_prefix(json("required")) + "lookup <|constrain|>json<|message|>{}<|call|>"));
  EXPECT_EQ(c.tool_name, "lookup");
  EXPECT_EQ(c.args, "{}");
}

// Built-in tools (browser, python) are tool calls named after the recipient, not reasoning or text.
TEST(Harmony, BuiltInToolCallsAreCalls) {
  NEED_TOK();
  bool call_end = false;
  Collected c = run(tok, enc(*tok, "<|channel|>analysis to=browser.search <|constrain|>json<|message|>{\"query\":\"x\"}<|call|>"), &call_end);
  EXPECT_EQ(c.tool_name, "browser.search");
  EXPECT_EQ(c.args, "{\"query\":\"x\"}");
  EXPECT_EQ(c.reasoning, "");
  EXPECT_TRUE(call_end);
  c = run(tok, enc(*tok, "<|channel|>analysis<|message|>Compute.<|end|><|start|>assistant to=python<|channel|>analysis<|message|>print(1+1)<|call|>"));
  EXPECT_EQ(c.reasoning, "Compute.");
  EXPECT_EQ(c.tool_name, "python");
  EXPECT_EQ(c.args, "print(1+1)");
  EXPECT_EQ(c.content, "");
}

}  // namespace

TEST(HarmonyParser, AnalysisThenFinal) {
  NEED_TOK();
  auto c = run(tok, enc(*tok, "<|channel|>analysis<|message|>Let me think.<|end|><|start|>assistant<|channel|>final<|message|>Hello, world!<|return|>ignored"));
  EXPECT_EQ(c.reasoning, "Let me think.");
  EXPECT_EQ(c.content, "Hello, world!");
  EXPECT_EQ(c.begins, 0);
}

TEST(HarmonyParser, ToolCallRecipientInChannel) {
  NEED_TOK();
  bool call_end = false;
  auto c = run(tok, enc(*tok, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}<|call|>"), &call_end);
  EXPECT_EQ(c.tool_name, "get_weather");
  EXPECT_EQ(c.args, "{\"city\":\"Oslo\"}");
  EXPECT_EQ(c.begins, 1);
  EXPECT_EQ(c.ends, 1);
  EXPECT_TRUE(call_end);
}

TEST(HarmonyParser, ToolCallRecipientInRole) {
  NEED_TOK();
  auto c = run(tok, enc(*tok, "<|channel|>analysis<|message|>call it<|end|><|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{}<|call|>"));
  EXPECT_EQ(c.reasoning, "call it");
  EXPECT_EQ(c.tool_name, "lookup");
  EXPECT_EQ(c.args, "{}");
  EXPECT_EQ(c.ends, 1);
}

TEST(HarmonyParser, PreambleIsContent) {
  NEED_TOK();
  auto c = run(tok, enc(*tok, "<|channel|>commentary<|message|>Checking now.<|end|>"));
  EXPECT_EQ(c.content, "Checking now.");
}

TEST(HarmonyParser, SplitUtf8AndTruncation) {
  NEED_TOK();
  // Byte tokens of a 4-byte emoji pushed one at a time, then output cut mid tool call.
  std::vector<int32_t> ids = enc(*tok, "<|channel|>final<|message|>");
  for (unsigned char b : std::string("\xF0\x9F\x98\x80")) ids.push_back(*tok->token_id(std::string(1, char(b))));
  auto c = run(tok, ids);
  EXPECT_EQ(c.content, "\xF0\x9F\x98\x80");
  bool call_end = true;
  auto t = run(tok, enc(*tok, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":"), &call_end);
  EXPECT_EQ(t.tool_name, "f");
  EXPECT_EQ(t.args, "{\"a\":");
  EXPECT_EQ(t.ends, 1);
  EXPECT_FALSE(call_end);
}

TEST(HarmonyParser, GarbageNeverThrows) {
  NEED_TOK();
  auto c = run(tok, enc(*tok, "<|end|>plain text without header<|return|>"));
  EXPECT_EQ(c.content, "plain text without header");
  std::vector<int32_t> junk = {-5, 999999999, 200006, 200006, 200008, 200007, 200012, 200002};
  EXPECT_NO_THROW(run(tok, junk));
  std::vector<int32_t> longhdr(100, *tok->token_id("a"));
  auto h = run(tok, longhdr);
  EXPECT_FALSE(h.content.empty());
}
