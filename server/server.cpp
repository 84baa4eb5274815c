#include "server/server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>

#include "core/error.h"
#include "core/log.h"
#include "harmony/harmony.h"

namespace mx::server {
namespace {

using json = nlohmann::json;
using clock_t_ = std::chrono::steady_clock;

json error_body(const std::string& msg, const std::string& type, const std::string& param, int code) {
  return {{"error", {{"message", msg}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)}, {"code", code}}}};
}

void send_error(httplib::Response& res, int status, const std::string& msg, const std::string& type, const std::string& param = "") {
  res.status = status;
  res.set_content(error_body(msg, type, param, status).dump(), "application/json");
}

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> ctr{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (ctr++ * 0x9E3779B97F4A7C15ull));
  return fmt::format("{}{:016x}", prefix, rng());
}

double secs(clock_t_::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

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
  bool stopped_by_string = false;
};

struct Server::Impl {
  ServerOptions opt;
  httplib::Server http;
  int listen_fd = -1;  // the listening socket, captured to raise its backlog
  std::atomic<runtime::Engine*> engine{nullptr};
  std::shared_ptr<const Tokenizer> tok;
  std::vector<int32_t> eos_ids, chat_stop_ids;
  Metrics metrics;

  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (opt.api_key.empty()) return true;
    std::string h = req.get_header_value("Authorization");
    if (h == "Bearer " + opt.api_key) return true;
    send_error(res, 401, "invalid or missing API key", "authentication_error");
    return false;
  }

  // Parses the body; answers and returns nullopt on any failure.
  std::optional<json> body_of(const httplib::Request& req, httplib::Response& res) {
    if (req.body.size() > opt.max_body_bytes) {
      send_error(res, 413, fmt::format("request body over {} bytes", opt.max_body_bytes), "invalid_request_error");
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
    if (b.contains("model") && b["model"].is_string() && b["model"] != opt.model_name) {
      send_error(res, 404, fmt::format("The model `{}` does not exist.", b["model"].get<std::string>()), "not_found_error", "model");
      return std::nullopt;
    }
    return b;
  }

  runtime::Engine* ready_engine(httplib::Response& res) {
    runtime::Engine* e = engine.load();
    if (!e) send_error(res, 503, "the model is still loading", "service_unavailable");
    else if (e->draining()) send_error(res, 503, "the server is shutting down", "service_unavailable");
    return e && !e->draining() ? e : nullptr;
  }

  // Submits n choices; answers 429 and returns false if the queue is full.
  bool submit(runtime::Engine& e, const std::vector<int32_t>& prompt, const CommonParams& p, bool chat,
              std::vector<std::unique_ptr<ChoiceState>>& out, httplib::Response& res) {
    int limit = e.max_model_len();
    int max_tokens = p.max_tokens < 0 ? limit - int(prompt.size()) : p.max_tokens;
    if (int(prompt.size()) + std::max(max_tokens, 1) > limit) {
      send_error(res, 400,
                 fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the "
                             "prompt, {} for the completion).",
                             limit, int(prompt.size()) + std::max(max_tokens, 1), prompt.size(), std::max(max_tokens, 1)),
                 "invalid_request_error", p.max_tokens < 0 ? "messages" : "max_tokens");
      return false;
    }
    auto deadline = clock_t_::now() + std::chrono::milliseconds(int64_t(opt.request_timeout_s * 1000));
    for (int i = 0; i < p.n; ++i) {
      auto c = std::make_unique<ChoiceState>();
      c->index = i;
      if (chat) c->parser = std::make_unique<harmony::StreamParser>(tok);
      else c->dec = std::make_unique<IncrementalDecoder>(tok);
      runtime::GenRequest g;
      g.prompt = prompt;
      g.sampling = p.sampling;
      g.sampling.seed = p.sampling.seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;
      g.max_tokens = max_tokens;
      g.stop_token_ids = chat ? chat_stop_ids : eos_ids;
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
    for (const auto& s : p.stop) {
      size_t from = c.content_sent > s.size() ? c.content_sent - s.size() : 0;
      size_t pos = c.content.find(s, from);
      if (pos != std::string::npos) {
        c.content.resize(pos);
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

  // Feeds one engine event into a choice; returns the delta (chat: a delta object; completions:
  // {"text": ...}) or null when nothing is to be sent.
  json consume(runtime::Engine& e, ChoiceState& c, const runtime::TokenEvent& ev, const CommonParams& p, bool chat) {
    json delta = json::object();
    std::string content_delta, reasoning_delta;
    bool finishing = ev.finish != runtime::FinishReason::kNone;
    if (ev.token >= 0) {
      ++c.completion_tokens;
      c.cached_tokens = ev.cached_tokens;
      if (p.sampling.logprobs && !ev.stop_token) c.logprobs.push_back(logprob_entry(ev.token, ev));
      // A request's own stop_token_ids end the text like a stop string: the token is not output.
      bool user_stop = ev.stop_token && std::find(chat_stop_ids.begin(), chat_stop_ids.end(), ev.token) == chat_stop_ids.end();
      if (chat) {
        std::vector<harmony::Event> evs;
        if (!user_stop) evs = c.parser->push(ev.token);
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
      } else if (!ev.stop_token) {
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

  void handle_generate(const httplib::Request& req, httplib::Response& res, bool chat);
  void setup();
};

void Server::Impl::handle_generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  if (!authorized(req, res)) return;
  auto body = body_of(req, res);
  if (!body) return;
  CommonParams p;
  std::vector<int32_t> prompt;
  runtime::Engine* e = nullptr;
  try {
    p = parse_common(*body, chat, opt.limits);
    for (int32_t t : p.stop_token_ids)
      if (t >= tok->vocab_size()) throw InvalidRequest("stop_token_ids", fmt::format("stop token id {} is out of vocabulary", t));
    if (!(e = ready_engine(res))) return;
    if (chat) {
      harmony::ChatRequest cr = harmony::chat_request_from_json(*body);
      if (body->contains("tool_choice") && (*body)["tool_choice"] == "none") cr.tools = json::array();
      prompt = harmony::render_chat(cr, *tok).tokens;
    } else {
      if (!body->contains("prompt")) throw InvalidRequest("prompt", "'prompt' is required");
      const json& pr = (*body)["prompt"];
      if (pr.is_string()) {
        prompt = tok->encode(pr.get<std::string>(), false);
      } else if (pr.is_array() && !pr.empty() && pr[0].is_number_integer()) {
        for (const auto& t : pr) {
          if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok->vocab_size())
            throw InvalidRequest("prompt", "token id out of vocabulary");
          prompt.push_back(t.get<int32_t>());
        }
      } else if (pr.is_array() && pr.size() == 1 && pr[0].is_string()) {
        prompt = tok->encode(pr[0].get<std::string>(), false);
      } else {
        throw InvalidRequest("prompt", "'prompt' must be a string, a list of one string, or a list of token ids");
      }
      if (prompt.empty()) throw InvalidRequest("prompt", "'prompt' must not be empty");
    }
  } catch (const InvalidRequest& ex) {
    send_error(res, 400, ex.what(), "invalid_request_error", ex.param());
    return;
  } catch (const std::exception& ex) {
    send_error(res, 400, ex.what(), "invalid_request_error");
    return;
  }
  auto choices = std::make_shared<std::vector<std::unique_ptr<ChoiceState>>>();
  if (!submit(*e, prompt, p, chat, *choices, res)) return;
  const auto t0 = clock_t_::now();
  const std::string id = random_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const int prompt_tokens = int(prompt.size());
  const std::string object = chat ? "chat.completion" : "text_completion";

  auto usage = [choices, prompt_tokens] {
    int ct = 0;
    for (auto& c : *choices) ct += c->completion_tokens;
    // The prompt is counted once, so its cache hit is the first choice's (the others run the same
    // prompt as separate engine requests).
    return json{{"prompt_tokens", prompt_tokens}, {"completion_tokens", ct}, {"total_tokens", prompt_tokens + ct},
                {"prompt_tokens_details", {{"cached_tokens", choices->front()->cached_tokens}}}};
  };
  // Drives all choices until finished; `on_delta(choice, delta)` returns false if the client is gone.
  auto drive = [this, e, choices, p, chat, t0](const std::function<bool(ChoiceState&, json&)>& on_delta) {
    bool first = true;
    auto last = t0;
    auto hard_end = t0 + std::chrono::milliseconds(int64_t(opt.request_timeout_s * 1000) + 5000);
    for (;;) {
      bool all_done = true;
      for (auto& c : *choices) {
        if (!c->finish.empty()) continue;
        all_done = false;
        for (auto& ev : c->ch->pop(std::chrono::milliseconds(choices->size() > 1 ? 5 : 50))) {
          if (!c->finish.empty()) break;
          if (ev.token >= 0) {
            auto now = clock_t_::now();
            if (first) metrics.ttft(secs(now - t0)); else metrics.itl(secs(now - last));
            first = false;
            last = now;
          }
          json d = consume(*e, *c, ev, p, chat);
          if (!on_delta(*c, d)) {
            for (auto& o : *choices) e->abort(o->id);
            return false;
          }
        }
      }
      if (all_done) break;
      if (clock_t_::now() > hard_end) {  // the engine should have aborted by now; never hang
        for (auto& c : *choices) { e->abort(c->id); if (c->finish.empty()) c->finish = "abort"; }
        break;
      }
    }
    metrics.e2e(secs(clock_t_::now() - t0));
    return true;
  };

  if (!p.stream) {
    auto full_body = [=, this] {
      json out = {{"id", id}, {"object", object}, {"created", created}, {"model", opt.model_name}, {"choices", json::array()}};
      for (auto& c : *choices) {
        json ch = {{"index", c->index}, {"finish_reason", c->finish}};
        json lp = p.sampling.logprobs ? json{{"content", c->logprobs}} : json(nullptr);
        if (chat) {
          json msg = {{"role", "assistant"}, {"content", c->content}, {"reasoning_content", c->reasoning}};
          if (!c->tool_calls.empty()) msg["tool_calls"] = c->tool_calls;
          ch["message"] = msg;
          ch["logprobs"] = lp;
        } else {
          ch["text"] = c->content;
          if (p.sampling.logprobs) {
            json toks = json::array(), lps = json::array(), tops = json::array();
            for (auto& l : c->logprobs) {
              toks.push_back(l["token"]);
              lps.push_back(l["logprob"]);
              json t = json::object();
              for (auto& x : l["top_logprobs"]) t[x["token"].get<std::string>()] = x["logprob"];
              tops.push_back(t);
            }
            ch["logprobs"] = {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}};
          } else {
            ch["logprobs"] = nullptr;
          }
        }
        out["choices"].push_back(ch);
      }
      out["usage"] = usage();
      return out.dump(-1, ' ', false, json::error_handler_t::replace);
    };
    // Sent chunked so a client that gives up is noticed: while tokens are generated a space
    // (valid leading JSON whitespace) goes out every second, and a write to a closed socket
    // fails, which aborts the request like a dropped stream instead of running to max_tokens.
    res.set_chunked_content_provider("application/json", [=](size_t, httplib::DataSink& sink) {
      auto last = clock_t_::now();
      bool ok = drive([&](ChoiceState&, json&) {
        if (clock_t_::now() - last < std::chrono::seconds(1)) return true;
        last = clock_t_::now();
        return sink.is_writable() && sink.write(" ", 1);
      });
      if (ok) {
        std::string b = full_body();
        ok = sink.write(b.data(), b.size());
      }
      sink.done();
      return ok;
    });
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [=, this](size_t, httplib::DataSink& sink) {
    auto send = [&](const json& j) {
      std::string s = "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
      return sink.is_writable() && sink.write(s.data(), s.size());
    };
    auto chunk = [&](json choice) {
      return json{{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                  {"model", opt.model_name}, {"choices", json::array({choice})}};
    };
    // The role chunk goes out with a choice's first sampled token, not at accept time: clients
    // and benchmarks time the first token from the first chunk with choices (api.md 1.4).
    bool ok = drive([&](ChoiceState& c, json& d) {
      if (chat && !c.role_sent) {
        c.role_sent = true;
        if (!send(chunk({{"index", c.index}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}})))
          return false;
      }
      bool fin = !c.finish.empty();
      if (d.empty() && !fin) return true;
      json ch = {{"index", c.index}, {"finish_reason", fin ? json(c.finish) : json(nullptr)}};
      if (chat) ch["delta"] = d;
      else ch["text"] = d.value("text", "");
      if (p.sampling.logprobs && !c.logprobs.empty()) ch["logprobs"] = {{"content", json::array({c.logprobs.back()})}};
      else ch["logprobs"] = nullptr;
      return send(chunk(ch));
    });
    if (ok && p.include_usage) {
      json u = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                {"model", opt.model_name}, {"choices", json::array()}, {"usage", usage()}};
      ok = send(u);
    }
    if (ok) {
      std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
    }
    sink.done();
    return ok;
  });
}

void Server::Impl::setup() {
  http.set_payload_max_length(opt.max_body_bytes);
  http.set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = int(sock);  // the last socket created is the one that binds
  });
  if (opt.http_threads > 0) {
    const size_t n = size_t(opt.http_threads);
    http.new_task_queue = [n] { return new httplib::ThreadPool(n); };
  }
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try { std::rethrow_exception(ep); } catch (const std::exception& e) { msg = e.what(); } catch (...) {}
    send_error(res, 500, msg, "internal_error");
  });
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("{\"status\":\"ok\"}", "application/json"); });
  http.Get("/ready", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    runtime::Engine* e = engine.load();
    bool ok = e && e->ready() && !e->draining();
    res.status = ok ? 200 : 503;
    res.set_content(ok ? "{\"status\":\"ready\"}" : "{\"status\":\"not ready\"}", "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    runtime::Engine* e = engine.load();
    res.set_content(metrics.text(opt.model_name, e ? e->stats() : runtime::EngineStats{}), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    runtime::Engine* e = engine.load();
    json m = {{"id", opt.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "mxserve"}};
    if (e) m["max_model_len"] = e->max_model_len();
    res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(), "application/json");
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_generate(q, r, true); });
  http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_generate(q, r, false); });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    auto body = body_of(req, res);
    if (!body || !ready_engine(res)) return;
    try {
      std::vector<int32_t> ids;
      if (body->contains("messages")) ids = harmony::render_chat(harmony::chat_request_from_json(*body), *tok).tokens;
      else if (body->contains("prompt") && (*body)["prompt"].is_string()) ids = tok->encode((*body)["prompt"].get<std::string>(), false);
      else throw InvalidRequest("prompt", "'prompt' (string) or 'messages' is required");
      res.set_content(json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine.load()->max_model_len()}}.dump(), "application/json");
    } catch (const InvalidRequest& ex) {
      send_error(res, 400, ex.what(), "invalid_request_error", ex.param());
    }
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    auto body = body_of(req, res);
    if (!body || !ready_engine(res)) return;
    const json& t = body->value("tokens", json());
    std::vector<int32_t> ids;
    if (t.is_array())
      for (const auto& x : t) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tok->vocab_size()) {
          send_error(res, 400, "token id out of vocabulary", "invalid_request_error", "tokens");
          return;
        }
        ids.push_back(x.get<int32_t>());
      }
    else return send_error(res, 400, "'tokens' must be a list of token ids", "invalid_request_error", "tokens");
    res.set_content(json{{"prompt", tok->decode(ids)}}.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  });
}

