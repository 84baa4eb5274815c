#include "server/validate.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace mx::server {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& p, const std::string& msg) { throw InvalidRequest(p, msg); }

bool present(const json& b, const char* k) { return b.contains(k) && !b[k].is_null(); }

double num(const json& b, const char* k, double lo, double hi, bool lo_open = false) {
  const json& v = b[k];
  if (!v.is_number()) bad(k, fmt::format("'{}' must be a number", k));
  double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
    bad(k, fmt::format("'{}' must be in {}{}, {}], got {}", k, lo_open ? "(" : "[", lo, hi, d));
  return d;
}

int64_t integer(const json& b, const char* k, int64_t lo, int64_t hi) {
  const json& v = b[k];
  if (!v.is_number_integer()) bad(k, fmt::format("'{}' must be an integer", k));
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    bad(k, fmt::format("'{}' is out of range", k));
  int64_t i = v.get<int64_t>();
  if (i < lo || i > hi) bad(k, fmt::format("'{}' must be in [{}, {}], got {}", k, lo, hi, i));
  return i;
}

// OpenAI's logit_bias: {"token id": bias}. Ids are decimal strings (checked against the vocabulary by the
// caller); biases are clamped to [-100, 100] as vLLM does; sorted by id, one entry an id.
std::vector<LogitBias> logit_bias(const json& v, int max_entries) {
  const char* k = "logit_bias";
  if (!v.is_object()) bad(k, "'logit_bias' must be an object mapping token ids to biases");
  if (int(v.size()) > max_entries) bad(k, fmt::format("'logit_bias' may hold at most {} token ids", max_entries));
  std::vector<LogitBias> out;
  for (const auto& [key, val] : v.items()) {
    int32_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (key.empty() || ec != std::errc() || end != key.data() + key.size() || id < 0)
      bad(k, fmt::format("'logit_bias' keys must be token ids (non-negative integers), got \"{}\"", key));
    if (!val.is_number() || !std::isfinite(val.get<double>()))
      bad(k, fmt::format("'logit_bias' values must be numbers, got {} for token {}", val.dump(), key));
    out.push_back({id, float(std::clamp(val.get<double>(), -100.0, 100.0))});
  }
  std::sort(out.begin(), out.end(), [](const LogitBias& a, const LogitBias& b) { return a.id < b.id; });
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i].id == out[i - 1].id) bad(k, fmt::format("'logit_bias' names token {} twice", out[i].id));
  return out;
}

// OpenAI's response_format: text (the default), json_object, or json_schema {name, description?, schema,
// strict?}: the schema to hold the answer to, null for text. The schema is held whatever strict says (as
// vLLM does).
std::shared_ptr<const harmony::JsonSchema> json_format(const json& f) {
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
    bad("response_format", "'response_format' must be an object with a string 'type'");
  const std::string type = f["type"].get<std::string>();
  if (type == "text") return nullptr;
  if (type == "json_object") return harmony::JsonSchema::any_object();
  if (type != "json_schema")
    bad("response_format", fmt::format("'response_format.type' must be text, json_object or json_schema, got '{}'", type));
  if (!f.contains("json_schema") || !f["json_schema"].is_object())
    bad("response_format.json_schema", "'response_format.json_schema' must be an object");
  const json& js = f["json_schema"];
  if (!js.contains("name") || !js["name"].is_string())
    bad("response_format.json_schema.name", "'response_format.json_schema.name' must be a string");
  const std::string name = js["name"].get<std::string>();
  if (name.empty() || name.size() > 64 ||
      !std::all_of(name.begin(), name.end(), [](char c) { return std::isalnum(uint8_t(c)) || c == '_' || c == '-'; }))
    bad("response_format.json_schema.name", "'response_format.json_schema.name' must be 1-64 of a-z, A-Z, 0-9, _ and -");
  if (!js.contains("schema") || !js["schema"].is_object())
    bad("response_format.json_schema.schema", "'response_format.json_schema.schema' must be a JSON schema object");
  if (js.contains("description") && !js["description"].is_string())
    bad("response_format.json_schema.description", "'response_format.json_schema.description' must be a string");
  if (js.contains("strict") && !js["strict"].is_boolean() && !js["strict"].is_null())
    bad("response_format.json_schema.strict", "'response_format.json_schema.strict' must be a boolean");
  return harmony::JsonSchema::compile(js["schema"], "response_format.json_schema.schema");
}

// vLLM's guided_json: a schema, or its JSON text.
std::shared_ptr<const harmony::JsonSchema> guided_json(const json& v, const std::string& k) {
  json schema = v;
  if (v.is_string()) {
    schema = json::parse(v.get<std::string>(), nullptr, false);
    if (schema.is_discarded()) bad(k, fmt::format("'{}' must be a JSON schema (an object, or its JSON text)", k));
  }
  if (!schema.is_object()) bad(k, fmt::format("'{}' must be a JSON schema (an object, or its JSON text)", k));
  return harmony::JsonSchema::compile(schema, k);
}

