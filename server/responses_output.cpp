// Output items of a response from harmony events, and their stream events (responses.h).
#include "server/server_impl.h"

namespace mx::server {

void OutputBuilder::event(const harmony::Event& h) {
  using K = harmony::Event::Kind;
  switch (h.kind) {
    case K::kReasoning:
      open("reasoning");
      append(h.text, "response.reasoning_text.delta");
      break;
    case K::kContent:
      open("message");
      append(h.text, "response.output_text.delta");
      break;
    case K::kToolCallBegin:
      close();
      open("function_call", h.name);
      break;
    case K::kToolCallArguments:
      if (!open_ || kind() != "function_call") open("function_call", "");
      append(h.text, "response.function_call_arguments.delta");
      break;
    case K::kToolCallEnd:
      close();
      break;
  }
}

void OutputBuilder::close() {
  if (!open_) return;
  open_ = false;
  json& it = items_.back();
  const int idx = int(items_.size()) - 1;
  const std::string id = it["id"];
  if (kind() == "function_call") {
    it["status"] = "completed";
    send({{"type", "response.function_call_arguments.done"}, {"item_id", id}, {"output_index", idx},
          {"arguments", it["arguments"]}});
  } else {
    const bool msg = kind() == "message";
    if (msg) it["status"] = "completed";
    json part = it["content"][0];
    send({{"type", msg ? "response.output_text.done" : "response.reasoning_text.done"}, {"item_id", id},
          {"output_index", idx}, {"content_index", 0}, {"text", part["text"]}});
    send({{"type", "response.content_part.done"}, {"item_id", id}, {"output_index", idx}, {"content_index", 0},
          {"part", part}});
  }
  send({{"type", "response.output_item.done"}, {"output_index", idx}, {"item", it}});
}

void OutputBuilder::send(json ev) {
  ev["sequence_number"] = seq_++;
  if (emit_) emit_(std::move(ev));
}

std::string OutputBuilder::text() const {
  std::string t;
  for (const json& it : items_)
    if (it["type"] == "message") t += it["content"][0]["text"].get<std::string>();
  return t;
}

const std::string& OutputBuilder::kind() const {
  static const std::string none;
  return items_.empty() ? none : items_.back()["type"].get_ref<const std::string&>();
}

void OutputBuilder::open(const std::string& type, const std::string& name) {
  if (open_ && kind() == type && type != "function_call") return;
  close();
  json it;
  if (type == "reasoning") {
    it = {{"type", "reasoning"}, {"id", random_id("rs_")}, {"summary", json::array()},
          {"content", json::array({{{"type", "reasoning_text"}, {"text", ""}}})}};
  } else if (type == "message") {
    it = {{"type", "message"}, {"id", random_id("msg_")}, {"role", "assistant"}, {"status", "in_progress"},
          {"content", json::array({{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}})}};
  } else {
    it = {{"type", "function_call"}, {"id", random_id("fc_")}, {"call_id", random_id("call_")}, {"name", name},
          {"arguments", ""}, {"status", "in_progress"}};
  }
  items_.push_back(it);
  open_ = true;
  const int idx = int(items_.size()) - 1;
  json announced = it;
  if (type != "function_call") announced["content"] = json::array();
  send({{"type", "response.output_item.added"}, {"output_index", idx}, {"item", announced}});
  if (type != "function_call")
    send({{"type", "response.content_part.added"}, {"item_id", it["id"]}, {"output_index", idx},
          {"content_index", 0}, {"part", it["content"][0]}});
}

void OutputBuilder::append(const std::string& text, const char* delta_type) {
  if (text.empty()) return;
  json& it = items_.back();
  const int idx = int(items_.size()) - 1;
  if (kind() == "function_call") {
    it["arguments"].get_ref<std::string&>() += text;  // in place: no copy of the text so far
    send({{"type", delta_type}, {"item_id", it["id"]}, {"output_index", idx}, {"delta", text}});
  } else {
    json& part = it["content"][0];
    part["text"].get_ref<std::string&>() += text;
    send({{"type", delta_type}, {"item_id", it["id"]}, {"output_index", idx}, {"content_index", 0}, {"delta", text}});
  }
}

}  // namespace mx::server
