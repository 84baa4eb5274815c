// The server's internals shared by its translation units (server.cpp: chat and text completions, the
// routes; responses.cpp: the Responses API). Not part of the public interface (server.h).
#pragma once
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <random>

#include "core/error.h"
#include "core/log.h"
#include "harmony/harmony.h"
#include "harmony/output_constraint.h"
#include "server/responses.h"
#include "server/server.h"

namespace mx::server {

using json = nlohmann::json;
using clock_t_ = std::chrono::steady_clock;

inline json error_body(const std::string& msg, const std::string& type, const std::string& param, int code) {
  return {{"error", {{"message", msg}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)}, {"code", code}}}};
}

inline void send_error(httplib::Response& res, int status, const std::string& msg, const std::string& type, const std::string& param = "") {
  res.status = status;
  res.set_content(error_body(msg, type, param, status).dump(), "application/json");
}

inline std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> ctr{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (ctr++ * 0x9E3779B97F4A7C15ull));
  return fmt::format("{}{:016x}", prefix, rng());
}

inline double secs(clock_t_::duration d) { return std::chrono::duration<double>(d).count(); }

// One generated choice of a request: its engine id, channel and the text state.
struct ChoiceState {
  int index = 0;
  int64_t id = 0;
  std::shared_ptr<runtime::Channel> ch = std::make_shared<runtime::Channel>();
  std::unique_ptr<harmony::StreamParser> parser;   // chat
  std::unique_ptr<IncrementalDecoder> dec;         // completions
  std::string content, reasoning;                  // full text (content: stop strings applied)
  size_t content_sent = 0;
  json tool_calls = json::array();
  std::string finish;                              // "" while running
  json logprobs = json::array();
  int completion_tokens = 0;
  int cached_tokens = 0;                           // prompt tokens the prefix cache served
  bool role_sent = false;                          // streaming chat: the role chunk went out
  std::vector<harmony::Event> pending;             // the forced prefix's events, sent with the first token
  bool stopped_by_string = false;
  // Completions' echo and prompt_logprobs: the choice's prompt and its log-probs (entry i: prompt token
  // i + 1), which come with the first token; streaming sends them in the choice's first chunk.
  std::vector<int32_t> prompt;
  std::vector<TokenLogprob> prompt_lp;
  bool head_sent = false;
  bool started = false;                 // its first token has come
};

// Structured output as the engine asks for it (one a choice): harmony/output_constraint.h.
class JsonOutput : public runtime::TokenConstraint {
 public:
  JsonOutput(std::shared_ptr<const harmony::JsonTokenMask> mask, std::shared_ptr<const harmony::JsonSchema> final_schema,
             std::shared_ptr<const harmony::ToolSchemas> tools, bool from_start, std::vector<int32_t> end_ids)
      : c_(std::move(mask), std::move(final_schema), std::move(tools), from_start, std::move(end_ids)) {}
  std::span<const uint64_t> allowed() override { return c_.allowed(); }
  void accept(int32_t token) override { c_.accept(token); }

 private:
  harmony::OutputConstraint c_;
};

struct Server::Impl {
  ServerOptions opt;
  httplib::Server http;
  int listen_fd = -1;  // the listening socket, captured to raise its backlog
  std::atomic<runtime::Engine*> engine{nullptr};
  std::shared_ptr<const Tokenizer> tok;
  std::vector<int32_t> eos_ids, chat_stop_ids;
  Metrics metrics;
  std::mutex json_mask_mu;
  std::shared_ptr<const harmony::JsonTokenMask> json_mask_;  // built at the first held request (~0.25 s)

  // The vocabulary sorted for structured output's walks.
  std::shared_ptr<const harmony::JsonTokenMask> json_mask() {
    std::lock_guard lk(json_mask_mu);
    if (!json_mask_) json_mask_ = std::make_shared<const harmony::JsonTokenMask>(tok);
    return json_mask_;
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (opt.api_key.empty()) return true;
    std::string h = req.get_header_value("Authorization");
    if (h == "Bearer " + opt.api_key) return true;
    send_error(res, 401, "invalid or missing API key", "authentication_error");
    return false;
  }

  void send_body_too_large(httplib::Response& res) const {
    send_error(res, 413, fmt::format("request body over {} bytes", opt.max_body_bytes), "invalid_request_error");
  }

