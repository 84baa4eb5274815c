#include "harmony/output_constraint.h"

#include <algorithm>
#include <fmt/format.h>

namespace mx::harmony {

using nlohmann::json;

std::shared_ptr<const ToolSchemas> held_tool_schemas(const json& tools, const json& tool_choice) {
  if (!tools.is_array()) return nullptr;
  const bool required = tool_choice.is_string() && tool_choice == "required";
  std::string named;
  if (tool_choice.is_object() && tool_choice.contains("function") && tool_choice["function"].is_object() &&
      tool_choice["function"].contains("name") && tool_choice["function"]["name"].is_string())
    named = tool_choice["function"]["name"].get<std::string>();
  auto out = std::make_shared<ToolSchemas>();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string()) continue;
    const std::string name = f["name"].get<std::string>();
    const bool strict = f.contains("strict") && f["strict"].is_boolean() && f["strict"].get<bool>();
    if (!strict && !required && name != named) continue;
    const json params = f.contains("parameters") && f["parameters"].is_object() ? f["parameters"] : json{{"type", "object"}};
    (*out)[name] = JsonSchema::compile(params, fmt::format("tools[{}].function.parameters", i));
  }
  return out->empty() ? nullptr : out;
}

OutputConstraint::OutputConstraint(std::shared_ptr<const JsonTokenMask> mask, std::shared_ptr<const JsonSchema> final_schema,
                                   std::shared_ptr<const ToolSchemas> tools, bool from_start, std::vector<int32_t> end_ids)
    : mask_(std::move(mask)),
      final_(std::move(final_schema)),
      tools_(std::move(tools)),
      tok_(mask_->tokenizer()),
      ids_(tok_),
      raw_ends_(std::move(end_ids)) {
  if (from_start && final_) {
    held_ = final_;
    ends_ = raw_ends_;
    phase_ = Phase::kHeld;
    state_ = json_start(*held_);
  }
}

void OutputConstraint::open_body() {
  // As the streaming parser reads the header: a call to a held function, or the final channel.
  const MessageHeader h = read_header(header_);
  held_ = nullptr;
  if (h.recipient.rfind("functions.", 0) == 0) {
    if (tools_)
      if (auto it = tools_->find(h.recipient.substr(10)); it != tools_->end()) {
        held_ = it->second;
        ends_ = {ids_.call};
      }
  } else if (h.recipient.empty() && h.channel == "final" && final_) {
    held_ = final_;
    ends_ = {ids_.ret};
  }
  header_.clear();
  phase_ = held_ ? Phase::kHeld : Phase::kBody;
  if (held_) state_ = json_start(*held_);
}

std::span<const uint64_t> OutputConstraint::allowed() {
  if (phase_ != Phase::kHeld) return {};
  if (cached_schema_ != held_.get() || !(cached_ == state_)) {
    mask_->allowed(*held_, state_, bits_);
    if (json_done(*held_, state_))
      for (int32_t e : ends_)
        if (e >= 0) bits_[size_t(e) / 64] |= uint64_t(1) << (e % 64);
    json_copy(cached_, state_);
    cached_schema_ = held_.get();
    // (Never nothing: byte tokens continue any valid prefix, but a mask with no bit must not starve a row.)
    any_ = std::any_of(bits_.begin(), bits_.end(), [](uint64_t w) { return w != 0; });
  }
  return any_ ? std::span<const uint64_t>(bits_) : std::span<const uint64_t>{};
}

void OutputConstraint::accept(int32_t token) {
  const bool special = tok_.is_special(token);
  switch (phase_) {
    case Phase::kHeader:
      if (token == ids_.message) open_body();
      else if (token == ids_.channel) header_ += "<|channel|>";
      else if (token == ids_.constrain) header_ += "<|constrain|>";
      else if (special) header_.clear();  // <|start|>, or a message's end: a new header
      else if (header_.size() < 1024) header_ += tok_.token_bytes(token);
      return;
    case Phase::kBody:
    case Phase::kHeld:
      if (special) {  // the message's end (or a new start): the next header
        phase_ = Phase::kHeader;
        header_.clear();
        return;
      }
      if (phase_ == Phase::kHeld)
        for (char c : tok_.token_bytes(token))
          if (!json_feed(*held_, state_, uint8_t(c))) {  // (not from the mask: leave the rest free)
            phase_ = Phase::kBody;
            return;
          }
      return;
  }
}

}  // namespace mx::harmony
