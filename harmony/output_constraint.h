// One choice's structured output over a harmony completion: each assistant message's header (the text
// from its start to <|message|>) decides what holds its body. A call "to=functions.NAME" whose function has
// a schema (strict, or forced by tool_choice) is held to its parameters and ends with <|call|>; the final
// channel is held to the request's schema (response_format, guided_*) and ends with <|return|>; every other
// message (analysis, commentary, a free call) is free. A raw completion is held from its first token.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "harmony/harmony.h"
#include "harmony/json_constraint.h"
#include "harmony/json_schema.h"

namespace mx::harmony {

// The functions whose arguments are held: name -> its parameters' schema.
using ToolSchemas = std::map<std::string, std::shared_ptr<const JsonSchema>>;

// The OpenAI tools (chat form) whose calls are held: those with "strict": true, every one under tool_choice
// "required", the named one under a named tool_choice. Null when none. Throws mx::InvalidRequest naming
// tools[i].function.parameters on a schema it cannot read.
std::shared_ptr<const ToolSchemas> held_tool_schemas(const nlohmann::json& tools, const nlohmann::json& tool_choice);

class OutputConstraint {
 public:
  // final_schema: the final channel's (null: free); tools: the held calls' (null: none). from_start: a raw
  // completion, held to final_schema from its first token and ended by end_ids.
  OutputConstraint(std::shared_ptr<const JsonTokenMask> mask, std::shared_ptr<const JsonSchema> final_schema,
                   std::shared_ptr<const ToolSchemas> tools, bool from_start = false, std::vector<int32_t> end_ids = {});
  // The tokens the next one may be, as bits over the vocabulary; empty when it is free.
  std::span<const uint64_t> allowed();
  void accept(int32_t token);  // a generated token (or one of a forced prefix the prompt ends with)
  bool active() const { return phase_ == Phase::kHeld; }

 private:
  enum class Phase { kHeader, kBody, kHeld };
  void open_body();  // at <|message|>: the header decides
  std::shared_ptr<const JsonTokenMask> mask_;
  std::shared_ptr<const JsonSchema> final_, held_;  // held_: the body's schema while kHeld
  std::shared_ptr<const ToolSchemas> tools_;
  const Tokenizer& tok_;
  SpecialIds ids_;
  std::vector<int32_t> raw_ends_, ends_;  // ends_: the held body's end ids
  Phase phase_ = Phase::kHeader;
  std::string header_;
  JsonState state_;
  JsonState cached_;  // the state bits_ were computed for (strings keep one state over many tokens)
  const JsonSchema* cached_schema_ = nullptr;
  bool any_ = false;  // bits_ has an id set
  std::vector<uint64_t> bits_;
};

}  // namespace mx::harmony
