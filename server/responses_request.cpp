// /v1/responses request -> chat conversation, and the bounded response store (responses.h).
#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "server/responses.h"

namespace mx::server {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw InvalidRequest(param, msg); }

bool given(const json& b, const char* k) { return b.contains(k) && !b[k].is_null(); }

// A string, or an array of text parts (input_text, output_text, text, reasoning_text, summary_text).
std::string text_of(const json& c, const std::string& param) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(param, fmt::format("'{}' must be a string or an array of text parts", param));
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string p = fmt::format("{}[{}]", param, i);
    const json& part = c[i];
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad(p + ".type", fmt::format("'{}.type' is required", p));
    const std::string t = part["type"];
    if (t != "input_text" && t != "output_text" && t != "text" && t != "reasoning_text" && t != "summary_text")
      bad(p + ".type", fmt::format("content part type '{}' is not supported (text parts only)", t));
    if (!part.contains("text") || !part["text"].is_string()) bad(p + ".text", fmt::format("'{}.text' must be a string", p));
    out += part["text"].get<std::string>();
  }
  return out;
}

std::string string_field(const json& item, const char* key, const std::string& p) {
  if (!item.contains(key) || !item[key].is_string()) bad(p + "." + key, fmt::format("'{}.{}' must be a string", p, key));
  return item[key];
}

// Input items -> chat messages. Reasoning and function calls of one assistant turn go into one
// assistant message (reasoning_content, tool_calls), as the chat renderer expects them.
void append_input(const json& input, json& messages) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return;
  }
  if (!input.is_array()) bad("input", "'input' must be a string or an array of items");
  json* turn = nullptr;  // the assistant message the current turn's items go into
  auto assistant_turn = [&]() -> json& {
    if (!turn) {
      messages.push_back({{"role", "assistant"}, {"content", ""}});
      turn = &messages.back();
    }
    return *turn;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string p = fmt::format("input[{}]", i);
    const json& it = input[i];
    if (!it.is_object()) bad(p, fmt::format("'{}' must be an object", p));
    const std::string type = it.contains("type") && it["type"].is_string() ? it["type"].get<std::string>() : "message";
    if (type == "message") {
      const std::string role = string_field(it, "role", p);
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        bad(p + ".role", fmt::format("'{}.role' must be user, system, developer or assistant, got '{}'", p, role));
      if (!it.contains("content")) bad(p + ".content", fmt::format("'{}.content' is required", p));
      const std::string text = text_of(it["content"], p + ".content");
      if (role == "assistant") {
        json& m = assistant_turn();
        m["content"].get_ref<std::string&>() += text;
      } else {
        turn = nullptr;
        messages.push_back({{"role", role}, {"content", text}});
      }
    } else if (type == "reasoning") {
      std::string text;
      if (given(it, "content")) text = text_of(it["content"], p + ".content");
      if (text.empty() && given(it, "summary")) text = text_of(it["summary"], p + ".summary");
      json& m = assistant_turn();
      m["reasoning_content"] = m.value("reasoning_content", "") + text;
    } else if (type == "function_call") {
      const std::string name = string_field(it, "name", p), call_id = string_field(it, "call_id", p);
      const std::string args = given(it, "arguments") ? string_field(it, "arguments", p) : "{}";
      json& m = assistant_turn();
      m["tool_calls"].push_back({{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}});
      turn = nullptr;  // the call ends the assistant's turn
    } else if (type == "function_call_output") {
      const std::string call_id = string_field(it, "call_id", p);
      if (!it.contains("output")) bad(p + ".output", fmt::format("'{}.output' is required", p));
      turn = nullptr;
      messages.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", text_of(it["output"], p + ".output")}});
    } else {
      bad(p + ".type", fmt::format("input item type '{}' is not supported (message, reasoning, function_call, "
                                   "function_call_output)", type));
    }
  }
}

