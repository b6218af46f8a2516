// Anthropic's Messages API output: a message put together from what a
// choice says (thinking, text, tool_use blocks, its stop), and, when the
// request streams, the events that describe it as it grows: message_start,
// content_block_start / _delta / _stop per block, message_delta (the stop
// reason and usage), message_stop.
//
// Usage is Anthropic's split: input_tokens the prompt tokens computed,
// cache_read_input_tokens those read from the prefix cache.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "server/choice_stream.h"

namespace reprise {

// Anthropic's error body: {"type":"error","error":{"type","message"}}, the
// type named after the status as Anthropic names it.
nlohmann::ordered_json anthropic_error_json(const ApiError& error);

class MessageBuilder final : public ReplyBuilder {
 public:
  // `stop_sequences`: the request's own, so a reply they ended says
  // stop_reason "stop_sequence". `events`: null when not streamed.
  MessageBuilder(std::string id, std::string model, int64_t prompt_tokens, std::vector<std::string> stop_sequences,
                 std::string* events);

  void start() override;
  void reasoning(const std::string& text, Logprobs logprobs) override;
  void content(const std::string& text, Logprobs logprobs) override;
  void tool_calls(const std::vector<ToolCall>& calls, Logprobs logprobs) override;
  void finish(const std::string& finish_reason) override;
  nlohmann::ordered_json complete(const GenerationOutcome& outcome, int64_t reasoning_tokens) override;
  nlohmann::ordered_json fail(const ApiError& error) override;

 private:
  enum class Open { None, Thinking, Text };
  void emit(const nlohmann::ordered_json& event);
  void open(Open kind);
  void close();
  void append(Open kind, const char* field, const char* delta_type, const std::string& text);

  const std::string id_, model_;
  const int64_t prompt_tokens_;
  const std::vector<std::string> stop_sequences_;
  std::string* events_;
  nlohmann::ordered_json blocks_ = nlohmann::ordered_json::array();
  Open open_ = Open::None;
  std::string finish_reason_;
};

}  // namespace reprise
