// Anthropic's Messages API (POST /v1/messages) read as a chat completion,
// so clients built on Anthropic's SDKs (and tools such as Claude Code) run
// on the same prompt builder, checks and generation path as OpenAI's.
//
// `system` becomes a leading system message; a message's content blocks
// become chat content: text and base64 images as parts, an assistant's
// tool_use blocks its tool calls (input serialised as the arguments), its
// thinking blocks its reasoning_content, a user's tool_result blocks tool
// messages (before the user's other blocks, as they answer the turn
// before; an is_error result starts "Error: ", a result's images follow in
// a user message of their own). A final assistant message is a prefill the
// reply continues (continue_final_message). Tools (name, description,
// input_schema) become function tools, tool_choice auto/any/tool/none
// becomes auto/required/a function/none, stop_sequences become stop
// strings, `thinking` (enabled, adaptive, between_tools or disabled)
// becomes the template's enable_thinking, and output_config.format is
// structured output.
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
  // chat.messages indexes of the user messages holding tool results'
  // images (and nothing else), and whether a user sent images of their own.
  std::vector<size_t> tool_image_messages;
  bool user_images = false;
};

Parsed<MessagesRequest> parse_messages_request(std::string_view body, const RequestLimits& limits = {});

// For a model that reads no images: the images tool results returned (a
// coding agent's screenshot, an image file it read) become the text
// "[image]", so the conversation goes on. False, changing nothing, when the
// user's own images remain: those need a model that reads images.
bool drop_tool_result_images(MessagesRequest& request);

}  // namespace reprise
