// Validation of the OpenAI request fields shared by /v1/chat/completions and /v1/completions,
// before anything is allocated (reliability.md table A). Throws mx::InvalidRequest naming the
// parameter.
#pragma once
#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harmony/json_schema.h"
#include "model/model_runner.h"

namespace mx::server {

struct Limits {
  int max_n = 16;
  int max_choices = 64;  // prompts x n of a completions request (a batch of prompts)
  int max_top_logprobs = 20;
  int max_stop = 16;
  int max_stop_len = 256;
  int max_stop_token_ids = 64;
  int max_logit_bias = 300;
};

struct CommonParams {
  SamplingParams sampling;
  int max_tokens = -1;        // -1: not given (fill to the context)
  int min_tokens = 0;         // vLLM extension: no stop token or stop string ends the text before this many tokens
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage = false;  // vLLM's stream_options.continuous_usage_stats: usage in every chunk too
  bool include_stop_str = false;  // vLLM's include_stop_str_in_output: the matched stop string (or stop_token_ids' text) stays
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // vLLM extension; the caller checks them against the vocabulary
  bool ignore_eos = false;  // vLLM extension: the model's end tokens (eos ids; chat: <|return|>, <|call|>) do not stop
  std::vector<LogitBias> logit_bias;   // sorted by id; the caller checks the ids against the vocabulary
  // response_format json_object / json_schema: the answer (chat: its final channel) is held to the schema
  // (json_object: any object; harmony/json_constraint.h), which also goes into the developer message.
  // Null: free text.
  std::shared_ptr<const harmony::JsonSchema> json_schema;
  bool echo = false;         // completions: the prompt's text (and, with logprobs, its log-probs) before the output
  int prompt_logprobs = -1;  // vLLM's prompt_logprobs: each prompt token's log-prob, rank and this many best ids
  // Completions' echo with max_tokens 0 (OpenAI's): the prompt's text and log-probs, no output. The engine
  // still samples one token (its logits are the last row's), which the answer leaves out.
  bool score_only() const { return echo && max_tokens == 0; }
  // The alternatives the engine computes for each prompt token (GenRequest::prompt_logprobs), -1: none.
  int prompt_top() const { return std::max(prompt_logprobs, echo && sampling.logprobs ? sampling.top_logprobs : -1); }
};

// chat: logprobs is a bool + top_logprobs; completions: logprobs is an int (0..20).
CommonParams parse_common(const nlohmann::json& body, bool chat, const Limits& lim);

}  // namespace mx::server
