// POST /v1/responses, GET and DELETE /v1/responses/{id} (responses.h; event names and shapes follow
// OpenAI's Responses API reference).
#include "server/server_impl.h"

namespace mx::server {
namespace {

// One generation's state for the Responses API.
struct ResponseRun {
  std::string id = random_id("resp_");
  int64_t created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  ResponsesRequest req;
  int prompt_tokens = 0, output_tokens = 0, reasoning_tokens = 0, cached_tokens = 0;
  std::string finish;  // "" while running, else the engine's finish reason
};

json response_object(const ResponseRun& r, const std::string& model, const OutputBuilder* out) {
  json o = {{"id", r.id}, {"object", "response"}, {"created_at", r.created}, {"model", model}, {"error", nullptr},
            {"incomplete_details", nullptr}, {"output", json::array()}, {"usage", nullptr}};
  o.update(r.req.echo);
  if (!out) {
    o["status"] = "in_progress";
    return o;
  }
  o["output"] = out->items();
  o["output_text"] = out->text();
  if (r.finish == "length") {
    o["status"] = "incomplete";
    o["incomplete_details"] = {{"reason", "max_output_tokens"}};
  } else if (r.finish == "abort") {
    o["status"] = "failed";
    o["error"] = {{"code", "server_error"}, {"message", "the request was aborted (timeout or shutdown)"}};
  } else {
    o["status"] = "completed";
  }
  o["usage"] = {{"input_tokens", r.prompt_tokens},
                {"input_tokens_details", {{"cached_tokens", r.cached_tokens}}},
                {"output_tokens", r.output_tokens},
                {"output_tokens_details", {{"reasoning_tokens", r.reasoning_tokens}}},
                {"total_tokens", r.prompt_tokens + r.output_tokens}};
  return o;
}

}  // namespace

void Server::Impl::handle_responses(const httplib::Request& req, httplib::Response& res) {
  if (!authorized(req, res)) return;
  auto body = body_of(req, res);
  if (!body) return;
  auto run = std::make_shared<ResponseRun>();
  CommonParams p;
  std::vector<int32_t> prompt, forced;
  std::shared_ptr<const harmony::ToolSchemas> held_tools;
  runtime::Engine* e = nullptr;
  try {
    run->req = parse_responses_request(*body, responses);
    p = parse_common(run->req.chat_body, true, opt.limits);
    if (!(e = ready_engine(res))) return;
    harmony::ChatRequest cr = harmony::chat_request_from_json(run->req.chat_body);
    if (run->req.chat_body.value("tool_choice", json()) == "none") cr.tools = json::array();
    prompt = harmony::render_chat(cr, *tok).tokens;
    forced = forced_call(run->req.chat_body.value("tool_choice", json()), cr);
    prompt.insert(prompt.end(), forced.begin(), forced.end());
    held_tools = harmony::held_tool_schemas(cr.tools, run->req.chat_body.value("tool_choice", json()));
  } catch (const UnknownResponse& ex) {
    send_error(res, 404, ex.what(), "not_found_error", "previous_response_id");
    return;
  } catch (const InvalidRequest& ex) {
    // The chat form's parameter names map back to the request's (max_tokens is max_output_tokens).
    std::string param = ex.param() == "max_tokens" ? "max_output_tokens" : ex.param();
    for (const char* chat_form : {"response_format.json_schema", "response_format"})  // text.format's fields
      if (param.rfind(chat_form, 0) == 0) {
        param = "text.format" + param.substr(std::string(chat_form).size());
        break;
      }
    if (const size_t f = param.find("].function."); param.rfind("tools[", 0) == 0 && f != std::string::npos)
      param.erase(f + 1, 9);  // tools[i].function.parameters -> tools[i].parameters
    send_error(res, 400, ex.what(), "invalid_request_error", param);
    return;
  } catch (const std::exception& ex) {
    send_error(res, 400, ex.what(), "invalid_request_error");
    return;
  }
  std::vector<std::unique_ptr<ChoiceState>> choices;
  if (!fits_context(*e, prompt, p, res) || !submit(*e, prompt, p, true, choices, res, forced, held_tools)) return;
  auto c = std::shared_ptr<ChoiceState>(std::move(choices.front()));
  run->prompt_tokens = int(prompt.size());
  const auto t0 = clock_t_::now();

  // Drives the generation: each engine event through the parser into `out`; false once `alive`
  // says the client is gone (the request is then aborted).
  auto drive = [this, e, c, run, t0](OutputBuilder& out, const std::function<bool()>& alive) {
    auto last = t0;
    const auto hard_end = t0 + std::chrono::milliseconds(int64_t(opt.request_timeout_s * 1000) + 5000);
    bool first = true;
    while (run->finish.empty()) {
      for (auto& ev : c->ch->pop(std::chrono::milliseconds(50))) {
        for (auto& h : c->pending) out.event(h);  // a forced call's start
        c->pending.clear();
        if (ev.token >= 0) {
          const auto now = clock_t_::now();
          if (first) metrics.ttft(secs(now - t0)); else metrics.itl(secs(now - last));
          first = false;
          last = now;
          ++run->output_tokens;
          maybe_fault(run->output_tokens);
          run->cached_tokens = ev.cached_tokens;
          bool reasoning = false;
          for (auto& h : c->parser->push(ev.token)) {
            reasoning |= h.kind == harmony::Event::Kind::kReasoning;
            out.event(h);
          }
          run->reasoning_tokens += reasoning;
        }
        if (ev.finish != runtime::FinishReason::kNone) {
          for (auto& h : c->parser->finish()) out.event(h);
          out.close();
          run->finish = runtime::finish_reason_name(ev.finish);
          break;
        }
      }
      if (!alive()) {
        e->abort(c->id);
        return false;
      }
      if (run->finish.empty() && clock_t_::now() > hard_end) {  // the engine should have aborted; never hang
        e->abort(c->id);
        out.close();
        run->finish = "abort";
      }
    }
    metrics.e2e(secs(clock_t_::now() - t0));
    return true;
  };
  auto abort = [e, c] { e->abort(c->id); };
  auto finish_and_store = [this, run](const OutputBuilder& out) {
    json o = response_object(*run, opt.model.primary, &out);
    if (run->req.store) {
      json messages = run->req.messages;
      messages.push_back(output_as_message(out.items()));
      responses.put(run->id, {o, messages});
    }
    return o;
  };

  if (!run->req.stream) {
    res.set_chunked_content_provider("application/json", [=](size_t, httplib::DataSink& sink) {
      return guarded(sink, abort, error_json, [&] {
        OutputBuilder out(nullptr);
        const bool ok = drive(out, keepalive(sink));
        return send_body(sink, ok, [&] { return finish_and_store(out).dump(-1, ' ', false, json::error_handler_t::replace); });
      });
    });
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [=, this](size_t, httplib::DataSink& sink) {
    auto seq = std::make_shared<int>(0);  // the next sequence_number, for an error event
    auto error_event = [seq](const std::string& m) {
      json ev = {{"type", "error"}, {"code", "server_error"}, {"message", m}, {"param", nullptr}, {"sequence_number", *seq}};
      return "event: error\ndata: " + ev.dump() + "\n\n";
    };
    return guarded(sink, abort, error_event, [&] {
      bool ok = true;
      auto send = [&](const json& ev) {
        *seq = ev["sequence_number"].get<int>() + 1;
        if (!ok) return;
        std::string s = "event: " + ev["type"].get<std::string>() + "\ndata: " +
                        ev.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
        ok = sink.is_writable() && sink.write(s.data(), s.size());
      };
      OutputBuilder out([&](json ev) { send(ev); });
      out.send({{"type", "response.created"}, {"response", response_object(*run, opt.model.primary, nullptr)}});
      out.send({{"type", "response.in_progress"}, {"response", response_object(*run, opt.model.primary, nullptr)}});
      if (drive(out, [&] { return ok; }) && ok) {
        json o = finish_and_store(out);
        const std::string status = o["status"];
        out.send({{"type", status == "completed" ? "response.completed" : status == "failed" ? "response.failed" : "response.incomplete"},
                  {"response", o}});
      }
      sink.done();
      return ok;
    });
  });
}

void Server::Impl::handle_response_get(const httplib::Request& req, httplib::Response& res) {
  if (!authorized(req, res)) return;
  auto e = responses.get(req.matches[1]);
  if (!e) return send_error(res, 404, fmt::format("Response with id '{}' not found.", req.matches[1].str()), "not_found_error", "response_id");
  res.set_content(e->response.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void Server::Impl::handle_response_delete(const httplib::Request& req, httplib::Response& res) {
  if (!authorized(req, res)) return;
  const std::string id = req.matches[1];
  if (!responses.erase(id)) return send_error(res, 404, fmt::format("Response with id '{}' not found.", id), "not_found_error", "response_id");
  res.set_content(json{{"id", id}, {"object", "response"}, {"deleted", true}}.dump(), "application/json");
}

}  // namespace mx::server
