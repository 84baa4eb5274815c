#include "harmony/json_schema.h"

#include <algorithm>
#include <fmt/format.h>
#include <map>

#include "core/error.h"

namespace mx::harmony {

using nlohmann::json;

class JsonSchemaCompiler {
 public:
  JsonSchemaCompiler(const json& root, std::string param) : root_(root), param_(std::move(param)) {
    out_ = std::make_shared<JsonSchema>();
    out_->nodes_.emplace_back();  // node 0: any value
  }

  std::shared_ptr<JsonSchema> run() {
    out_->root_ = compile(root_, "", 0);
    return out_;
  }

 private:
  [[noreturn]] void fail(const std::string& path, const std::string& msg) const {
    throw InvalidRequest(param_, fmt::format("invalid JSON schema{}: {}", path.empty() ? "" : " at '" + path + "'", msg));
  }

  int32_t add_node() {
    if (out_->nodes_.size() >= 65535) fail("", "the schema has too many subschemas (at most 65,535)");
    out_->nodes_.emplace_back();
    return int32_t(out_->nodes_.size() - 1);
  }

  // "#", "#/$defs/x", "#/definitions/x", any JSON pointer into the schema: compiled once, so a
  // recursive schema refers back to its node.
  int32_t ref(const std::string& target, const std::string& path, int depth) {
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (target.empty() || target[0] != '#') fail(path, fmt::format("'$ref' '{}' must point into this schema (#/...)", target));
    const json* t = nullptr;
    try {
      t = &root_.at(json::json_pointer(target.substr(1)));
    } catch (const std::exception&) {
      fail(path, fmt::format("'$ref' '{}' does not resolve", target));
    }
    const int32_t id = add_node();
    refs_[target] = id;
    const int32_t body = compile(*t, target, depth + 1);
    if (body != id) out_->nodes_[size_t(id)] = out_->nodes_[size_t(body)];  // a copy: body's node may be shared
    return id;
  }

  static uint8_t type_bit(const std::string& t) {
    if (t == "object") return kJsonObject;
    if (t == "array") return kJsonArray;
    if (t == "string") return kJsonString;
    if (t == "number") return kJsonNumber;
    if (t == "integer") return kJsonInteger;
    if (t == "boolean") return kJsonBool;
    if (t == "null") return kJsonNull;
    return 0;
  }

  int32_t compile(const json& s, const std::string& path, int depth) {
    if (depth > 64) fail(path, "the schema nests too deeply (at most 64 levels)");
    if (s.is_boolean()) {
      if (s.get<bool>()) return 0;
      fail(path, "a 'false' schema admits no value");
    }
    if (!s.is_object()) fail(path, "a schema must be an object");
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) fail(path, "'$ref' must be a string");
      return ref(s["$ref"].get<std::string>(), path + "/$ref", depth);
    }
    for (const char* k : {"anyOf", "oneOf"})
      if (s.contains(k)) {
        const json& alts = s[k];
        if (!alts.is_array() || alts.empty()) fail(path, fmt::format("'{}' must be a non-empty array of schemas", k));
        if (alts.size() == 1) return compile(alts[0], path + "/" + k + "/0", depth + 1);
        std::vector<int32_t> ids;
        for (size_t i = 0; i < alts.size(); ++i) ids.push_back(compile(alts[i], fmt::format("{}/{}/{}", path, k, i), depth + 1));
        const int32_t id = add_node();
        out_->nodes_[size_t(id)].any_of = std::move(ids);
        return id;
      }
    if (s.contains("allOf")) {
      const json& all = s["allOf"];
      if (!all.is_array() || all.size() != 1) fail(path, "'allOf' is supported with one schema only");
      return compile(all[0], path + "/allOf/0", depth + 1);
    }

    JsonSchemaNode n;
    if (s.contains("enum") || s.contains("const")) {
      std::vector<std::string> lits;
      if (s.contains("const")) lits.push_back(s["const"].dump());
      else if (!s["enum"].is_array() || s["enum"].empty()) fail(path, "'enum' must be a non-empty array");
      else
        for (const json& v : s["enum"]) lits.push_back(v.dump());
      for (const std::string& l : lits)
        if (l.size() > kJsonMaxLiteral) fail(path, fmt::format("an enum value's JSON text is over {} bytes", kJsonMaxLiteral));
      std::sort(lits.begin(), lits.end());
      lits.erase(std::unique(lits.begin(), lits.end()), lits.end());
      out_->literals_.push_back(std::move(lits));
      n.literals = int32_t(out_->literals_.size() - 1);
      const int32_t id = add_node();
      out_->nodes_[size_t(id)] = std::move(n);
      return id;
    }

