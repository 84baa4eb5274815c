// Harmony, the chat format gpt-oss was trained on: render an OpenAI-style chat request into the
// prompt (text and token ids), and parse generated tokens back into reasoning, content and
// tool calls. Follows openai/harmony's renderer; see docs/gpt-oss-spec.md section 5.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace mx::harmony {

struct ToolCall {
  std::string id;         // OpenAI tool_call id ("call_...")
  std::string name;       // function name (without "functions.")
  std::string arguments;  // JSON text
};

struct Message {
  std::string role;               // system | developer | user | assistant | tool
  std::string content;            // text (content parts already joined)
  std::string reasoning_content;  // assistant only
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;       // tool only
  std::string name;               // tool: function name if known (else resolved from tool_call_id)
};

// response_format json_schema: rendered at the end of the developer message ("# Response Formats").
struct ResponseFormatSpec {
  std::string name, description;
  std::string schema;  // compact JSON
};

struct ChatRequest {
  std::vector<Message> messages;
  std::optional<ResponseFormatSpec> response_format;
  nlohmann::json tools = nlohmann::json::array();  // OpenAI "tools" array (type=function entries)
  std::string reasoning_effort = "medium";         // low | medium | high
  std::string current_date;                        // YYYY-MM-DD; empty = omit the line
  std::string model_identity = "You are ChatGPT, a large language model trained by OpenAI.";
  std::string knowledge_cutoff = "2024-06";
  // Added: "tools" in the body's key order (JSON schema property order is what the model sees;
  // nlohmann::json sorts keys). Null = use `tools`.
  nlohmann::ordered_json tools_ordered;
};

// Builds a ChatRequest from the OpenAI body fields (messages, tools, reasoning_effort).
// Throws mx::InvalidRequest naming the parameter (e.g. "messages[1].role").
ChatRequest chat_request_from_json(const nlohmann::json& body);
// Added: same, keeping the body's key order for tool schemas (what the server should call).
ChatRequest chat_request_from_json(const nlohmann::ordered_json& body);

struct Rendered {
  std::string text;              // prompt text, special tokens written out
  std::vector<int32_t> tokens;   // ids; text pieces are encoded without special tokens
};

// Renders the conversation and the generation prompt "<|start|>assistant".
Rendered render_chat(const ChatRequest& req, const Tokenizer& tok);

// tool_choice forcing (chat form: "required" or {"type": "function", "function": {"name": N}}): the
// start of the assistant's next message, appended to the prompt after "<|start|>assistant" so that
// the message is a call to N ("<|channel|>commentary to=functions.N <|constrain|>json<|message|>"), or
// to a function the model names ("...to=functions." for required). "" for none / auto / absent.
std::string forced_tool_call_prefix(const nlohmann::json& tool_choice);

// Generation stops on these (<|return|>, <|call|>); <|end|> is not a stop.
std::vector<int32_t> stop_token_ids(const Tokenizer& tok);

// The harmony format's special token ids in a tokenizer (-1 where it has none).
struct SpecialIds {
  int32_t start, end, message, channel, constrain, ret, call;
  explicit SpecialIds(const Tokenizer& tok);
};

// A message header's channel and recipient, as "<|channel|>commentary to=functions.f <|constrain|>json" or
// " to=functions.f<|channel|>commentary json" spell them: the words after "<|channel|>" and after "to="
// (empty when absent). The streaming parser and structured output (output_constraint.h) read headers alike.
struct MessageHeader {
  std::string channel, recipient;
};
MessageHeader read_header(const std::string& header);

// Streaming parser of generated tokens (starts inside the assistant header, since the prompt
// ends with "<|start|>assistant"). Tolerates "to=" in either place and malformed or truncated
// output: it never throws on model output.
struct Event {
  enum class Kind { kReasoning, kContent, kToolCallBegin, kToolCallArguments, kToolCallEnd };
  Kind kind;
  std::string text;   // delta text (reasoning/content/arguments)
  std::string name;   // tool name for kToolCallBegin
};

class StreamParser {
 public:
  explicit StreamParser(std::shared_ptr<const Tokenizer> tok);
  ~StreamParser();
  std::vector<Event> push(int32_t token);
  std::vector<Event> finish();        // end of generation: flush partial text
  bool saw_tool_call_end() const;     // last message ended with <|call|>

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mx::harmony