// Responses tools {type: function, name, description, parameters, strict} -> chat tools.
json chat_tools(const json& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be an array");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = fmt::format("tools[{}]", i);
    const json& t = tools[i];
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string()) bad(p + ".type", fmt::format("'{}.type' is required", p));
    if (t["type"] != "function")
      bad(p + ".type", fmt::format("tool type '{}' is not supported (only 'function')", t["type"].get<std::string>()));
    json f = {{"name", t.value("name", json())}};
    if (given(t, "description")) f["description"] = t["description"];
    if (given(t, "parameters")) f["parameters"] = t["parameters"];
    if (given(t, "strict")) f["strict"] = t["strict"];
    out.push_back({{"type", "function"}, {"function", f}});
  }
  return out;
}

// none | auto | required | {type: function, name} -> the chat form (checked against the tools there).
json chat_tool_choice(const json& tc) {
  if (tc.is_string()) return tc;
  if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("name") && tc["name"].is_string())
    return {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
  bad("tool_choice", R"('tool_choice' must be none, auto, required or {"type": "function", "name": ...})");
}

}  // namespace

void ResponseStore::put(const std::string& id, Entry e) {
  const size_t bytes = e.response.dump(-1, ' ', false, json::error_handler_t::replace).size() +
                       e.messages.dump(-1, ' ', false, json::error_handler_t::replace).size();
  std::lock_guard lk(mu_);
  if (auto it = map_.find(id); it != map_.end()) {  // replaced: it keeps its place in the order
    bytes_ -= it->second.bytes;
    it->second = Stored{std::move(e), bytes};
  } else {
    map_.emplace(id, Stored{std::move(e), bytes});
    order_.push_back(id);
  }
  bytes_ += bytes;
  while ((map_.size() > kCapacity || bytes_ > kMaxBytes) && !order_.empty()) {
    auto old = map_.find(order_.front());
    bytes_ -= old->second.bytes;
    map_.erase(old);
    order_.pop_front();
  }
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id) const {
  std::lock_guard lk(mu_);
  auto it = map_.find(id);
  if (it == map_.end()) return std::nullopt;
  return it->second.e;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lk(mu_);
  auto it = map_.find(id);
  if (it == map_.end()) return false;
  bytes_ -= it->second.bytes;
  map_.erase(it);
  order_.erase(std::find(order_.begin(), order_.end(), id));  // at most kCapacity entries
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lk(mu_);
  return map_.size();
}

