// OpenAI chat request body -> harmony::ChatRequest, with every field checked and errors naming
// the parameter (mx::InvalidRequest).
#include <fmt/format.h>

#include <map>

#include "core/error.h"
#include "harmony/harmony.h"

namespace mx::harmony {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw InvalidRequest(param, msg); }

// Content may be a string, null, or an array of {type:"text", text} parts.
std::string content_text(const json& c, const std::string& param) {
  if (c.is_null()) return "";
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(param, fmt::format("'{}' must be a string or an array of text parts", param));
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    std::string p = fmt::format("{}[{}]", param, i);
    const json& part = c[i];
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad(p + ".type", fmt::format("'{}.type' is required", p));
    if (part["type"] != "text")
      bad(p + ".type", fmt::format("content part type '{}' is not supported (only 'text')", part["type"].get<std::string>()));
    if (!part.contains("text") || !part["text"].is_string()) bad(p + ".text", fmt::format("'{}.text' must be a string", p));
    out += part["text"].get<std::string>();
  }
  return out;
}

bool valid_function_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

// tool_choice: none | auto | required, or {"type": "function", "function": {"name": N}} naming one of
// `tools` (OpenAI answers 400 for a name it does not know).
void check_tool_choice(const json& body, const json& tools) {
  if (!body.contains("tool_choice") || body["tool_choice"].is_null()) return;
  const json& tc = body["tool_choice"];
  const bool have_tools = tools.is_array() && !tools.empty();
  if (tc.is_string()) {
    const std::string s = tc;
    if (s != "none" && s != "auto" && s != "required")
      bad("tool_choice", fmt::format("'tool_choice' must be none, auto, required or a function, got '{}'", s));
    if (s == "required" && !have_tools) bad("tool_choice", "'tool_choice' is 'required' but no 'tools' are given");
    return;
  }
  if (!tc.is_object() || tc.value("type", "") != "function" || !tc.contains("function") || !tc["function"].is_object() ||
      !tc["function"].contains("name") || !tc["function"]["name"].is_string())
    bad("tool_choice", R"('tool_choice' must be none, auto, required or {"type": "function", "function": {"name": ...}})");
  const std::string name = tc["function"]["name"];
  if (have_tools)
    for (const json& t : tools)
      if (t["function"]["name"] == name) return;
  bad("tool_choice", fmt::format("'tool_choice' names function '{}', which is not in 'tools'", name));
}

}  // namespace

