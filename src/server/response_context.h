// What writing one generation request's response needs besides its
// channels: the endpoint, the fields every response object repeats, the
// request's options, and how the reply is read back (tool calls, reasoning).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/responses_request.h"
#include "server/tool_call_parser.h"

namespace reprise {

enum class Endpoint { Chat, Completions, Responses, Embeddings, Messages };

struct ResponseContext {
  Endpoint endpoint;
  ResponseMeta meta;
  GenerationOptions options;
  // Tool calls to read out of the reply (tool_choice auto with tools): the
  // model's syntax and the request's tool names.
  ToolCallSyntax tool_syntax = ToolCallSyntax::None;
  std::vector<std::string> tool_names{};
  ToolCallSyntax id_syntax = ToolCallSyntax::None;  // the template's: what its call ids look like
  // A thinking model's <think> reasoning goes to reasoning_content, and
  // whether the reply starts inside it (reasoning_splitter.h).
  bool split_reasoning = false;
  bool opens_reasoning = false;
  // gpt-oss's harmony channels are read back (harmony_parser.h), and
  // whether messages to functions become tool calls (the request has tools).
  bool harmony = false;
  bool harmony_calls = false;
  // parallel_tool_calls false: a reply's first call only.
  size_t max_tool_calls = SIZE_MAX;
  // The Responses API's request (its echoed fields, what to store); null
  // for the other endpoints.
  std::shared_ptr<const ResponsesRequest> responses = nullptr;
  // Embeddings: encoding_format "base64".
  bool embeddings_base64 = false;
  // Anthropic's Messages API: the prompt's length (its message_start event
  // comes before the outcome).
  int64_t prompt_tokens = 0;

  // n: the choices each prompt gets.
  size_t choices_per_prompt() const { return static_cast<size_t>(std::max(1, options.choices)); }
  // The reply is one object a ReplyBuilder puts together (Responses, Messages).
  bool builds_whole_reply() const { return endpoint == Endpoint::Responses || endpoint == Endpoint::Messages; }
};

// The calls a reply returns: the request may allow only one.
inline void limit_calls(std::vector<ToolCall>& calls, const ResponseContext& ctx) {
  if (calls.size() > ctx.max_tool_calls) calls.resize(ctx.max_tool_calls);
}

}  // namespace reprise
