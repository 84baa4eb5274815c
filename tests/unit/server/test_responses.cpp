// The Responses API's request conversion, store and output items (server/responses.h).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "harmony/harmony.h"
#include "server/responses.h"
#include "tokenizer/tokenizer.h"

namespace mx::server {
namespace {

using json = nlohmann::json;

std::string bad_param(const std::string& body_text, const ResponseStore& store = ResponseStore{}) {
  try {
    ResponsesRequest r = parse_responses_request(json::parse(body_text), store);
    harmony::chat_request_from_json(r.chat_body);  // what the server runs next (tool_choice, names)
  } catch (const InvalidRequest& e) {
    return e.param();
  }
  return "<accepted>";
}

// text.format is the chat's response_format (json_schema's fields under json_schema), echoed back as given.
TEST(Responses, TextFormatBecomesResponseFormat) {
  const json body = json::parse(R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "n",
    "schema": {"type": "object"}, "strict": true}}})");
  const ResponsesRequest r = parse_responses_request(body, ResponseStore{});
  EXPECT_EQ(r.chat_body["response_format"],
            json::parse(R"({"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}, "strict": true}})"));
  EXPECT_EQ(r.echo["text"]["format"], body["text"]["format"]);
  const ResponsesRequest o = parse_responses_request(json::parse(R"({"input": "x", "text": {"format": {"type": "json_object"}}})"), ResponseStore{});
  EXPECT_EQ(o.chat_body["response_format"], json::parse(R"({"type": "json_object"})"));
}

TEST(Responses, StringInputWithInstructionsAndTools) {
  ResponseStore store;
  ResponsesRequest r = parse_responses_request(
      json::parse(R"({"input": "hi", "instructions": "be brief", "max_output_tokens": 9, "temperature": 0,
                      "reasoning": {"effort": "low"},
                      "tools": [{"type": "function", "name": "get", "parameters": {"type": "object"}}],
                      "tool_choice": {"type": "function", "name": "get"}})"),
      store);
  const json& m = r.chat_body["messages"];
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0]["role"], "developer");  // instructions first
  EXPECT_EQ(m[1], json({{"role", "user"}, {"content", "hi"}}));
  EXPECT_EQ(r.messages.size(), 1u);  // the conversation does not keep the instructions
  EXPECT_EQ(r.chat_body["tools"][0]["function"]["name"], "get");
  EXPECT_EQ(r.chat_body["tool_choice"]["function"]["name"], "get");
  EXPECT_EQ(r.chat_body["max_tokens"], 9);
  EXPECT_EQ(r.chat_body["reasoning_effort"], "low");
  EXPECT_EQ(r.echo["instructions"], "be brief");
  EXPECT_TRUE(r.store);
  EXPECT_NO_THROW(harmony::chat_request_from_json(r.chat_body));
}

TEST(Responses, ItemsBecomeOneAssistantTurnAndToolMessages) {
  ResponseStore store;
  ResponsesRequest r = parse_responses_request(json::parse(R"({"input": [
      {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "call it"}]},
      {"type": "function_call", "call_id": "call_7", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
      {"type": "function_call_output", "call_id": "call_7", "output": "12 C"}]})"),
                                               store);
  const json& m = r.chat_body["messages"];
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_EQ(m[1]["reasoning_content"], "call it");
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "call_7");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m[2], json({{"role", "tool"}, {"tool_call_id", "call_7"}, {"content", "12 C"}}));
  harmony::ChatRequest cr = harmony::chat_request_from_json(r.chat_body);
  EXPECT_EQ(cr.messages[2].name, "get_weather");  // resolved from the call id
}

