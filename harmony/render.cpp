// Harmony renderer. Where no tool-call history is involved the text equals the official gpt-oss
// chat template (tests/data/harmony goldens, rendered by a real Jinja engine); tool calls and tool
// results follow openai/harmony instead (<|constrain|>json, raw arguments and outputs), since the
// template double-encodes them.
#include <fmt/format.h>

#include "core/error.h"
#include "harmony/harmony.h"

namespace mx::harmony {
namespace {

using json = nlohmann::ordered_json;  // keep schema property order

struct Piece {
  bool special;
  std::string text;
};

class Builder {
 public:
  void special(const char* s) { pieces_.push_back({true, s}); }
  void text(std::string s) {
    if (!s.empty()) pieces_.push_back({false, std::move(s)});
  }
  Rendered finish(const Tokenizer& tok) const {
    Rendered r;
    for (const auto& p : pieces_) {
      r.text += p.text;
      if (p.special) {
        auto id = tok.token_id(p.text);
        if (!id) fail("tokenizer has no special token {}", p.text);
        r.tokens.push_back(*id);
      } else {
        auto ids = tok.encode(p.text, /*allow_special=*/false);
        r.tokens.insert(r.tokens.end(), ids.begin(), ids.end());
      }
    }
    return r;
  }

 private:
  std::vector<Piece> pieces_;
};

std::string tojson(const json& v) { return v.dump(-1, ' ', false); }

bool truthy(const json& o, const char* key) {
  if (!o.is_object() || !o.contains(key)) return false;
  const json& v = o[key];
  if (v.is_null() || (v.is_boolean() && !v.get<bool>())) return false;
  if ((v.is_string() || v.is_array() || v.is_object()) && v.empty()) return false;
  return true;
}

bool in_required(const json& required, const std::string& name) {
  if (!required.is_array()) return false;
  for (const auto& r : required)
    if (r.is_string() && r.get<std::string>() == name) return true;
  return false;
}

// JSON schema -> the TypeScript-like type the template's render_typescript_type produces.
std::string ts_type(const json& s) {
  const json type = s.is_object() && s.contains("type") ? s["type"] : json();
  const bool nullable = truthy(s, "nullable");
  if (type == "array") {
    std::string out;
    if (truthy(s, "items")) {
      const json& it = s["items"];
      const json itype = it.is_object() && it.contains("type") ? it["type"] : json();
      if (itype == "string") out = "string[]";
      else if (itype == "number" || itype == "integer") out = "number[]";
      else if (itype == "boolean") out = "boolean[]";
      else {
        std::string inner = ts_type(it);
        out = (inner == "object | object" || inner.size() > 50) ? "any[]" : inner + "[]";
      }
    } else {
      out = "any[]";
    }
    return nullable ? out + " | null" : out;
  }
  if (type.is_array() && !type.empty()) {
    std::string out;
    for (size_t i = 0; i < type.size(); ++i) out += (i ? " | " : "") + (type[i].is_string() ? type[i].get<std::string>() : tojson(type[i]));
    return out;
  }
  if (truthy(s, "oneOf")) {
    std::string out;
    const json& v = s["oneOf"];
    for (size_t i = 0; i < v.size(); ++i) out += (i ? " | " : "") + ts_type(v[i]);
    return out;
  }
  if (type == "string") {
    if (truthy(s, "enum")) {
      std::string out;
      for (size_t i = 0; i < s["enum"].size(); ++i) {
        const json& e = s["enum"][i];
        out += (i ? "\" | \"" : "\"") + (e.is_string() ? e.get<std::string>() : tojson(e));
      }
      return out + "\"";
    }
    return nullable ? "string | null" : "string";
  }
  if (type == "number" || type == "integer") return "number";
  if (type == "boolean") return "boolean";
  if (type == "object") {
    if (!truthy(s, "properties")) return "object";
    std::string out = "{\n";
    const json required = s.contains("required") ? s["required"] : json::array();
    bool first = true;
    for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
      if (!first) out += ", ";
      first = false;
      out += it.key() + (in_required(required, it.key()) ? "" : "?") + ": " + ts_type(it.value());
    }
    return out + "}";
  }
  return "any";
}

std::string functions_namespace(const json& tools) {
  std::string out = "## functions\n\nnamespace functions {\n\n";
  for (const auto& t : tools) {
    const json& f = t["function"];
    if (f.contains("description") && f["description"].is_string()) out += "// " + f["description"].get<std::string>() + "\n";
    out += "type " + f["name"].get<std::string>() + " = ";
    const json params = f.contains("parameters") ? f["parameters"] : json();
    if (truthy(params, "properties")) {
      out += "(_: {\n";
      const json required = params.contains("required") ? params["required"] : json::array();
      for (auto it = params["properties"].begin(); it != params["properties"].end(); ++it) {
        const json& p = it.value();
        if (truthy(p, "description") && p["description"].is_string()) out += "// " + p["description"].get<std::string>() + "\n";
        out += it.key() + (in_required(required, it.key()) ? "" : "?") + ": " + ts_type(p);
        if (p.is_object() && p.contains("default")) {
          const json& d = p["default"];
          std::string raw = d.is_string() ? d.get<std::string>() : tojson(d);
          if (truthy(p, "enum")) out += ", // default: " + raw;
          else if (truthy(p, "oneOf")) out += "// default: " + raw;
          else out += ", // default: " + tojson(d);
        }
        out += ",\n";
      }
      out += "}) => any;\n\n";
    } else {
      out += "() => any;\n\n";
    }
  }
  return out + "} // namespace functions";
}

}  // namespace