    if (s.contains("type")) {
      const json& t = s["type"];
      std::vector<std::string> names;
      if (t.is_string()) names.push_back(t.get<std::string>());
      else if (t.is_array() && !t.empty() && std::all_of(t.begin(), t.end(), [](const json& x) { return x.is_string(); }))
        for (const json& x : t) names.push_back(x.get<std::string>());
      else fail(path, "'type' must be a type name or a non-empty array of them");
      n.types = 0;
      for (const std::string& name : names) {
        const uint8_t b = type_bit(name);
        if (!b) fail(path, fmt::format("unknown type '{}' (object, array, string, number, integer, boolean, null)", name));
        n.types |= b;
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      n.types = kJsonObject;
    } else if (s.contains("items")) {
      n.types = kJsonArray;
    }

    if (s.contains("properties")) {
      const json& props = s["properties"];
      if (!props.is_object()) fail(path, "'properties' must be an object of schemas");
      if (props.size() > size_t(kJsonMaxProps)) fail(path, fmt::format("an object may list at most {} properties", kJsonMaxProps));
      for (const auto& [key, sub] : props.items()) {
        const std::string quoted = json(key).dump();
        if (quoted.size() - 2 > kJsonMaxLiteral) fail(path, fmt::format("a property name is over {} bytes", kJsonMaxLiteral));
        n.props.push_back({quoted.substr(1, quoted.size() - 2), 0, false});
      }
      size_t i = 0;
      for (const auto& [key, sub] : props.items()) n.props[i++].node = compile(sub, path + "/properties/" + key, depth + 1);
    }
    if (s.contains("required")) {
      const json& req = s["required"];
      if (!req.is_array()) fail(path, "'required' must be an array of property names");
      for (const json& r : req) {
        if (!r.is_string()) fail(path, "'required' must be an array of property names");
        const std::string quoted = json(r.get<std::string>()).dump();
        auto it = std::find_if(n.props.begin(), n.props.end(),
                               [&](const JsonSchemaProp& p) { return p.key == quoted.substr(1, quoted.size() - 2); });
        if (it == n.props.end()) fail(path, fmt::format("required property '{}' is not in 'properties'", r.get<std::string>()));
        it->required = true;
      }
    }
    if (s.contains("additionalProperties")) {
      const json& a = s["additionalProperties"];
      if (a.is_boolean()) n.extra = a.get<bool>() ? 0 : -1;
      else n.extra = compile(a, path + "/additionalProperties", depth + 1);
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) fail(path, "'pattern' must be a string");
      try {
        out_->patterns_.push_back(ByteDfa::compile(s["pattern"].get<std::string>(), param_));
      } catch (const InvalidRequest& e) {
        fail(path + "/pattern", e.what());
      }
      n.pattern = int32_t(out_->patterns_.size() - 1);
    }
    if (s.contains("items")) {
      const json& it = s["items"];
      if (it.is_object() || it.is_boolean()) n.items = compile(it, path + "/items", depth + 1);
      else fail(path, "'items' must be a schema");
    }
    auto count = [&](const char* k, int dflt) {
      if (!s.contains(k)) return dflt;
      if (!s[k].is_number_integer() || s[k].get<int64_t>() < 0) fail(path, fmt::format("'{}' must be a non-negative integer", k));
      return int(std::min<int64_t>(s[k].get<int64_t>(), 255));
    };
    const int lo = count("minItems", 0), hi = count("maxItems", 255);
    if (lo > 254) fail(path, "'minItems' above 254 is not supported");
    if (lo > hi) fail(path, "'minItems' is above 'maxItems'");
    n.min_items = uint8_t(lo);
    n.max_items = uint8_t(hi);

    const int32_t id = add_node();
    out_->nodes_[size_t(id)] = std::move(n);
    return id;
  }

  const json& root_;
  std::string param_;
  std::shared_ptr<JsonSchema> out_;
  std::map<std::string, int32_t> refs_;
};

std::shared_ptr<const JsonSchema> JsonSchema::compile(const json& schema, const std::string& param) {
  return JsonSchemaCompiler(schema, param).run();
}

std::shared_ptr<JsonSchema> JsonSchema::with_root(JsonSchemaNode root, bool raw) {
  auto o = std::make_shared<JsonSchema>();
  o->nodes_.emplace_back();  // node 0: any value
  o->nodes_.push_back(std::move(root));
  o->root_ = 1;
  o->raw_ = raw;
  return o;
}

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  static const std::shared_ptr<const JsonSchema> s = [] {
    JsonSchemaNode n;
    n.types = kJsonObject;
    return with_root(std::move(n), false);
  }();
  return s;
}

std::shared_ptr<const JsonSchema> JsonSchema::choice(std::vector<std::string> texts, const std::string& param) {
  if (texts.empty() || texts.size() > 65535) throw InvalidRequest(param, fmt::format("'{}' must list 1 to 65,535 strings", param));
  for (const std::string& t : texts)
    if (t.empty() || t.size() > kJsonMaxLiteral)
      throw InvalidRequest(param, fmt::format("'{}' strings must be 1 to {} bytes", param, kJsonMaxLiteral));
  std::sort(texts.begin(), texts.end());
  texts.erase(std::unique(texts.begin(), texts.end()), texts.end());
  JsonSchemaNode n;
  n.literals = 0;
  auto o = with_root(std::move(n), true);
  o->literals_.push_back(std::move(texts));
  return o;
}

std::shared_ptr<const JsonSchema> JsonSchema::regex(const std::string& pattern, const std::string& param) {
  JsonSchemaNode n;
  n.pattern = 0;
  auto o = with_root(std::move(n), true);
  o->patterns_.push_back(ByteDfa::compile(pattern, param));
  return o;
}

bool JsonSchema::may_start(int32_t i, uint8_t c, int depth) const {
  const JsonSchemaNode& n = node(i);
  if (depth > 16) return false;  // unions of unions in a cycle admit nothing
  if (n.literals >= 0) {
    const auto& l = literals(n.literals);
    return std::any_of(l.begin(), l.end(), [&](const std::string& v) { return uint8_t(v[0]) == c; });
  }
  if (!n.any_of.empty()) {
    return std::any_of(n.any_of.begin(), n.any_of.end(), [&](int32_t a) { return may_start(a, c, depth + 1); });
  }
  switch (c) {
    case '"': return n.types & kJsonString;
    case '{': return n.types & kJsonObject;
    case '[': return n.types & kJsonArray;
    case 't': case 'f': return n.types & kJsonBool;
    case 'n': return n.types & kJsonNull;
    default: return (c == '-' || (c >= '0' && c <= '9')) && (n.types & (kJsonNumber | kJsonInteger));
  }
}

}  // namespace mx::harmony