Server::Server(const ServerOptions& opt) : impl_(std::make_unique<Impl>()) {
  impl_->opt = opt;
  impl_->setup();
}
Server::~Server() = default;

void Server::attach(runtime::Engine* engine, std::shared_ptr<const Tokenizer> tok, std::vector<int32_t> eos_ids) {
  impl_->tok = std::move(tok);
  impl_->eos_ids = std::move(eos_ids);
  impl_->chat_stop_ids = harmony::stop_token_ids(*impl_->tok);
  impl_->engine.store(engine);
}

bool Server::bind() {
  if (impl_->opt.port == 0) port_ = impl_->http.bind_to_any_port(impl_->opt.host);
  else port_ = impl_->http.bind_to_port(impl_->opt.host, impl_->opt.port) ? impl_->opt.port : -1;
  // cpp-httplib (as built by Debian) listens with a backlog of 5: a burst of connections overflows
  // it and each dropped client retries after 1 s. Listening again on the socket raises the backlog.
  if (port_ > 0 && impl_->listen_fd >= 0 && ::listen(impl_->listen_fd, SOMAXCONN) != 0)
    log::warn("could not raise the listen backlog: {}", std::strerror(errno));
  return port_ > 0;
}
void Server::listen() { impl_->http.listen_after_bind(); }
void Server::stop() { impl_->http.stop(); }

}  // namespace mx::server