Rendered render_chat(const ChatRequest& req, const Tokenizer& tok) {
  Builder b;
  const json tools = !req.tools_ordered.is_null() ? req.tools_ordered : json::parse(req.tools.dump());
  const bool has_tools = tools.is_array() && !tools.empty();

  std::string sys = req.model_identity + "\nKnowledge cutoff: " + req.knowledge_cutoff + "\n";
  if (!req.current_date.empty()) sys += "Current date: " + req.current_date + "\n";
  sys += "\nReasoning: " + req.reasoning_effort + "\n\n";
  sys += "# Valid channels: analysis, commentary, final. Channel must be included for every message.";
  if (has_tools) sys += "\nCalls to these tools must go to the commentary channel: 'functions'.";
  b.special("<|start|>");
  b.text("system");
  b.special("<|message|>");
  b.text(sys);
  b.special("<|end|>");

  // The first system/developer message becomes the developer instructions.
  size_t first = 0;
  std::string dev;
  if (!req.messages.empty() && (req.messages[0].role == "system" || req.messages[0].role == "developer")) {
    dev = req.messages[0].content;
    first = 1;
  }
  const auto& rf = req.response_format;
  if (!dev.empty() || has_tools || rf) {
    std::string d;
    if (!dev.empty()) d += "# Instructions\n\n" + dev + "\n\n";
    if (has_tools) d += "# Tools\n\n" + functions_namespace(tools);
    if (rf) {  // the harmony guide's structured output section, last
      if (has_tools) d += "\n\n";
      d += "# Response Formats\n\n## " + rf->name + "\n\n";
      if (!rf->description.empty()) d += "// " + rf->description + "\n";
      d += rf->schema;
    }
    b.special("<|start|>");
    b.text("developer");
    b.special("<|message|>");
    b.text(d);
    b.special("<|end|>");
  }

  for (size_t i = first; i < req.messages.size(); ++i) {
    const Message& m = req.messages[i];
    if (m.role == "user" || m.role == "system" || m.role == "developer") {
      // Later system/developer messages (the template drops them) go in as developer messages.
      b.special("<|start|>");
      b.text(m.role == "user" ? "user" : "developer");
      b.special("<|message|>");
      b.text(m.content);
      b.special("<|end|>");
    } else if (m.role == "assistant" && !m.tool_calls.empty()) {
      // Keep this turn's reasoning only while the tool loop is ongoing (no later final answer).
      bool later_final = false;
      for (size_t j = i + 1; j < req.messages.size(); ++j)
        if (req.messages[j].role == "assistant" && req.messages[j].tool_calls.empty()) later_final = true;
      const std::string& cot = !m.reasoning_content.empty() ? m.reasoning_content : m.content;
      if (!cot.empty() && !later_final) {
        b.special("<|start|>");
        b.text("assistant");
        b.special("<|channel|>");
        b.text("analysis");
        b.special("<|message|>");
        b.text(cot);
        b.special("<|end|>");
      }
      for (const auto& tc : m.tool_calls) {
        b.special("<|start|>");
        b.text("assistant");
        b.text(" to=functions." + tc.name);
        b.special("<|channel|>");
        b.text("commentary");
        b.text(" ");
        b.special("<|constrain|>");
        b.text("json");
        b.special("<|message|>");
        b.text(tc.arguments);
        b.special("<|call|>");
      }
    } else if (m.role == "assistant") {
      // Earlier turns ended in a final answer: their reasoning is dropped.
      b.special("<|start|>");
      b.text("assistant");
      b.special("<|channel|>");
      b.text("final");
      b.special("<|message|>");
      b.text(m.content);
      b.special("<|end|>");
    } else if (m.role == "tool") {
      b.special("<|start|>");
      b.text("functions." + m.name);
      b.text(" to=assistant");
      b.special("<|channel|>");
      b.text("commentary");
      b.special("<|message|>");
      b.text(m.content);
      b.special("<|end|>");
    }
  }
  b.special("<|start|>");
  b.text("assistant");
  return b.finish(tok);
}

std::string forced_tool_call_prefix(const nlohmann::json& tool_choice) {
  if (tool_choice.is_string() && tool_choice == "required") return "<|channel|>commentary to=functions.";
  if (tool_choice.is_object() && tool_choice.contains("function") && tool_choice["function"].is_object() &&
      tool_choice["function"].contains("name") && tool_choice["function"]["name"].is_string())
    return "<|channel|>commentary to=functions." + tool_choice["function"]["name"].get<std::string>() +
           " <|constrain|>json<|message|>";
  return "";
}

std::vector<int32_t> stop_token_ids(const Tokenizer& tok) {
  std::vector<int32_t> ids;
  for (const char* s : {"<|return|>", "<|call|>"}) {
    auto id = tok.token_id(s);
    if (!id) fail("tokenizer has no special token {}", s);
    ids.push_back(*id);
  }
  return ids;
}

}  // namespace mx::harmony