  // Parses the body; answers and returns nullopt on any failure.
  std::optional<json> body_of(const httplib::Request& req, httplib::Response& res) {
    if (req.body.size() > opt.max_body_bytes) {
      send_body_too_large(res);
      return std::nullopt;
    }
    std::string ct = req.get_header_value("Content-Type");
    if (ct.find("application/json") == std::string::npos) {
      send_error(res, 400, "Content-Type must be application/json", "invalid_request_error");
      return std::nullopt;
    }
    json b = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (b.is_discarded()) {
      send_error(res, 400, "request body is not valid JSON", "invalid_request_error");
      return std::nullopt;
    }
    if (!b.is_object()) {
      send_error(res, 400, "request body must be a JSON object", "invalid_request_error");
      return std::nullopt;
    }
    if (b.contains("model") && b["model"].is_string() && !opt.model.contains(b["model"].get<std::string>())) {
      send_error(res, 404, fmt::format("The model `{}` does not exist.", b["model"].get<std::string>()), "not_found_error", "model");
      return std::nullopt;
    }
    return b;
  }

  // A served name's entry in /v1/models (max_model_len once the engine is up, as vLLM adds it).
  json model_object(const std::string& name) const {
    json m = {{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "mxserve"}};
    if (const runtime::Engine* e = engine.load()) m["max_model_len"] = e->max_model_len();
    return m;
  }

  runtime::Engine* ready_engine(httplib::Response& res) {
    runtime::Engine* e = engine.load();
    if (!e) send_error(res, 503, "the model is still loading", "service_unavailable");
    else if (e->draining()) send_error(res, 503, "the server is shutting down", "service_unavailable");
    return e && !e->draining() ? e : nullptr;
  }

