// The Responses API (/v1/responses) over the harmony chat path: a request becomes a chat conversation
// (input items -> messages, instructions -> a developer message, previous_response_id -> the stored
// conversation before it), and the generated harmony events become output items (reasoning, message,
// function_call). Parsing and the store live here; the HTTP handlers are in responses.cpp.
#pragma once
#include <deque>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>

#include "harmony/harmony.h"

namespace mx::server {

// Stored responses (store: true, the default) for GET / DELETE /v1/responses/{id} and
// previous_response_id: the response object and the conversation it continues plus its own output,
// as chat messages. Bounded by count and by bytes (their JSON): past either the oldest responses are
// evicted. Thread-safe.
class ResponseStore {
 public:
  static constexpr size_t kCapacity = 1024;
  static constexpr size_t kMaxBytes = size_t(256) << 20;
  struct Entry {
    nlohmann::json response;
    nlohmann::json messages;  // chat messages, instructions excluded (they do not carry over)
  };
  void put(const std::string& id, Entry e);
  std::optional<Entry> get(const std::string& id) const;
  bool erase(const std::string& id);
  size_t size() const;

 private:
  struct Stored {
    Entry e;
    size_t bytes = 0;
  };
  mutable std::mutex mu_;
  std::unordered_map<std::string, Stored> map_;
  std::deque<std::string> order_;  // the stored ids, oldest first
  size_t bytes_ = 0;
};

// A previous_response_id the store does not hold (the server answers 404).
struct UnknownResponse : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ResponsesRequest {
  nlohmann::json chat_body;  // a /v1/chat/completions body: messages, tools, tool_choice, sampling
  nlohmann::json messages;   // the conversation before the output, instructions excluded
  nlohmann::json echo;       // the request fields the response object repeats
  bool stream = false, store = true;
};

// Checks a /v1/responses body (mx::InvalidRequest naming the parameter, UnknownResponse) and builds
// the chat request it stands for.
ResponsesRequest parse_responses_request(const nlohmann::json& body, const ResponseStore& store);

// Builds a response's output items (reasoning, message, function_call) from harmony events, and the
// stream events that announce them (output_item.added / done, content_part.added / done, the text,
// reasoning and argument deltas and their done events), numbered by sequence_number.
class OutputBuilder {
 public:
  // `emit(event)` gets each stream event (type set, sequence_number added); may be empty.
  explicit OutputBuilder(std::function<void(nlohmann::json)> emit) : emit_(std::move(emit)) {}
  void event(const harmony::Event& h);
  void close();                    // ends the open item (at the end of generation)
  void send(nlohmann::json ev);    // numbers and emits an event (response.created, ...)
  const nlohmann::json& items() const { return items_; }
  std::string text() const;        // output_text: the messages' text

 private:
  const std::string& kind() const;  // the last item's type
  void open(const std::string& type, const std::string& name = "");
  void append(const std::string& text, const char* delta_type);

  std::function<void(nlohmann::json)> emit_;
  nlohmann::json items_ = nlohmann::json::array();
  bool open_ = false;
  int seq_ = 0;
};

// The chat message of a response's output items (reasoning, message, function calls), to continue
// the conversation from.
nlohmann::json output_as_message(const nlohmann::json& output);

}  // namespace mx::server
