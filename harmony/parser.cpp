// Streaming parser of generated harmony tokens. It starts inside an assistant header (the prompt
// ends with "<|start|>assistant") and never throws on model output: a malformed header or a
// missing <|start|> degrades to plain content, a truncated message is flushed by finish().
#include <optional>

#include "harmony/harmony.h"

namespace mx::harmony {

namespace {
std::string word_after(const std::string& s, size_t pos) {
  size_t e = pos;
  while (e < s.size() && !std::isspace(static_cast<unsigned char>(s[e])) && s[e] != '<') ++e;
  return s.substr(pos, e - pos);
}
}  // namespace

SpecialIds::SpecialIds(const Tokenizer& tok) {
  auto id = [&](const char* s) { return tok.token_id(s).value_or(-1); };
  start = id("<|start|>");
  end = id("<|end|>");
  message = id("<|message|>");
  channel = id("<|channel|>");
  constrain = id("<|constrain|>");
  ret = id("<|return|>");
  call = id("<|call|>");
}

MessageHeader read_header(const std::string& header) {
  MessageHeader h;
  if (const size_t c = header.find("<|channel|>"); c != std::string::npos) h.channel = word_after(header, c + 11);
  if (const size_t r = header.find("to="); r != std::string::npos) h.recipient = word_after(header, r + 3);
  return h;
}

struct StreamParser::Impl {
  enum class State { kHeader, kContent, kExpectStart, kDone };
  enum class Target { kReasoning, kContent, kTool };

  std::shared_ptr<const Tokenizer> tok;
  IncrementalDecoder dec;
  SpecialIds ids;
  State state = State::kHeader;
  Target target = Target::kContent;
  std::string header;
  int header_tokens = 0;
  bool tool_call_end = false;

  explicit Impl(std::shared_ptr<const Tokenizer> t) : tok(t), dec(t), ids(*tok) {}

  // Header text such as "<|channel|>commentary to=functions.f <|constrain|>json" or
  // " to=functions.f<|channel|>commentary json" (role word already consumed or present).
  void begin_message(std::vector<Event>& out) {
    const auto [channel, recipient] = read_header(header);
    if (recipient.rfind("functions.", 0) == 0 && recipient.size() > 10) {
      target = Target::kTool;
      out.push_back({Event::Kind::kToolCallBegin, "", recipient.substr(10)});
    } else if (!recipient.empty() && recipient != "assistant" && recipient != "user") {
      // A built-in tool (browser.search, python, ...): a call named after its recipient, not text.
      target = Target::kTool;
      out.push_back({Event::Kind::kToolCallBegin, "", recipient});
    } else if (channel == "analysis" || !recipient.empty()) {
      target = Target::kReasoning;
    } else {
      target = Target::kContent;    // final, commentary preambles, unknown channels
    }
    header.clear();
    header_tokens = 0;
    state = State::kContent;
  }

  void emit_text(const std::string& text, std::vector<Event>& out) {
    if (text.empty()) return;
    Event::Kind k = target == Target::kReasoning ? Event::Kind::kReasoning
                    : target == Target::kTool    ? Event::Kind::kToolCallArguments
                                                 : Event::Kind::kContent;
    if (!out.empty() && out.back().kind == k && k != Event::Kind::kToolCallBegin) out.back().text += text;
    else out.push_back({k, text, ""});
  }

  void end_message(std::vector<Event>& out) {
    emit_text(dec.flush(), out);
    if (target == Target::kTool) out.push_back({Event::Kind::kToolCallEnd, "", ""});
  }

  void push(int32_t t, std::vector<Event>& out) {
    if (state == State::kDone || t < 0 || t >= tok->vocab_size()) return;
    const bool is_stop = t == ids.ret || t == ids.call;
    switch (state) {
      case State::kHeader:
        if (t == ids.message) {
          begin_message(out);
        } else if (is_stop || t == ids.end) {
          header.clear();  // a stop inside a header: nothing to report
          state = is_stop ? State::kDone : State::kExpectStart;
        } else if (++header_tokens > 64) {
          // Not a header after all: surface what was collected as content.
          std::string text = header;
          header.clear();
          target = Target::kContent;
          state = State::kContent;
          emit_text(text, out);
        } else {
          header += tok->token_bytes(t);
        }
        return;
      case State::kContent:
        if (t == ids.end || is_stop) {
          tool_call_end = (t == ids.call) && target == Target::kTool;
          end_message(out);
          state = is_stop ? State::kDone : State::kExpectStart;
        } else {
          emit_text(dec.push(t), out);
        }
        return;
      case State::kExpectStart:
        if (t == ids.start) {
          state = State::kHeader;
        } else if (is_stop) {
          state = State::kDone;
        } else {
          // Text without a header: treat it as user-visible content.
          target = Target::kContent;
          state = State::kContent;
          emit_text(dec.push(t), out);
        }
        return;
      case State::kDone:
        return;
    }
  }
};

StreamParser::StreamParser(std::shared_ptr<const Tokenizer> tok) : impl_(std::make_unique<Impl>(std::move(tok))) {}
StreamParser::~StreamParser() = default;

std::vector<Event> StreamParser::push(int32_t token) {
  std::vector<Event> out;
  impl_->push(token, out);
  return out;
}

std::vector<Event> StreamParser::finish() {
  std::vector<Event> out;
  if (impl_->state == Impl::State::kContent) impl_->end_message(out);
  impl_->state = Impl::State::kDone;
  return out;
}

bool StreamParser::saw_tool_call_end() const { return impl_->tool_call_end; }

}  // namespace mx::harmony