ChatRequest chat_request_from_json(const json& body) {
  ChatRequest r;
  if (!body.is_object()) bad("", "request body must be a JSON object");
  if (!body.contains("messages")) bad("messages", "'messages' is required");
  const json& msgs = body["messages"];
  if (!msgs.is_array() || msgs.empty()) bad("messages", "'messages' must be a non-empty array");

  if (body.contains("response_format") && body["response_format"].is_object() &&
      body["response_format"].value("type", "") == "json_schema") {  // (validated by the server before)
    const json& f = body["response_format"];
    const json js = f.contains("json_schema") && f["json_schema"].is_object() ? f["json_schema"] : json::object();
    ResponseFormatSpec rf;
    rf.name = js.contains("name") && js["name"].is_string() ? js["name"].get<std::string>() : "response";
    if (js.contains("description") && js["description"].is_string()) rf.description = js["description"];
    rf.schema = js.contains("schema") ? js["schema"].dump() : "{}";
    r.response_format = rf;
  }
  if (body.contains("reasoning_effort") && !body["reasoning_effort"].is_null()) {
    if (!body["reasoning_effort"].is_string()) bad("reasoning_effort", "'reasoning_effort' must be a string");
    std::string e = body["reasoning_effort"];
    if (e == "minimal" || e == "none") e = "low";  // harmony knows low | medium | high
    if (e != "low" && e != "medium" && e != "high")
      bad("reasoning_effort", fmt::format("'reasoning_effort' must be low, medium or high, got '{}'", e));
    r.reasoning_effort = e;
  }

  if (body.contains("tools") && !body["tools"].is_null()) {
    const json& tools = body["tools"];
    if (!tools.is_array()) bad("tools", "'tools' must be an array");
    for (size_t i = 0; i < tools.size(); ++i) {
      std::string p = fmt::format("tools[{}]", i);
      const json& t = tools[i];
      if (!t.is_object() || t.value("type", "") != "function") bad(p + ".type", fmt::format("'{}.type' must be 'function'", p));
      if (!t.contains("function") || !t["function"].is_object()) bad(p + ".function", fmt::format("'{}.function' is required", p));
      const json& f = t["function"];
      if (!f.contains("name") || !f["name"].is_string() || !valid_function_name(f["name"]))
        bad(p + ".function.name", fmt::format("'{}.function.name' must match [A-Za-z0-9_.-]{{1,64}}", p));
      if (f.contains("description") && !f["description"].is_string() && !f["description"].is_null())
        bad(p + ".function.description", "'description' must be a string");
      if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object())
        bad(p + ".function.parameters", "'parameters' must be a JSON schema object");
    }
    r.tools = tools;
  }
  check_tool_choice(body, r.tools);

  std::map<std::string, std::string> call_names;  // tool_call id -> function name
  for (size_t i = 0; i < msgs.size(); ++i) {
    std::string p = fmt::format("messages[{}]", i);
    const json& m = msgs[i];
    if (!m.is_object()) bad(p, fmt::format("'{}' must be an object", p));
    if (!m.contains("role") || !m["role"].is_string()) bad(p + ".role", fmt::format("'{}.role' is required", p));
    Message msg;
    msg.role = m["role"];
    if (msg.role != "system" && msg.role != "developer" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      bad(p + ".role", fmt::format("'{}.role' must be system, developer, user, assistant or tool, got '{}'", p, msg.role));
    if (m.contains("content")) msg.content = content_text(m["content"], p + ".content");
    else if (msg.role != "assistant") bad(p + ".content", fmt::format("'{}.content' is required", p));
    if (msg.role == "assistant") {
      for (const char* key : {"reasoning_content", "reasoning", "thinking"})
        if (m.contains(key) && !m[key].is_null()) {
          if (!m[key].is_string()) bad(p + "." + key, fmt::format("'{}.{}' must be a string", p, key));
          msg.reasoning_content = m[key];
        }
      if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
        const json& tcs = m["tool_calls"];
        if (!tcs.is_array()) bad(p + ".tool_calls", "'tool_calls' must be an array");
        for (size_t j = 0; j < tcs.size(); ++j) {
          std::string q = fmt::format("{}.tool_calls[{}]", p, j);
          const json& tc = tcs[j];
          if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object())
            bad(q + ".function", fmt::format("'{}.function' is required", q));
          const json& f = tc["function"];
          if (!f.contains("name") || !f["name"].is_string() || !valid_function_name(f["name"]))
            bad(q + ".function.name", fmt::format("'{}.function.name' is invalid", q));
          ToolCall call;
          call.name = f["name"];
          call.id = tc.contains("id") && tc["id"].is_string() ? tc["id"].get<std::string>() : fmt::format("call_{}_{}", i, j);
          if (f.contains("arguments")) {
            if (f["arguments"].is_string()) call.arguments = f["arguments"];
            else if (f["arguments"].is_object()) call.arguments = f["arguments"].dump();
            else bad(q + ".function.arguments", fmt::format("'{}.function.arguments' must be a JSON string", q));
          } else {
            call.arguments = "{}";
          }
          call_names[call.id] = call.name;
          msg.tool_calls.push_back(std::move(call));
        }
      }
    }
    if (msg.role == "tool") {
      if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) msg.tool_call_id = m["tool_call_id"];
      if (m.contains("name") && m["name"].is_string()) msg.name = m["name"];
      if (msg.name.empty()) {
        auto it = call_names.find(msg.tool_call_id);
        if (it == call_names.end())
          bad(p + ".tool_call_id", fmt::format("'{}.tool_call_id' '{}' does not match an earlier assistant tool call", p,
                                               msg.tool_call_id));
        msg.name = it->second;
      }
    }
    r.messages.push_back(std::move(msg));
  }
  return r;
}

ChatRequest chat_request_from_json(const nlohmann::ordered_json& body) {
  ChatRequest r = chat_request_from_json(json(body));
  if (body.is_object() && body.contains("tools") && body["tools"].is_array()) r.tools_ordered = body["tools"];
  return r;
}

}  // namespace mx::harmony
