// A response_format json_schema compiled for the token constraint (json_constraint.h): each (sub)schema one
// node the byte recognizer looks up by index, $refs resolved to their nodes (recursion allowed). What is
// held: type (one or a list), properties in the schema's order (required ones present, the others optional,
// no other keys: xgrammar's and OpenAI strict mode's reading), additionalProperties on objects without
// properties, items, minItems / maxItems, enum and const (matched as their compact JSON text), anyOf /
// oneOf (the first alternative a value's first byte fits), integer (no fraction or exponent), a string's
// pattern (the whole string matches; its text written without escapes). Not held (accepted, left to the
// model): format, minLength / maxLength, minimum / maximum, multipleOf, uniqueItems, prefixItems, not,
// if / then / else.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harmony/byte_regex.h"

namespace mx::harmony {

// Value types, as bits.
enum JsonType : uint8_t {
  kJsonObject = 1,
  kJsonArray = 2,
  kJsonString = 4,
  kJsonNumber = 8,   // any number
  kJsonInteger = 16, // digits only (a number without fraction or exponent)
  kJsonBool = 32,
  kJsonNull = 64,
  kJsonAnyType = 127,
};

struct JsonSchemaProp {
  std::string key;  // the key's bytes between its quotes, JSON-escaped as the model must write them
  int32_t node = 0;
  bool required = false;
};

struct JsonSchemaNode {
  uint8_t types = kJsonAnyType;
  std::vector<JsonSchemaProp> props;  // objects: the listed keys in order (at most kJsonMaxProps)
  int32_t extra = 0;                  // objects without props: each value's node; -1: no keys at all
  int32_t items = 0;                  // arrays: each item's node
  uint8_t min_items = 0, max_items = 255;  // 255: no maximum
  int32_t literals = -1;              // enum / const: an index into JsonSchema::literals
  int32_t pattern = -1;               // strings: an index into JsonSchema::pattern (the text between the quotes)
  std::vector<int32_t> any_of;        // alternatives, tried in order by a value's first byte
};

constexpr int kJsonMaxProps = 64;
constexpr size_t kJsonMaxLiteral = 255;  // bytes of an enum value's JSON text

class JsonSchema {
 public:
  // Throws mx::InvalidRequest(param, ...) on a schema it cannot read (a bad type, an unresolved $ref, ...).
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::json& schema, const std::string& param);
  // json_object: one object, any keys and values.
  static std::shared_ptr<const JsonSchema> any_object();
  // vLLM's guided_choice: the text is one of the strings as they are (not JSON), nothing around it.
  // Throws mx::InvalidRequest(param, ...) on an empty list, an empty string or one over kJsonMaxLiteral bytes.
  static std::shared_ptr<const JsonSchema> choice(std::vector<std::string> texts, const std::string& param);
  // vLLM's guided_regex: the text matches the pattern (byte_regex.h), nothing around it.
  static std::shared_ptr<const JsonSchema> regex(const std::string& pattern, const std::string& param);

  bool raw() const { return raw_; }  // a choice: no whitespace before or after the text

  int32_t root() const { return root_; }
  const JsonSchemaNode& node(int32_t i) const { return nodes_[size_t(i)]; }
  // A literal list: the values' compact JSON texts, sorted by bytes, distinct.
  const std::vector<std::string>& literals(int32_t i) const { return literals_[size_t(i)]; }
  const ByteDfa& pattern(int32_t i) const { return *patterns_[size_t(i)]; }
  // Whether a value of node i may begin with byte c.
  bool may_start(int32_t i, uint8_t c, int depth = 0) const;

 private:
  friend class JsonSchemaCompiler;
  static std::shared_ptr<JsonSchema> with_root(JsonSchemaNode root, bool raw);  // node 0 (any) and the root
  std::vector<JsonSchemaNode> nodes_;  // node 0: any value
  std::vector<std::vector<std::string>> literals_;
  std::vector<std::shared_ptr<const ByteDfa>> patterns_;
  int32_t root_ = 0;
  bool raw_ = false;
};

}  // namespace mx::harmony