// vLLM's guided_choice: the answer is one of these strings.
std::shared_ptr<const harmony::JsonSchema> guided_choice(const json& v, const std::string& k) {
  if (!v.is_array() || !std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_string(); }))
    bad(k, fmt::format("'{}' must be an array of strings", k));
  return harmony::JsonSchema::choice(v.get<std::vector<std::string>>(), k);
}

// vLLM's guided_regex: the answer matches the pattern (harmony/byte_regex.h).
std::shared_ptr<const harmony::JsonSchema> guided_regex(const json& v, const std::string& k) {
  if (!v.is_string() || v.get<std::string>().empty()) bad(k, fmt::format("'{}' must be a non-empty string", k));
  return harmony::JsonSchema::regex(v.get<std::string>(), k);
}

// What holds the answer: response_format's JSON, vLLM's guided_json / guided_choice / guided_regex, or its
// newer structured_outputs {json | choice | regex | json_object}; one of them at most. Null: free text.
std::shared_ptr<const harmony::JsonSchema> held_output(const json& body) {
  std::vector<std::pair<std::string, std::shared_ptr<const harmony::JsonSchema>>> held;
  if (present(body, "response_format"))
    if (auto s = json_format(body["response_format"])) held.emplace_back("response_format", s);
  if (present(body, "guided_json")) held.emplace_back("guided_json", guided_json(body["guided_json"], "guided_json"));
  if (present(body, "guided_choice")) held.emplace_back("guided_choice", guided_choice(body["guided_choice"], "guided_choice"));
  if (present(body, "guided_regex")) held.emplace_back("guided_regex", guided_regex(body["guided_regex"], "guided_regex"));
  if (present(body, "structured_outputs")) {
    const json& so = body["structured_outputs"];
    if (!so.is_object()) bad("structured_outputs", "'structured_outputs' must be an object");
    for (const char* k : {"grammar", "structural_tag"})
      if (present(so, k)) bad(std::string("structured_outputs.") + k, fmt::format("'structured_outputs.{}' is not supported", k));
    int n = 0;
    if (present(so, "json")) ++n, held.emplace_back("structured_outputs", guided_json(so["json"], "structured_outputs.json"));
    if (present(so, "choice")) ++n, held.emplace_back("structured_outputs", guided_choice(so["choice"], "structured_outputs.choice"));
    if (present(so, "regex")) ++n, held.emplace_back("structured_outputs", guided_regex(so["regex"], "structured_outputs.regex"));
    if (present(so, "json_object")) {
      if (!so["json_object"].is_boolean()) bad("structured_outputs.json_object", "'structured_outputs.json_object' must be a boolean");
      if (so["json_object"].get<bool>()) ++n, held.emplace_back("structured_outputs", harmony::JsonSchema::any_object());
    }
    if (n != 1) bad("structured_outputs", "'structured_outputs' must hold one of json, choice, regex and json_object");
  }
  if (held.size() > 1)
    bad(held[1].first, fmt::format("'{}' and '{}' both constrain the output: give one", held[0].first, held[1].first));
  return held.empty() ? nullptr : held[0].second;
}

}  // namespace

