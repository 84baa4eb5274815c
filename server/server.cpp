#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "server/server_impl.h"
#include "tokenizer/byte_level.h"

namespace mx::server {

void Server::Impl::handle_generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  if (!authorized(req, res)) return;
  auto body = body_of(req, res);
  if (!body) return;
  CommonParams p;
  std::vector<std::vector<int32_t>> prompts;  // chat: one; completions: OpenAI's batch of prompts
  std::vector<int32_t> forced;
  std::shared_ptr<const harmony::ToolSchemas> held_tools;
  runtime::Engine* e = nullptr;
  try {
    p = parse_common(*body, chat, opt.limits);
    for (int32_t t : p.stop_token_ids)
      if (t >= tok->vocab_size()) throw InvalidRequest("stop_token_ids", fmt::format("stop token id {} is out of vocabulary", t));
    for (const LogitBias& b : p.logit_bias)
      if (b.id >= tok->vocab_size()) throw InvalidRequest("logit_bias", fmt::format("token id {} is out of vocabulary", b.id));
    if (!(e = ready_engine(res))) return;
    if (chat) {
      harmony::ChatRequest cr = harmony::chat_request_from_json(*body);
      if (body->contains("tool_choice") && (*body)["tool_choice"] == "none") cr.tools = json::array();
      std::vector<int32_t> prompt = harmony::render_chat(cr, *tok).tokens;
      forced = forced_call(body->value("tool_choice", json()), cr);
      prompt.insert(prompt.end(), forced.begin(), forced.end());
      prompts.push_back(std::move(prompt));
      held_tools = harmony::held_tool_schemas(cr.tools, body->value("tool_choice", json()));
    } else {
      if (!body->contains("prompt")) throw InvalidRequest("prompt", "'prompt' is required");
      prompts = completion_prompts((*body)["prompt"]);
      if (int(prompts.size()) * p.n > opt.limits.max_choices)
        throw InvalidRequest("prompt", fmt::format("{} prompts x n = {} choices: at most {} a request", prompts.size(),
                                                   int(prompts.size()) * p.n, opt.limits.max_choices));
    }
  } catch (const InvalidRequest& ex) {
    send_error(res, 400, ex.what(), "invalid_request_error", ex.param());
    return;
  } catch (const std::exception& ex) {
    send_error(res, 400, ex.what(), "invalid_request_error");
    return;
  }
  auto choices = std::make_shared<std::vector<std::unique_ptr<ChoiceState>>>();
  for (const auto& prompt : prompts)  // every length before any submit: a 400 submits nothing
    if (!fits_context(*e, prompt, p, res)) return;
  for (size_t i = 0; i < prompts.size(); ++i)
    if (!submit(*e, prompts[i], p, chat, *choices, res, forced, held_tools, int(i) * p.n)) return;
  const auto t0 = clock_t_::now();
  const std::string id = random_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  int prompt_tokens = 0;
  for (const auto& prompt : prompts) prompt_tokens += int(prompt.size());
  const std::string object = chat ? "chat.completion" : "text_completion";

