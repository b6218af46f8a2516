#include "server/messages_output.h"

#include <algorithm>
#include <utility>


namespace reprise {

namespace {

using ordered_json = nlohmann::ordered_json;

ordered_json usage_json(int64_t input, int64_t cached, int64_t output) {
  return {{"input_tokens", input},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", cached},
          {"output_tokens", output}};
}

}  // namespace

ordered_json anthropic_error_json(const ApiError& error) {
  const char* type = error.status == 401   ? "authentication_error"
                     : error.status == 403 ? "permission_error"
                     : error.status == 404 ? "not_found_error"
                     : error.status == 413 ? "request_too_large"
                     : error.status == 429 ? "rate_limit_error"
                     : error.status == 503 ? "overloaded_error"
                     : error.status >= 500 ? "api_error"
                                           : "invalid_request_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", error.message}}}};
}

MessageBuilder::MessageBuilder(std::string id, std::string model, int64_t prompt_tokens,
                               std::vector<std::string> stop_sequences, std::string* events)
    : id_(std::move(id)),
      model_(std::move(model)),
      prompt_tokens_(prompt_tokens),
      stop_sequences_(std::move(stop_sequences)),
      events_(events) {}

void MessageBuilder::emit(const ordered_json& event) {
  if (events_) *events_ += typed_sse_event(event);
}

void MessageBuilder::start() {
  // The prompt's split into computed and cached tokens is known once it
  // has run: message_start counts it all as input, message_delta corrects it.
  emit({{"type", "message_start"},
        {"message",
         {{"id", id_},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model_},
          {"content", ordered_json::array()},
          {"stop_reason", nullptr},
          {"stop_sequence", nullptr},
          {"usage", usage_json(prompt_tokens_, 0, 0)}}}});
}

void MessageBuilder::open(Open kind) {
  if (open_ == kind) return;
  close();
  open_ = kind;
  ordered_json block = kind == Open::Text ? ordered_json{{"type", "text"}, {"text", ""}}
                                          : ordered_json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
  emit({{"type", "content_block_start"}, {"index", blocks_.size()}, {"content_block", block}});
  blocks_.push_back(std::move(block));
}

void MessageBuilder::close() {
  if (open_ == Open::None) return;
  emit({{"type", "content_block_stop"}, {"index", blocks_.size() - 1}});
  open_ = Open::None;
}

// Text for a block of `kind` (its `field`), opened if it is not, and its delta event.
void MessageBuilder::append(Open kind, const char* field, const char* delta_type, const std::string& text) {
  if (text.empty()) return;
  open(kind);
  blocks_.back()[field].get_ref<std::string&>() += text;
  emit({{"type", "content_block_delta"}, {"index", blocks_.size() - 1}, {"delta", {{"type", delta_type}, {field, text}}}});
}

void MessageBuilder::reasoning(const std::string& text, Logprobs) {
  append(Open::Thinking, "thinking", "thinking_delta", text);
}

void MessageBuilder::content(const std::string& text, Logprobs) { append(Open::Text, "text", "text_delta", text); }

void MessageBuilder::tool_calls(const std::vector<ToolCall>& calls, Logprobs) {
  close();
  for (const ToolCall& call : calls) {
    ordered_json input = ordered_json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
    if (!input.is_object()) input = ordered_json::object();  // the parsers return objects; never trust blindly
    const size_t index = blocks_.size();
    emit({{"type", "content_block_start"},
          {"index", index},
          {"content_block", {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", ordered_json::object()}}}});
    emit({{"type", "content_block_delta"},
          {"index", index},
          {"delta", {{"type", "input_json_delta"}, {"partial_json", dump_json(input)}}}});
    emit({{"type", "content_block_stop"}, {"index", index}});
    blocks_.push_back({{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", std::move(input)}});
  }
}

void MessageBuilder::finish(const std::string& finish_reason) {
  finish_reason_ = finish_reason;
  close();
}

ordered_json MessageBuilder::complete(const GenerationOutcome& outcome, int64_t) {
  std::string stop_reason = finish_reason_ == "length" ? "max_tokens" : finish_reason_ == "tool_calls" ? "tool_use" : "end_turn";
  ordered_json stop_sequence = nullptr;
  if (finish_reason_ == "stop" && !outcome.stop_string.empty() &&
      std::find(stop_sequences_.begin(), stop_sequences_.end(), outcome.stop_string) != stop_sequences_.end()) {
    stop_reason = "stop_sequence";
    stop_sequence = outcome.stop_string;
  }
  const UsageCounts& u = outcome.usage;
  const ordered_json usage = usage_json(u.prompt_tokens - u.cached_tokens, u.cached_tokens, u.completion_tokens);
  emit({{"type", "message_delta"},
        {"delta", {{"stop_reason", stop_reason}, {"stop_sequence", stop_sequence}}},
        {"usage", usage}});
  emit({{"type", "message_stop"}});
  return {{"id", id_},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model_},
          {"content", blocks_},
          {"stop_reason", stop_reason},
          {"stop_sequence", stop_sequence},
          {"usage", usage}};
}

ordered_json MessageBuilder::fail(const ApiError& error) {
  close();
  const ordered_json body = anthropic_error_json(error);
  emit(body);
  return body;
}

}  // namespace reprise