ResponsesRequest parse_responses_request(const json& body, const ResponseStore& store) {
  if (!body.is_object()) bad("", "request body must be a JSON object");
  ResponsesRequest r;
  json messages = json::array();
  std::string prev;
  if (given(body, "previous_response_id")) {
    if (!body["previous_response_id"].is_string()) bad("previous_response_id", "'previous_response_id' must be a string");
    prev = body["previous_response_id"];
    auto e = store.get(prev);
    if (!e) throw UnknownResponse(fmt::format("Previous response with id '{}' not found.", prev));
    messages = e->messages;
  }
  if (!body.contains("input") || body["input"].is_null()) bad("input", "'input' is required");
  append_input(body["input"], messages);
  if (messages.empty()) bad("input", "'input' must not be empty");
  r.messages = messages;

  json chat = {{"messages", json::array()}};
  std::string instructions;
  if (given(body, "instructions")) {
    if (!body["instructions"].is_string()) bad("instructions", "'instructions' must be a string");
    instructions = body["instructions"];
    chat["messages"].push_back({{"role", "developer"}, {"content", instructions}});
  }
  for (const json& m : messages) chat["messages"].push_back(m);
  json tools = json::array();
  if (given(body, "tools")) chat["tools"] = tools = chat_tools(body["tools"]);
  if (given(body, "tool_choice")) chat["tool_choice"] = chat_tool_choice(body["tool_choice"]);
  std::string effort = "medium";
  if (given(body, "reasoning")) {
    const json& rs = body["reasoning"];
    if (!rs.is_object()) bad("reasoning", "'reasoning' must be an object");
    if (given(rs, "effort")) {
      if (!rs["effort"].is_string()) bad("reasoning.effort", "'reasoning.effort' must be a string");
      effort = rs["effort"];
      chat["reasoning_effort"] = effort;
    }
  }
  if (given(body, "max_output_tokens")) chat["max_tokens"] = body["max_output_tokens"];
  for (const char* k : {"temperature", "top_p"})
    if (given(body, k)) chat[k] = body[k];
  if (given(body, "stream")) {
    if (!body["stream"].is_boolean()) bad("stream", "'stream' must be a boolean");
    r.stream = body["stream"];
  }
  chat["stream"] = r.stream;
  if (given(body, "store")) {
    if (!body["store"].is_boolean()) bad("store", "'store' must be a boolean");
    r.store = body["store"];
  }
  bool parallel = true;
  if (given(body, "parallel_tool_calls")) {
    if (!body["parallel_tool_calls"].is_boolean()) bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    parallel = body["parallel_tool_calls"];
  }
  json format = {{"type", "text"}};
  if (given(body, "text")) {  // text.format: the chat's response_format, json_schema's fields flattened
    const json& t = body["text"];
    if (!t.is_object()) bad("text", "'text' must be an object");
    if (given(t, "format")) {
      format = t["format"];
      if (!format.is_object() || !format.contains("type") || !format["type"].is_string())
        bad("text.format", "'text.format' must be an object with a string 'type'");
      const std::string type = format["type"];
      if (type == "json_object") {
        chat["response_format"] = {{"type", "json_object"}};
      } else if (type == "json_schema") {
        if (!format.contains("name") || !format["name"].is_string()) bad("text.format.name", "'text.format.name' must be a string");
        if (!format.contains("schema") || !format["schema"].is_object())
          bad("text.format.schema", "'text.format.schema' must be a JSON schema object");
        json js = json::object();
        for (const char* k : {"name", "description", "schema", "strict"})
          if (format.contains(k)) js[k] = format[k];
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
      } else if (type != "text") {
        bad("text.format.type", fmt::format("'text.format.type' must be text, json_object or json_schema, got '{}'", type));
      }
    }
  }
  if (given(body, "metadata") && !body["metadata"].is_object()) bad("metadata", "'metadata' must be an object");

  r.chat_body = chat;
  r.echo = {{"instructions", instructions.empty() ? json(nullptr) : json(instructions)},
            {"max_output_tokens", body.value("max_output_tokens", json())},
            {"metadata", body.value("metadata", json::object())},
            {"parallel_tool_calls", parallel},
            {"previous_response_id", prev.empty() ? json(nullptr) : json(prev)},
            {"reasoning", {{"effort", effort}, {"summary", nullptr}}},
            {"store", r.store},
            {"temperature", body.value("temperature", json(1.0))},
            {"text", {{"format", format}}},
            {"tool_choice", body.value("tool_choice", json("auto"))},
            {"tools", body.value("tools", json::array())},
            {"top_p", body.value("top_p", json(1.0))},
            {"truncation", "disabled"}};
  return r;
}

json output_as_message(const json& output) {
  json m = {{"role", "assistant"}, {"content", ""}};
  for (const json& it : output) {
    const std::string type = it.value("type", "");
    if (type == "reasoning") {
      std::string text;
      for (const json& c : it.value("content", json::array())) text += c.value("text", "");
      m["reasoning_content"] = m.value("reasoning_content", "") + text;
    } else if (type == "message") {
      std::string text;
      for (const json& c : it.value("content", json::array())) text += c.value("text", "");
      m["content"].get_ref<std::string&>() += text;
    } else if (type == "function_call") {
      m["tool_calls"].push_back({{"id", it.value("call_id", "")}, {"type", "function"},
                                 {"function", {{"name", it.value("name", "")}, {"arguments", it.value("arguments", "{}")}}}});
    }
  }
  return m;
}

}  // namespace mx::server
