// OpenAI response bodies: chat.completion, chat.completion.chunk,
// text_completion, model lists, errors, and server-sent-event framing.
//
// Builders are pure functions of their inputs so they are tested without a
// model or a socket. Text from the model may hold invalid UTF-8 (a token can
// end mid-character); dump_json replaces such bytes instead of throwing.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"

namespace reprise {

// One generated token's log-probability and its most likely alternatives.
struct LogprobEntry {
  std::string token;  // the token's text (raw bytes; may be part of a character)
  float logprob = 0;
  struct Alternative {
    std::string token;
    float logprob = 0;
  };
  std::vector<Alternative> top;
  // False for an echoed prompt's first token, which nothing predicts: its
  // logprob and alternatives are null.
  bool predicted = true;
};

struct UsageCounts {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache
  int64_t completion_tokens = 0;
};

// Fields every response object of one request repeats.
struct ResponseMeta {
  std::string id;       // chatcmpl-... / cmpl-...
  int64_t created = 0;  // unix seconds
  std::string model;
  std::string system_fingerprint;
};

using ordered_json = nlohmann::ordered_json;

ordered_json error_json(const ApiError& error);
ordered_json usage_json(const UsageCounts& usage);

// Chat completions.
ordered_json chat_logprobs_json(std::span<const LogprobEntry> entries);
// A reply: the `index`th of the request's choices (n).
// `reasoning`: a thinking model's reasoning (message.reasoning_content,
// left out when empty).
ordered_json chat_choice_json(int index, const std::string& text, const std::string& finish_reason,
                              const std::optional<std::vector<LogprobEntry>>& logprobs,
                              const std::string& reasoning = "");
// The chat.completion body around its choices.
ordered_json chat_completion_json(const ResponseMeta& meta, ordered_json choices, const UsageCounts& usage);
// ... and with one choice.
ordered_json chat_completion_json(const ResponseMeta& meta, const std::string& text, const std::string& finish_reason,
                                  const std::optional<std::vector<LogprobEntry>>& logprobs, const UsageCounts& usage);
// One call of message.tool_calls (tool_call_parser.h reads them out of replies).
struct ToolCall {
  std::string id;         // call_... (or the form the model's template wants)
  std::string name;
  std::string arguments;  // the arguments object as a JSON string, as OpenAI sends it
};
// message.tool_calls with the calls, message.content the text beside them
// (null when empty), finish_reason "tool_calls".
ordered_json chat_tool_call_choice_json(int index, const std::string& content, const std::vector<ToolCall>& calls,
                                        const std::optional<std::vector<LogprobEntry>>& logprobs,
                                        const std::string& reasoning = "");
ordered_json chat_tool_call_completion_json(const ResponseMeta& meta, const std::string& content,
                                            const std::vector<ToolCall>& calls,
                                            const std::optional<std::vector<LogprobEntry>>& logprobs,
                                            const UsageCounts& usage);
// The streamed delta carrying a whole tool call, the reply's `index`th.
ordered_json tool_call_delta(const ToolCall& call, int index = 0);

// A streamed chunk of the `index`th choice. `delta` is {"role": ...} /
// {"content": ...} / {}; a non-empty finish_reason marks the choice's last
// chunk. When the client asked for usage, every chunk carries "usage": null
// except the final usage chunk.
ordered_json chat_chunk_json(const ResponseMeta& meta, const ordered_json& delta, const std::string& finish_reason,
                             const std::optional<std::vector<LogprobEntry>>& logprobs, bool usage_null_field,
                             int index = 0);
ordered_json chat_usage_chunk_json(const ResponseMeta& meta, const UsageCounts& usage);

// Text completions (logprobs in the legacy tokens/token_logprobs shape).
// text_offset counts characters (code points), as OpenAI's and vLLM's do, so
// that text[offset:] starts at the token in any client's string type; a
// character split across tokens counts in the token holding its first byte.
// Each top_logprobs dict holds the chosen token too, as OpenAI's does.
ordered_json completion_logprobs_json(std::span<const LogprobEntry> entries, size_t text_offset0 = 0);
// The characters of UTF-8 text: its bytes that start one.
size_t utf8_characters(std::string_view text);
// Appends entries whose first starts at character text_offset0 to logprobs
// built so far (null: none yet), so a reply put together from its deltas
// has the offsets its stream has.
void append_completion_logprobs(ordered_json& into, std::span<const LogprobEntry> entries, size_t text_offset0);
ordered_json completion_choice_json(int index, const std::string& text, const std::string& finish_reason,
                                   ordered_json logprobs);
ordered_json completion_choice_json(int index, const std::string& text, const std::string& finish_reason,
                                   const std::optional<std::vector<LogprobEntry>>& logprobs, size_t text_offset0);
ordered_json completion_json(const ResponseMeta& meta, ordered_json choices, const UsageCounts& usage);
ordered_json completion_json(const ResponseMeta& meta, const std::string& text, const std::string& finish_reason,
                             const std::optional<std::vector<LogprobEntry>>& logprobs, const UsageCounts& usage);
ordered_json completion_chunk_json(const ResponseMeta& meta, const std::string& text,
                                   const std::string& finish_reason,
                                   const std::optional<std::vector<LogprobEntry>>& logprobs, size_t text_offset0,
                                   bool usage_null_field, int index = 0);
ordered_json completion_usage_chunk_json(const ResponseMeta& meta, const UsageCounts& usage);

// Serialises compactly; invalid UTF-8 becomes U+FFFD. Never throws.
std::string dump_json(const ordered_json& value);
// "data: <json>\n\n"
std::string sse_event(const ordered_json& value);
// "data: [DONE]\n\n"
std::string sse_done();
// "event: <its type>\ndata: <json>\n\n": the typed events of the
// Responses API and Anthropic's Messages API.
std::string typed_sse_event(const ordered_json& event);

// Random ids like OpenAI's: prefix + 24 alphanumerics (or `length`).
std::string make_response_id(const std::string& prefix, int length = 24);

}  // namespace reprise
