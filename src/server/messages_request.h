// Anthropic's Messages API (POST /v1/messages) read as a chat completion,
// so clients built on Anthropic's SDKs (and tools such as Claude Code) run
// on the same prompt builder, checks and generation path as OpenAI's.
//
// `system` becomes a leading system message; a message's content blocks
// become chat content: text and base64 images as parts, an assistant's
// tool_use blocks its tool calls (input serialised as the arguments), its
// thinking blocks its reasoning_content, a user's tool_result blocks tool
// messages (before the user's other blocks, as they answer the turn
// before). Tools (name, description, input_schema) become function tools,
// tool_choice auto/any/tool/none becomes auto/required/a function/none,
// stop_sequences become stop strings, and `thinking` enabled or disabled
// becomes the template's enable_thinking.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"
#include "server/openai_request.h"

namespace reprise {

struct MessagesRequest {
  ChatCompletionRequest chat;
  std::vector<std::string> stop_sequences;  // the request's own (not the template's)
};

Parsed<MessagesRequest> parse_messages_request(std::string_view body, const RequestLimits& limits = {});

// Anthropic's error body: {"type":"error","error":{"type","message"}}, the
// type named after the status as Anthropic names it.
nlohmann::ordered_json anthropic_error_json(const ApiError& error);

}  // namespace reprise