  // /v1/completions' prompt as OpenAI takes it: a string, token ids, or a batch of either (each prompt's n
  // choices follow the one before's). Throws InvalidRequest naming 'prompt'.
  std::vector<std::vector<int32_t>> completion_prompts(const json& pr) const {
    auto ids_of = [&](const json& a) {
      std::vector<int32_t> ids;
      for (const auto& t : a) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok->vocab_size())
          throw InvalidRequest("prompt", "token id out of vocabulary");
        ids.push_back(t.get<int32_t>());
      }
      return ids;
    };
    std::vector<std::vector<int32_t>> out;
    if (pr.is_string()) {
      out.push_back(tok->encode(pr.get<std::string>(), false));
    } else if (pr.is_array() && !pr.empty() && pr[0].is_number_integer()) {
      out.push_back(ids_of(pr));
    } else if (pr.is_array() && !pr.empty() && (pr[0].is_string() || pr[0].is_array())) {
      for (const auto& x : pr) {
        if (x.is_string()) out.push_back(tok->encode(x.get<std::string>(), false));
        else if (x.is_array()) out.push_back(ids_of(x));
        else throw InvalidRequest("prompt", "a batch of prompts holds strings or lists of token ids");
      }
    } else {
      throw InvalidRequest("prompt", "'prompt' must be a string, a list of token ids, or a list of either");
    }
    for (const auto& x : out)
      if (x.empty()) throw InvalidRequest("prompt", "'prompt' must not be empty");
    return out;
  }

  // False (a 400 sent) when the prompt and the tokens asked for do not fit the context.
  bool fits_context(runtime::Engine& e, const std::vector<int32_t>& prompt, const CommonParams& p, httplib::Response& res) {
    const int limit = e.max_model_len();
    const int max_tokens = p.max_tokens < 0 ? limit - int(prompt.size()) : p.max_tokens;
    if (int(prompt.size()) + std::max(max_tokens, 1) <= limit) return true;
    send_error(res, 400,
               fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the "
                           "prompt, {} for the completion).",
                           limit, int(prompt.size()) + std::max(max_tokens, 1), prompt.size(), std::max(max_tokens, 1)),
               "invalid_request_error", p.max_tokens < 0 ? "messages" : "max_tokens");
    return false;
  }

  // Submits n choices of a prompt that fits_context passed; answers 429 and returns false if the queue is full.
  // `forced`: the prompt's last tokens, the start of a forced tool call (forced_tool_call_prefix): each
  // choice's parser reads them first, so the call's name is reported like a generated one.
  // `tools`: the calls whose arguments are held to their schemas (harmony::held_tool_schemas).
  // `index0`: the first choice's index (a batch of prompts: the prompt's position x n). A failure aborts
  // every choice already in `out`.
  bool submit(runtime::Engine& e, const std::vector<int32_t>& prompt, const CommonParams& p, bool chat,
              std::vector<std::unique_ptr<ChoiceState>>& out, httplib::Response& res,
              const std::vector<int32_t>& forced = {}, std::shared_ptr<const harmony::ToolSchemas> tools = nullptr,
              int index0 = 0) {
    const int max_tokens = p.max_tokens < 0 ? e.max_model_len() - int(prompt.size()) : std::max(p.max_tokens, 1);
    auto deadline = clock_t_::now() + std::chrono::milliseconds(int64_t(opt.request_timeout_s * 1000));
    for (int i = 0; i < p.n; ++i) {
      auto c = std::make_unique<ChoiceState>();
      c->index = index0 + i;
      if (chat) {
        c->parser = std::make_unique<harmony::StreamParser>(tok);
        for (int32_t t : forced)
          for (auto& h : c->parser->push(t)) c->pending.push_back(std::move(h));
      } else {
        c->dec = std::make_unique<IncrementalDecoder>(tok);
      }
      runtime::GenRequest g;
      g.prompt = prompt;
      g.prompt_logprobs = p.prompt_top();
      if (p.echo || p.prompt_logprobs >= 0) c->prompt = prompt;
      g.sampling = p.sampling;
      g.sampling.seed = p.sampling.seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;
      g.max_tokens = max_tokens;
      g.min_tokens = p.min_tokens;
      g.logit_bias = p.logit_bias;
      if (p.json_schema || tools) {
        auto held = std::make_shared<JsonOutput>(json_mask(), p.json_schema, tools, !chat, eos_ids);
        for (int32_t t : forced) held->accept(t);  // the prompt's forced call header, as if generated
        g.constraint = std::move(held);
      }
      if (!p.ignore_eos) g.stop_token_ids = chat ? chat_stop_ids : eos_ids;
      g.stop_token_ids.insert(g.stop_token_ids.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
      g.deadline = deadline;
      auto id = e.submit(std::move(g), c->ch);
      if (!id) {
        for (auto& o : out) e.abort(o->id);
        out.clear();
        send_error(res, e.draining() ? 503 : 429, e.draining() ? "the server is shutting down" : "too many requests waiting",
                   e.draining() ? "service_unavailable" : "rate_limit_error");
        return false;
      }
      c->id = *id;
      out.push_back(std::move(c));
    }
    return true;
  }

  // Appends content text honouring stop strings; returns the newly releasable delta.
  std::string add_content(ChoiceState& c, const std::string& text, const CommonParams& p, bool final) {
    c.content += text;
    size_t hold = 0;
    const bool may_stop = c.completion_tokens >= p.min_tokens;  // as vLLM: no stop string before min_tokens
    for (const auto& s : p.stop) {
      size_t from = c.content_sent > s.size() ? c.content_sent - s.size() : 0;
      size_t pos = may_stop ? c.content.find(s, from) : std::string::npos;
      if (pos != std::string::npos) {
        c.content.resize(pos + (p.include_stop_str ? s.size() : 0));
        c.stopped_by_string = true;
        final = true;
      }
      hold = std::max(hold, s.size() - 1);
    }
    size_t end = final ? c.content.size() : (c.content.size() > hold ? c.content.size() - hold : 0);
    // Never cut inside a UTF-8 character.
    while (end > c.content_sent && end < c.content.size() && (uint8_t(c.content[end]) & 0xC0) == 0x80) --end;
    if (end <= c.content_sent) return "";
    std::string d = c.content.substr(c.content_sent, end - c.content_sent);
    c.content_sent = end;
    return d;
  }

  json logprob_entry(int32_t tokid, const runtime::TokenEvent& ev) {
    json top = json::array();
    for (auto& [t, lp] : ev.top) top.push_back({{"token", tok->decode({t})}, {"logprob", lp}});
    return {{"token", tok->decode({tokid})}, {"logprob", ev.logprob}, {"top_logprobs", top}};
  }

  // Completions' logprobs in OpenAI's legacy shape: `entries` (logprob_entry's), after the echoed prompt's
  // tokens when `with_prompt` (its first token has no log-prob: null, as OpenAI and vLLM send it).
  json legacy_logprobs(const ChoiceState& c, const json& entries, bool with_prompt, int top) const {
    json toks = json::array(), lps = json::array(), tops = json::array();
    if (with_prompt && !c.prompt.empty()) {
      toks.push_back(tok->decode({c.prompt[0]}));
      lps.push_back(nullptr);
      tops.push_back(nullptr);
      for (const TokenLogprob& t : c.prompt_lp) {
        toks.push_back(tok->decode({t.token}));
        lps.push_back(t.logprob);
        json d = json::object();
        for (size_t k = 0; k < t.top.size() && int(k) < top; ++k) d[tok->decode({t.top[k].first})] = t.top[k].second;
        tops.push_back(d);
      }
    }
    for (const auto& l : entries) {
      toks.push_back(l["token"]);
      lps.push_back(l["logprob"]);
      json t = json::object();
      for (const auto& x : l["top_logprobs"]) t[x["token"].get<std::string>()] = x["logprob"];
      tops.push_back(t);
    }
    return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}};
  }

  // vLLM's prompt_logprobs: null for the first prompt token, then for each one a map from token id to
  // {logprob, rank, decoded_token}: the prompt's own token and the `top` best ids.
  json vllm_prompt_logprobs(const ChoiceState& c, int top) const {
    json out = json::array();
    if (c.prompt.empty()) return out;
    out.push_back(nullptr);
    auto entry = [&](float lp, int rank, int32_t id) { return json{{"logprob", lp}, {"rank", rank}, {"decoded_token", tok->decode({id})}}; };
    for (const TokenLogprob& t : c.prompt_lp) {
      json d = json::object();
      d[std::to_string(t.token)] = entry(t.logprob, t.rank, t.token);
      for (size_t k = 0; k < t.top.size() && int(k) < top; ++k)
        if (!d.contains(std::to_string(t.top[k].first)))
          d[std::to_string(t.top[k].first)] = entry(t.top[k].second, int(k) + 1, t.top[k].first);
      out.push_back(d);
    }
    return out;
  }

  // Feeds one engine event into a choice; returns the delta (chat: a delta object; completions:
  // {"text": ...}) or null when nothing is to be sent.
  json consume(runtime::Engine& e, ChoiceState& c, const runtime::TokenEvent& ev, const CommonParams& p, bool chat) {
    json delta = json::object();
    std::string content_delta, reasoning_delta;
    bool finishing = ev.finish != runtime::FinishReason::kNone;
    if (!ev.prompt_logprobs.empty()) c.prompt_lp = ev.prompt_logprobs;
    if (ev.token >= 0) c.started = true;
    if (ev.token >= 0 && p.score_only()) {  // the one token sampled is not part of the answer
      c.cached_tokens = ev.cached_tokens;
      if (c.finish.empty()) c.finish = "length";
      return delta;
    }
    if (ev.token >= 0) {
      ++c.completion_tokens;
      maybe_fault(c.completion_tokens);
      c.cached_tokens = ev.cached_tokens;
      // A request's own stop_token_ids end the text like a stop string: the token is not output (unless
      // include_stop_str_in_output); the model's own end tokens never are.
      const bool user_stop = ev.stop_token && std::find(chat_stop_ids.begin(), chat_stop_ids.end(), ev.token) == chat_stop_ids.end();
      const bool user_stop_kept = user_stop && p.include_stop_str &&
                                  std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), ev.token) != p.stop_token_ids.end();
      if (p.sampling.logprobs && (!ev.stop_token || user_stop_kept)) c.logprobs.push_back(logprob_entry(ev.token, ev));
      if (chat) {
        std::vector<harmony::Event> evs = std::move(c.pending);
        c.pending.clear();
        if (!user_stop || user_stop_kept)
          for (auto& h : c.parser->push(ev.token)) evs.push_back(std::move(h));
        if (finishing) {
          auto more = c.parser->finish();
          evs.insert(evs.end(), more.begin(), more.end());
        }
        for (auto& h : evs) {
          using K = harmony::Event::Kind;
          if (h.kind == K::kReasoning) {
            c.reasoning += h.text;
            reasoning_delta += h.text;
          } else if (h.kind == K::kContent) {
            if (!c.stopped_by_string) content_delta += add_content(c, h.text, p, false);
          } else if (h.kind == K::kToolCallBegin) {
            json tc = {{"id", random_id("call_")}, {"type", "function"}, {"function", {{"name", h.name}, {"arguments", ""}}}};
            c.tool_calls.push_back(tc);
            delta["tool_calls"].push_back({{"index", c.tool_calls.size() - 1}, {"id", tc["id"]}, {"type", "function"},
                                           {"function", {{"name", h.name}, {"arguments", ""}}}});
          } else if (h.kind == K::kToolCallArguments && !c.tool_calls.empty()) {
            c.tool_calls.back()["function"]["arguments"] = c.tool_calls.back()["function"]["arguments"].get<std::string>() + h.text;
            delta["tool_calls"].push_back({{"index", c.tool_calls.size() - 1}, {"function", {{"arguments", h.text}}}});
          }
        }
      } else if (!ev.stop_token || user_stop_kept) {
        content_delta += add_content(c, c.dec->push(ev.token), p, false);
      }
    }
    if (finishing) {
      if (!chat) content_delta += add_content(c, c.dec->flush(), p, false);
      content_delta += add_content(c, "", p, true);
    }
    if (c.stopped_by_string && c.finish.empty()) {
      e.abort(c.id);
      c.finish = "stop";
    } else if (finishing && c.finish.empty()) {
      c.finish = runtime::finish_reason_name(ev.finish);
      if (chat && c.parser->saw_tool_call_end() && !c.tool_calls.empty()) c.finish = "tool_calls";
    }
    if (!reasoning_delta.empty()) delta["reasoning_content"] = reasoning_delta;
    if (!content_delta.empty()) delta[chat ? "content" : "text"] = content_delta;
    return delta;
  }

  // ServerOptions::fault_after_tokens (tests).
  void maybe_fault(int tokens) const {
    if (opt.fault_after_tokens > 0 && tokens == opt.fault_after_tokens)
      throw std::runtime_error("injected fault (fault_after_tokens)");
  }

  // Every content provider runs its body here. An exception while generating (the parser, the
  // detokenizer, JSON) would otherwise escape cpp-httplib's writer and end the process; it ends this
  // request only: `abort` cancels its engine requests, the client gets `error_payload(message)` (an
  // error event or body: the status line is already out), and the connection closes.
  static bool guarded(httplib::DataSink& sink, const std::function<void()>& abort,
                      const std::function<std::string(const std::string&)>& error_payload,
                      const std::function<bool()>& body) {
    std::string msg;
    try {
      return body();
    } catch (const std::exception& ex) {
      msg = ex.what();
    } catch (...) {
      msg = "unknown error";
    }
    log::error("a request failed while generating: {}; it is aborted", msg);
    try {
      abort();
      const std::string payload = error_payload("internal error while generating: " + msg);
      if (sink.is_writable()) sink.write(payload.data(), payload.size());
      sink.done();
    } catch (...) {  // the client is gone or the abort failed: nothing more to tell
    }
    return false;
  }
  // Non-streaming bodies go out chunked so that a client that gives up is noticed: `alive()` writes a
  // space (leading JSON whitespace) once a second while tokens are generated, and a write to a closed
  // socket fails, which aborts the request like a dropped stream instead of running to max_tokens.
  static std::function<bool()> keepalive(httplib::DataSink& sink) {
    auto last = std::make_shared<clock_t_::time_point>(clock_t_::now());
    return [&sink, last] {
      if (clock_t_::now() - *last < std::chrono::seconds(1)) return true;
      *last = clock_t_::now();
      return sink.is_writable() && sink.write(" ", 1);
    };
  }
  // Then the body itself, when generation ran to its end (`ok`).
  static bool send_body(httplib::DataSink& sink, bool ok, const std::function<std::string()>& body) {
    if (ok) {
      const std::string b = body();
      ok = sink.write(b.data(), b.size());
    }
    sink.done();
    return ok;
  }
  // The error object of a failed generation, as a body or as an SSE data line.
  static std::string error_json(const std::string& msg) { return error_body(msg, "internal_error", "", 500).dump(); }

  // tool_choice required / named (chat form) with tools: the forced call's first tokens, appended to
  // the prompt (harmony::forced_tool_call_prefix); empty otherwise.
  std::vector<int32_t> forced_call(const json& tool_choice, const harmony::ChatRequest& cr) const {
    if (cr.tools.empty()) return {};
    const std::string pre = harmony::forced_tool_call_prefix(tool_choice);
    return pre.empty() ? std::vector<int32_t>{} : tok->encode(pre, /*allow_special=*/true);
  }

  void handle_generate(const httplib::Request& req, httplib::Response& res, bool chat);
  // responses.cpp
  ResponseStore responses;
  void handle_responses(const httplib::Request& req, httplib::Response& res);
  void handle_response_get(const httplib::Request& req, httplib::Response& res);
  void handle_response_delete(const httplib::Request& req, httplib::Response& res);
  void setup();
};

}  // namespace mx::server
