#include "server/responses_output.h"

#include <utility>

namespace reprise {

namespace {

using ordered_json = nlohmann::ordered_json;

ordered_json logprobs_json(const std::vector<LogprobEntry>& entries) {
  return chat_logprobs_json(entries)["content"];
}

ordered_json text_part(const std::string& text, const std::vector<LogprobEntry>& logprobs) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", ordered_json::array()},
          {"logprobs", logprobs_json(logprobs)}};
}

}  // namespace

ResponseBuilder::ResponseBuilder(ordered_json shell, std::string* events)
    : shell_(std::move(shell)), events_(events) {}

void ResponseBuilder::emit(ordered_json event) {
  if (!events_) return;
  event["sequence_number"] = sequence_++;
  *events_ += typed_sse_event(event);
}

void ResponseBuilder::start() {
  emit({{"type", "response.created"}, {"response", response("in_progress")}});
  emit({{"type", "response.in_progress"}, {"response", response("in_progress")}});
}

// Opens an item of `kind` (closing another kind's), announcing it and its
// one content part.
void ResponseBuilder::open(Open kind) {
  if (open_ == kind) return;
  close();
  open_ = kind;
  text_.clear();
  logprobs_.clear();
  const bool message = kind == Open::Message;
  item_id_ = make_response_id(message ? "msg_" : "rs_");
  ordered_json item = message ? ordered_json{{"id", item_id_}, {"type", "message"}, {"status", "in_progress"},
                                             {"role", "assistant"}, {"content", ordered_json::array()}}
                              : ordered_json{{"id", item_id_}, {"type", "reasoning"}, {"summary", ordered_json::array()},
                                             {"content", ordered_json::array()}, {"status", "in_progress"}};
  const int64_t index = static_cast<int64_t>(output_.size());
  emit({{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}});
  const ordered_json part = message ? text_part("", {}) : ordered_json{{"type", "reasoning_text"}, {"text", ""}};
  emit({{"type", "response.content_part.added"}, {"item_id", item_id_}, {"output_index", index},
        {"content_index", 0}, {"part", part}});
  output_.push_back(std::move(item));
}