TEST(Responses, BadInputNamesTheParameter) {
  EXPECT_EQ(bad_param(R"({})"), "input");
  EXPECT_EQ(bad_param(R"({"input": 5})"), "input");
  EXPECT_EQ(bad_param(R"({"input": []})"), "input");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "image", "url": "x"}]})"), "input[0].type");
  EXPECT_EQ(bad_param(R"({"input": [{"role": "robot", "content": "x"}]})"), "input[0].role");
  EXPECT_EQ(bad_param(R"({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})"), "input[0].content[0].type");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "function_call", "name": "f"}]})"), "input[0].call_id");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "function_call_output", "call_id": "c"}]})"), "input[0].output");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"type": "web_search"}]})"), "tools[0].type");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"type": "function", "name": "a b"}]})"), "tools[0].function.name");
  EXPECT_EQ(bad_param(R"({"input": "x", "tool_choice": {"type": "function", "name": "nope"}})"), "tool_choice");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"type": "function", "name": "a"}],
                          "tool_choice": {"type": "function", "name": "b"}})"), "tool_choice");
  EXPECT_EQ(bad_param(R"({"input": "x", "tool_choice": "sometimes"})"), "tool_choice");
  EXPECT_EQ(bad_param(R"({"input": "x", "reasoning": {"effort": "max"}})"), "reasoning_effort");
  EXPECT_EQ(bad_param(R"({"input": "x", "stream": "yes"})"), "stream");
  EXPECT_EQ(bad_param(R"({"input": "x", "store": 1})"), "store");
  EXPECT_EQ(bad_param(R"({"input": "x", "text": {"format": {"type": "json_schema"}}})"), "text.format.name");
  EXPECT_EQ(bad_param(R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}})"), "text.format.schema");
  EXPECT_EQ(bad_param(R"({"input": "x", "text": {"format": {"type": "xml"}}})"), "text.format.type");
  EXPECT_EQ(bad_param(R"({"input": "x", "text": {"format": {"type": "json_object"}}})"), "<accepted>");
  EXPECT_EQ(bad_param(R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {}}}})"), "<accepted>");
  EXPECT_EQ(bad_param(R"({"input": "x", "text": 5})"), "text");
  EXPECT_EQ(bad_param(R"({"input": "x", "instructions": 3})"), "instructions");
  EXPECT_EQ(bad_param(R"({"input": "x", "previous_response_id": 3})"), "previous_response_id");
  EXPECT_EQ(bad_param(R"({"input": "x", "parallel_tool_calls": "no"})"), "parallel_tool_calls");
  EXPECT_THROW(parse_responses_request(json::parse(R"({"input": "x", "previous_response_id": "resp_none"})"), ResponseStore{}),
               UnknownResponse);
}

TEST(Responses, PreviousResponseContinuesTheConversation) {
  ResponseStore store;
  json output = json::parse(R"([{"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hm"}]},
                                {"type": "message", "content": [{"type": "output_text", "text": "Hello"}]}])");
  json messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  messages.push_back(output_as_message(output));
  EXPECT_EQ(messages[1], json({{"role", "assistant"}, {"content", "Hello"}, {"reasoning_content", "hm"}}));
  store.put("resp_a", {json{{"id", "resp_a"}}, messages});
  ResponsesRequest r = parse_responses_request(json::parse(R"({"input": "and?", "previous_response_id": "resp_a"})"), store);
  ASSERT_EQ(r.chat_body["messages"].size(), 3u);
  EXPECT_EQ(r.chat_body["messages"][2]["content"], "and?");
  EXPECT_EQ(r.echo["previous_response_id"], "resp_a");
}

TEST(Responses, StoreIsBoundedAndErases) {
  ResponseStore store;
  for (size_t i = 0; i <= ResponseStore::kCapacity; ++i) store.put(fmt::format("r{}", i), {json(i), json::array()});
  EXPECT_EQ(store.size(), ResponseStore::kCapacity);
  EXPECT_FALSE(store.get("r0"));  // the oldest went first
  EXPECT_TRUE(store.get("r1"));
  EXPECT_TRUE(store.erase("r1"));
  EXPECT_FALSE(store.erase("r1"));
  EXPECT_FALSE(store.get("r1"));
  for (int i = 0; i < 5000; ++i) store.put(fmt::format("s{}", i), {json(i), json::array()});
  EXPECT_EQ(store.size(), ResponseStore::kCapacity);
  EXPECT_TRUE(store.get("s4999"));
  EXPECT_FALSE(store.get(fmt::format("s{}", 4999 - ResponseStore::kCapacity)));
  // The byte bound: large conversations evict the oldest before the count bound is reached.
  ResponseStore big;
  const json huge = json::array({{{"role", "user"}, {"content", std::string(ResponseStore::kMaxBytes / 4, 'x')}}});
  for (int i = 0; i < 6; ++i) big.put(fmt::format("b{}", i), {json::object(), huge});
  EXPECT_EQ(big.size(), 3u);
  EXPECT_FALSE(big.get("b2"));
  EXPECT_TRUE(big.get("b3") && big.get("b5"));
}