CommonParams parse_common(const json& body, bool chat, const Limits& lim) {
  if (!body.is_object()) bad("", "request body must be a JSON object");
  CommonParams p;
  if (present(body, "model") && !body["model"].is_string()) bad("model", "'model' must be a string");
  const char* mt = chat && present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  // 0 only with completions' echo: the prompt scored, nothing generated (checked once echo is read).
  if (present(body, mt)) p.max_tokens = int(integer(body, mt, chat ? 1 : 0, 1 << 30));
  if (present(body, "temperature")) p.sampling.temperature = float(num(body, "temperature", 0, 2));
  if (p.sampling.temperature > 0 && p.sampling.temperature < 0.01f) p.sampling.temperature = 0.01f;  // avoid inf/NaN
  if (present(body, "top_p")) p.sampling.top_p = float(num(body, "top_p", 0, 1, /*lo_open=*/true));
  if (present(body, "top_k")) {
    int64_t k = integer(body, "top_k", -1, 1 << 20);
    p.sampling.top_k = k < 0 ? 0 : int(k);
  }
  if (present(body, "min_p")) p.sampling.min_p = float(num(body, "min_p", 0, 1));
  if (present(body, "presence_penalty")) p.sampling.presence_penalty = float(num(body, "presence_penalty", -2, 2));
  if (present(body, "frequency_penalty")) p.sampling.frequency_penalty = float(num(body, "frequency_penalty", -2, 2));
  if (present(body, "repetition_penalty"))  // vLLM: finite and > 0
    p.sampling.repetition_penalty = float(num(body, "repetition_penalty", 0, 1e9, /*lo_open=*/true));
  if (present(body, "seed")) {
    int64_t s = integer(body, "seed", -1, std::numeric_limits<int64_t>::max());
    p.sampling.seed = s < 0 ? 0 : uint64_t(s);
  }
  if (present(body, "n")) p.n = int(integer(body, "n", 1, lim.max_n));
  if (present(body, "best_of") && integer(body, "best_of", 1, lim.max_n) != 1) bad("best_of", "'best_of' > 1 is not supported");
  if (present(body, "stream")) {
    if (!body["stream"].is_boolean()) bad("stream", "'stream' must be a boolean");
    p.stream = body["stream"];
  }
  if (present(body, "stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) bad("stream_options", "'stream_options' must be an object");
    if (so.contains("include_usage") && !so["include_usage"].is_null()) {
      if (!so["include_usage"].is_boolean()) bad("stream_options.include_usage", "'include_usage' must be a boolean");
      p.include_usage = so["include_usage"];
    }
    if (so.contains("continuous_usage_stats") && !so["continuous_usage_stats"].is_null()) {
      if (!so["continuous_usage_stats"].is_boolean())
        bad("stream_options.continuous_usage_stats", "'continuous_usage_stats' must be a boolean");
      p.continuous_usage = so["continuous_usage_stats"];
    }
  }
  if (chat) {
    if (present(body, "logprobs")) {
      if (!body["logprobs"].is_boolean()) bad("logprobs", "'logprobs' must be a boolean");
      p.sampling.logprobs = body["logprobs"];
    }
    if (present(body, "top_logprobs")) {
      p.sampling.top_logprobs = int(integer(body, "top_logprobs", 0, lim.max_top_logprobs));
      if (p.sampling.top_logprobs > 0 && !p.sampling.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
  } else if (present(body, "logprobs")) {
    p.sampling.top_logprobs = int(integer(body, "logprobs", 0, lim.max_top_logprobs));
    p.sampling.logprobs = true;
  }
  if (present(body, "stop")) {
    const json& s = body["stop"];
    if (s.is_string()) {
      p.stop.push_back(s);
    } else if (s.is_array()) {
      if (int(s.size()) > lim.max_stop) bad("stop", fmt::format("at most {} stop strings", lim.max_stop));
      for (const auto& e : s) {
        if (!e.is_string()) bad("stop", "'stop' must be a string or a list of strings");
        p.stop.push_back(e);
      }
    } else {
      bad("stop", "'stop' must be a string or a list of strings");
    }
    for (const auto& x : p.stop)
      if (x.empty() || int(x.size()) > lim.max_stop_len)
        bad("stop", fmt::format("stop strings must be 1..{} bytes", lim.max_stop_len));
  }
  if (present(body, "stop_token_ids")) {
    const json& s = body["stop_token_ids"];
    if (!s.is_array() || int(s.size()) > lim.max_stop_token_ids)
      bad("stop_token_ids", fmt::format("'stop_token_ids' must be a list of at most {} token ids", lim.max_stop_token_ids));
    for (const auto& t : s) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
        bad("stop_token_ids", "'stop_token_ids' must be a list of non-negative integer token ids");
      p.stop_token_ids.push_back(t.get<int32_t>());
    }
  }
  if (present(body, "ignore_eos")) {
    if (!body["ignore_eos"].is_boolean()) bad("ignore_eos", "'ignore_eos' must be a boolean");
    p.ignore_eos = body["ignore_eos"].get<bool>();
  }
  if (present(body, "include_stop_str_in_output")) {
    if (!body["include_stop_str_in_output"].is_boolean())
      bad("include_stop_str_in_output", "'include_stop_str_in_output' must be a boolean");
    p.include_stop_str = body["include_stop_str_in_output"].get<bool>();
  }
  if (present(body, "min_tokens")) {
    int64_t m = integer(body, "min_tokens", 0, 1 << 30);
    if (p.max_tokens > 0 && m > p.max_tokens) bad("min_tokens", fmt::format("'min_tokens' ({}) must not exceed max_tokens ({})", m, p.max_tokens));
    p.min_tokens = int(m);
  }
  if (present(body, "logit_bias")) p.logit_bias = logit_bias(body["logit_bias"], lim.max_logit_bias);
  p.json_schema = held_output(body);
  for (const char* unsupported : {"chat_template", "guided_grammar"})
    if (present(body, unsupported)) bad(unsupported, fmt::format("'{}' is not supported", unsupported));
  if (!chat && present(body, "echo")) {
    if (!body["echo"].is_boolean()) bad("echo", "'echo' must be a boolean");
    p.echo = body["echo"].get<bool>();
  }
  if (p.max_tokens == 0 && !p.echo)
    bad(mt, fmt::format("'{}' must be at least 1 (0 only with 'echo': the prompt scored, nothing generated)", mt));
  if (present(body, "prompt_logprobs"))  // (vLLM's -1, the whole vocabulary, is not offered)
    p.prompt_logprobs = int(integer(body, "prompt_logprobs", 0, lim.max_top_logprobs));
  // A suffix would change the text a client reads back: refused, not ignored.
  if (!chat && present(body, "suffix") && body["suffix"] != "")
    bad("suffix", "'suffix' is not supported");
  return p;
}

}  // namespace mx::server