// Closes the open item: its text's and part's "done" events, then the item's.
void ResponseBuilder::close(const std::string& status) {
  if (open_ == Open::None) return;
  const int64_t index = static_cast<int64_t>(output_.size()) - 1;
  ordered_json& item = output_.back();
  if (open_ == Open::Message) {
    emit({{"type", "response.output_text.done"}, {"item_id", item_id_}, {"output_index", index},
          {"content_index", 0}, {"text", text_}, {"logprobs", logprobs_json(logprobs_)}});
    const ordered_json part = text_part(text_, logprobs_);
    emit({{"type", "response.content_part.done"}, {"item_id", item_id_}, {"output_index", index},
          {"content_index", 0}, {"part", part}});
    item["content"].push_back(part);
  } else {
    emit({{"type", "response.reasoning_text.done"}, {"item_id", item_id_}, {"output_index", index},
          {"content_index", 0}, {"text", text_}});
    const ordered_json part = {{"type", "reasoning_text"}, {"text", text_}};
    emit({{"type", "response.content_part.done"}, {"item_id", item_id_}, {"output_index", index},
          {"content_index", 0}, {"part", part}});
    item["content"].push_back(part);
  }
  item["status"] = status;
  emit({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  open_ = Open::None;
}

void ResponseBuilder::reasoning(const std::string& text, Logprobs) {
  if (text.empty()) return;
  open(Open::Reasoning);
  text_ += text;
  emit({{"type", "response.reasoning_text.delta"}, {"item_id", item_id_},
        {"output_index", static_cast<int64_t>(output_.size()) - 1}, {"content_index", 0}, {"delta", text}});
}

void ResponseBuilder::content(const std::string& text, Logprobs logprobs) {
  if (text.empty() && (!logprobs || logprobs->empty())) return;
  open(Open::Message);
  text_ += text;
  std::vector<LogprobEntry> delta_logprobs = logprobs ? std::move(*logprobs) : std::vector<LogprobEntry>{};
  emit({{"type", "response.output_text.delta"}, {"item_id", item_id_},
        {"output_index", static_cast<int64_t>(output_.size()) - 1}, {"content_index", 0}, {"delta", text},
        {"logprobs", logprobs_json(delta_logprobs)}});
  for (LogprobEntry& e : delta_logprobs) logprobs_.push_back(std::move(e));
}

void ResponseBuilder::tool_calls(const std::vector<ToolCall>& calls, Logprobs) {
  close();
  for (const ToolCall& call : calls) {
    const int64_t index = static_cast<int64_t>(output_.size());
    const std::string id = make_response_id("fc_");
    ordered_json item = {{"id", id},           {"type", "function_call"}, {"status", "in_progress"},
                         {"arguments", ""},     {"call_id", call.id},       {"name", call.name}};
    emit({{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}});
    emit({{"type", "response.function_call_arguments.delta"}, {"item_id", id}, {"output_index", index},
          {"delta", call.arguments}});
    emit({{"type", "response.function_call_arguments.done"}, {"item_id", id}, {"output_index", index},
          {"name", call.name}, {"arguments", call.arguments}});
    item["arguments"] = call.arguments;
    item["status"] = "completed";
    emit({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
    output_.push_back(std::move(item));
  }
}

void ResponseBuilder::finish(const std::string& finish_reason) {
  finish_reason_ = finish_reason;
  const std::string status = finish_reason == "length" ? "incomplete" : "completed";
  // A reply that said nothing is still a message: its text is "". One cut
  // short inside its reasoning ends with that item, incomplete.
  if (output_.empty()) open(Open::Message);
  close(status);
}

ordered_json ResponseBuilder::response(const std::string& status) const {
  ordered_json r = {{"id", shell_["id"]},
                    {"object", "response"},
                    {"created_at", shell_["created_at"]},
                    {"status", status},
                    {"error", nullptr},
                    {"incomplete_details", nullptr}};
  for (const auto& [key, value] : shell_.items())
    if (!r.contains(key)) r[key] = value;
  r["output"] = status == "in_progress" ? ordered_json::array() : output_;
  std::string text;
  for (const ordered_json& item : output_)
    if (item["type"] == "message")
      for (const ordered_json& part : item["content"]) text += part["text"].get<std::string>();
  r["output_text"] = status == "in_progress" ? "" : text;
  r["usage"] = nullptr;
  return r;
}

ordered_json ResponseBuilder::complete(const GenerationOutcome& outcome, int64_t reasoning_tokens) {
  const UsageCounts& usage = outcome.usage;
  const bool cut_short = finish_reason_ == "length";
  ordered_json r = response(cut_short ? "incomplete" : "completed");
  if (cut_short) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  r["usage"] = {{"input_tokens", usage.prompt_tokens},
                {"input_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
                {"output_tokens", usage.completion_tokens},
                {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
                {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
  emit({{"type", cut_short ? "response.incomplete" : "response.completed"}, {"response", r}});
  return r;
}

ordered_json ResponseBuilder::fail(const ApiError& error) {
  close("incomplete");
  ordered_json r = response("failed");
  r["error"] = {{"code", error.code.empty() ? (error.status >= 500 ? "server_error" : "invalid_prompt") : error.code},
                {"message", error.message}};
  emit({{"type", "response.failed"}, {"response", r}});
  return r;
}

ordered_json ResponseBuilder::assistant_message() const {
  ordered_json message = {{"role", "assistant"}, {"content", nullptr}};
  std::string text, reasoning;
  ordered_json calls = ordered_json::array();
  for (const ordered_json& item : output_) {
    if (item["type"] == "message") {
      for (const ordered_json& part : item["content"]) text += part["text"].get<std::string>();
    } else if (item["type"] == "reasoning") {
      for (const ordered_json& part : item["content"]) reasoning += part["text"].get<std::string>();
    } else if (item["type"] == "function_call") {
      calls.push_back({{"id", item["call_id"]},
                       {"type", "function"},
                       {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
    }
  }
  if (!text.empty() || calls.empty()) message["content"] = text;
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  return message;
}

}  // namespace reprise