TEST(Responses, OutputItemsAndStreamEvents) {
  using K = harmony::Event::Kind;
  std::vector<json> events;
  OutputBuilder out([&](json e) { events.push_back(std::move(e)); });
  for (const harmony::Event& e : std::vector<harmony::Event>{{K::kReasoning, "thin", ""},
                                                             {K::kReasoning, "king", ""},
                                                             {K::kContent, "Hi", ""},
                                                             {K::kToolCallBegin, "", "get"},
                                                             {K::kToolCallArguments, "{\"a\":", ""},
                                                             {K::kToolCallArguments, "1}", ""},
                                                             {K::kToolCallEnd, "", ""}})
    out.event(e);
  out.close();  // nothing open: no events
  const json& items = out.items();
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0]["type"], "reasoning");
  EXPECT_EQ(items[0]["content"][0]["text"], "thinking");
  EXPECT_EQ(items[1]["type"], "message");
  EXPECT_EQ(items[1]["status"], "completed");
  EXPECT_EQ(items[1]["content"][0], json({{"type", "output_text"}, {"text", "Hi"}, {"annotations", json::array()}}));
  EXPECT_EQ(items[2]["type"], "function_call");
  EXPECT_EQ(items[2]["name"], "get");
  EXPECT_EQ(items[2]["arguments"], "{\"a\":1}");
  EXPECT_EQ(items[2]["status"], "completed");
  EXPECT_EQ(items[2]["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(out.text(), "Hi");
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["sequence_number"], int(i));
    types.push_back(events[i]["type"]);
  }
  const std::vector<std::string> want = {
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
      "response.output_item.done", "response.output_item.added", "response.content_part.added",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done"};
  EXPECT_EQ(types, want);
  EXPECT_EQ(events[0]["item"]["content"], json::array());  // announced empty, filled by content_part.added
  EXPECT_EQ(events[13]["item"]["arguments"], "");
  json msg = output_as_message(items);
  EXPECT_EQ(msg["tool_calls"][0]["id"], items[2]["call_id"]);
  EXPECT_EQ(msg["reasoning_content"], "thinking");
}

// A real harmony completion, token by token through the parser, into items.
TEST(Responses, HarmonyTokensBecomeItems) {
  const std::filesystem::path path = std::filesystem::path(MX_SOURCE_DIR) / ".assets/tokenizer/tokenizer.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << ".assets/tokenizer/tokenizer.json missing";
  std::shared_ptr<const Tokenizer> tok = Tokenizer::load(path.string());
  auto run = [&](const std::string& completion) {
    harmony::StreamParser parser(tok);
    OutputBuilder out(nullptr);
    for (int32_t t : tok->encode(completion, /*allow_special=*/true))
      for (const harmony::Event& e : parser.push(t)) out.event(e);
    for (const harmony::Event& e : parser.finish()) out.event(e);
    out.close();
    return out.items();
  };
  json a = run("<|channel|>analysis<|message|>Think first.<|end|><|start|>assistant<|channel|>final<|message|>Hi there!<|return|>");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0]["type"], "reasoning");
  EXPECT_EQ(a[0]["content"][0]["text"], "Think first.");
  EXPECT_EQ(a[1]["type"], "message");
  EXPECT_EQ(a[1]["content"][0]["text"], "Hi there!");
  json b = run("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
               "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}<|call|>");
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[1]["type"], "function_call");
  EXPECT_EQ(b[1]["name"], "get_weather");
  EXPECT_EQ(b[1]["arguments"], "{\"city\":\"Oslo\"}");
  EXPECT_EQ(output_as_message(b)["tool_calls"][0]["function"]["name"], "get_weather");
}

}  // namespace
}  // namespace mx::server