  auto usage = [choices, prompt_tokens, n = p.n] {
    int ct = 0, cached = 0;
    for (auto& c : *choices) {
      ct += c->completion_tokens;
      // Each prompt is counted once, so its cache hit is its first choice's (the others run the same
      // prompt as separate engine requests).
      if (c->index % n == 0) cached += c->cached_tokens;
    }
    return json{{"prompt_tokens", prompt_tokens}, {"completion_tokens", ct}, {"total_tokens", prompt_tokens + ct},
                {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  };
  auto abort_all = [e, choices] {
    for (auto& c : *choices) e->abort(c->id);
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
        // Several choices are polled in turn: a pass over idle ones stays near 50 ms however many there are.
        const int wait_ms = choices->size() > 1 ? std::clamp(50 / int(choices->size()), 1, 5) : 50;
        for (auto& ev : c->ch->pop(std::chrono::milliseconds(wait_ms))) {
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
      json out = {{"id", id}, {"object", object}, {"created", created}, {"model", opt.model.primary}, {"choices", json::array()}};
      for (auto& c : *choices) {
        json ch = {{"index", c->index}, {"finish_reason", c->finish}};
        json lp = p.sampling.logprobs ? json{{"content", c->logprobs}} : json(nullptr);
        if (chat) {
          json msg = {{"role", "assistant"}, {"content", c->content}, {"reasoning_content", c->reasoning}};
          if (!c->tool_calls.empty()) msg["tool_calls"] = c->tool_calls;
          ch["message"] = msg;
          ch["logprobs"] = lp;
        } else {
          ch["text"] = p.echo ? tok->decode(c->prompt) + c->content : c->content;
          ch["logprobs"] = p.sampling.logprobs
                               ? legacy_logprobs(*c, c->logprobs, p.echo, p.sampling.top_logprobs)
                               : json(nullptr);
        }
        if (p.prompt_logprobs >= 0) ch["prompt_logprobs"] = vllm_prompt_logprobs(*c, p.prompt_logprobs);
        out["choices"].push_back(ch);
      }
      out["usage"] = usage();
      return out.dump(-1, ' ', false, json::error_handler_t::replace);
    };
    res.set_chunked_content_provider("application/json", [=](size_t, httplib::DataSink& sink) {
      return guarded(sink, abort_all, error_json, [&] {
        auto alive = keepalive(sink);
        return send_body(sink, drive([&](ChoiceState&, json&) { return alive(); }), full_body);
      });
    });
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [=, this](size_t, httplib::DataSink& sink) {
    return guarded(sink, abort_all, [](const std::string& m) { return "data: " + error_json(m) + "\n\n"; }, [&] {
      auto send = [&](const json& j) {
        std::string s = "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
        return sink.is_writable() && sink.write(s.data(), s.size());
      };
      auto chunk = [&](json choice) {
        json j = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                  {"model", opt.model.primary}, {"choices", json::array({choice})}};
        if (p.include_usage && p.continuous_usage) j["usage"] = usage();  // as vLLM: the counts so far
        return j;
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
        // The choice's first chunk after its first token holds the echoed prompt and its log-probs.
        const bool head = !c.head_sent && c.started && (p.echo || p.prompt_logprobs >= 0);
        if (d.empty() && !fin && !head) return true;
        c.head_sent |= head;
        json ch = {{"index", c.index}, {"finish_reason", fin ? json(c.finish) : json(nullptr)}};
        if (chat) ch["delta"] = d;
        else ch["text"] = (head && p.echo ? tok->decode(c.prompt) : std::string()) + d.value("text", "");
        const json last = c.logprobs.empty() ? json::array() : json::array({c.logprobs.back()});
        if (!p.sampling.logprobs || (c.logprobs.empty() && !(head && p.echo))) ch["logprobs"] = nullptr;
        else if (chat) ch["logprobs"] = {{"content", last}};
        else ch["logprobs"] = legacy_logprobs(c, last, head && p.echo, p.sampling.top_logprobs);
        if (head && p.prompt_logprobs >= 0) ch["prompt_logprobs"] = vllm_prompt_logprobs(c, p.prompt_logprobs);
        return send(chunk(ch));
      });
      if (ok && p.include_usage) {
        json u = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                  {"model", opt.model.primary}, {"choices", json::array()}, {"usage", usage()}};
        ok = send(u);
      }
      if (ok) {
        std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
      }
      sink.done();
      return ok;
    });
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
  // Errors httplib answers itself (no route, a body over the limit, an unreadable request) get the API's
  // error body too, so a client always finds `error.message`; answers that have a body keep it.
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404)
      send_error(res, 404, fmt::format("no route for {} {}", req.method, req.path), "not_found_error");
    else if (res.status == 413)
      send_body_too_large(res);
    else
      send_error(res, res.status, fmt::format("the request could not be read (HTTP {}): malformed, or its headers or URI too long", res.status),
                 res.status >= 500 ? "internal_error" : "invalid_request_error");
    return httplib::Server::HandlerResponse::Handled;
  }));
  // Liveness, no key needed: /health, and vLLM's alias /ping (SageMaker's, GET or POST); its version probe too.
  auto alive = [](const httplib::Request&, httplib::Response& res) { res.set_content("{\"status\":\"ok\"}", "application/json"); };
  http.Get("/health", alive);
  http.Get("/ping", alive);
  http.Post("/ping", alive);
  http.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(json{{"version", MXSERVE_VERSION}}.dump(), "application/json");
  });
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
    res.set_content(metrics.text(opt.model.primary, e ? e->stats() : runtime::EngineStats{}), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    json data = json::array();  // every served name, as vLLM lists them: the primary first
    for (const std::string& name : opt.model.all()) data.push_back(model_object(name));
    res.set_content(json{{"object", "list"}, {"data", data}}.dump(), "application/json");
  });
  // OpenAI's retrieve (`client.models.retrieve(id)`); the id may hold '/' (an HF id as the served name).
  http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    const std::string id = req.matches[1];
    if (!opt.model.contains(id)) {
      send_error(res, 404, fmt::format("The model `{}` does not exist.", id), "not_found_error", "model");
      return;
    }
    res.set_content(model_object(id).dump(), "application/json");
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_generate(q, r, true); });
  http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_generate(q, r, false); });
  http.Post("/v1/responses", [this](const httplib::Request& q, httplib::Response& r) { handle_responses(q, r); });
  http.Get(R"(/v1/responses/([A-Za-z0-9_\-]+))", [this](const httplib::Request& q, httplib::Response& r) { handle_response_get(q, r); });
  http.Delete(R"(/v1/responses/([A-Za-z0-9_\-]+))", [this](const httplib::Request& q, httplib::Response& r) { handle_response_delete(q, r); });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    auto body = body_of(req, res);
    if (!body || !ready_engine(res)) return;
    try {
      std::vector<int32_t> ids;
      if (body->contains("messages")) ids = harmony::render_chat(harmony::chat_request_from_json(*body), *tok).tokens;
      else if (body->contains("prompt") && (*body)["prompt"].is_string()) ids = tok->encode((*body)["prompt"].get<std::string>(), false);
      else throw InvalidRequest("prompt", "'prompt' (string) or 'messages' is required");
      json out = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine.load()->max_model_len()}};
      if (body->contains("return_token_strs") && !(*body)["return_token_strs"].is_null()) {
        if (!(*body)["return_token_strs"].is_boolean())
          throw InvalidRequest("return_token_strs", "'return_token_strs' must be a boolean");
        if ((*body)["return_token_strs"].get<bool>()) {  // vLLM's: each token as the vocabulary writes it
          json strs = json::array();
          for (int32_t id : ids)
            strs.push_back(tok->is_special(id) ? tok->token_bytes(id) : mx::tok::byte_level_text(tok->token_bytes(id)));
          out["token_strs"] = strs;
        }
      }
      res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
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
