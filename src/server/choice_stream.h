// One choice of a reply, read as its generation's deltas arrive: a thinking
// model's reasoning split from its content, tool calls read out of the text
// in the model's syntax (or a forced call held whole), and the finish
// reason. What it reads goes to a ChoiceEvents: the endpoint's own events
// (chat or text-completion chunks), or a ReplyBuilder that puts a whole
// reply together (the Responses API's Response, Anthropic's message),
// streaming its API's typed events as it grows.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/generation.h"
#include "server/harmony_parser.h"
#include "server/reasoning_splitter.h"
#include "server/response_context.h"
#include "server/tool_call_parser.h"

namespace reprise {

// What a choice says, in order: reasoning and content (with the logprobs of
// the tokens that wrote them, when the request asked for logprobs), tool
// calls, then its finish reason once.
class ChoiceEvents {
 public:
  using Logprobs = std::optional<std::vector<LogprobEntry>>;
  virtual ~ChoiceEvents() = default;
  virtual void reasoning(const std::string& text, Logprobs logprobs) = 0;
  virtual void content(const std::string& text, Logprobs logprobs) = 0;
  // `logprobs`: a forced call's tokens' (the syntax's calls carry none).
  virtual void tool_calls(const std::vector<ToolCall>& calls, Logprobs logprobs) = 0;
  virtual void finish(const std::string& finish_reason) = 0;
};

// A whole reply put together from one choice's events (the Responses
// API's Response, the Messages API's message), streamed as its API's typed
// events or returned at the end.
class ReplyBuilder : public ChoiceEvents {
 public:
  // The opening events (streams only).
  virtual void start() = 0;
  // The reply once its choice has finished (the finish reason finish()
  // recorded; usage and the stop string from the outcome); a stream gets
  // its closing events.
  virtual nlohmann::ordered_json complete(const GenerationOutcome& outcome, int64_t reasoning_tokens) = 0;
  // The reply that failed; a stream gets its API's failure event.
  virtual nlohmann::ordered_json fail(const ApiError& error) = 0;
};

class ChoiceStream {
 public:
  // `events` outlives the stream.
  ChoiceStream(const ResponseContext& ctx, ChoiceEvents& events);

  // Reads deltas taken from the choice's channel.
  void add(std::vector<GenerationDelta>& deltas);
  // Reads the choice's end, once its generation has ended without an error
  // or a cancel: what was held back, and its finish reason.
  void finish(const std::string& generation_finish);
  // Generated tokens whose text went to reasoning.
  int64_t reasoning_tokens() const { return reasoning_tokens_; }

 private:
  template <typename Parts>
  void add_parts(Parts parts, GenerationDelta& d);
  void add_reasoning(const std::string& reasoning, std::vector<LogprobEntry>& logprobs);
  void add_content(GenerationDelta& d);
  void finish_content(const std::string& generation_finish);
  ChoiceEvents::Logprobs logprobs_of(std::vector<LogprobEntry>&& entries) const;

  const ResponseContext& ctx_;
  ChoiceEvents& events_;
  int64_t reasoning_tokens_ = 0;
  // A forced tool call's reply, held whole.
  std::string held_;
  std::vector<LogprobEntry> held_logprobs_;
  // The model's own tool-call syntax: the reply so far, and how much of it went out.
  std::string reply_;
  size_t sent_ = 0;
  ToolCallTextGate gate_;
  std::vector<LogprobEntry> unsent_logprobs_;
  std::optional<ReasoningSplitter> splitter_;  // thinking models' replies
  std::optional<HarmonyStream> harmony_;       // gpt-oss's replies
};

// Chat completion chunks (chat.completion.chunk) or text completion chunks
// of the request's `index`th choice, appended to `out` as server-sent events.
std::unique_ptr<ChoiceEvents> make_chunk_events(const ResponseContext& ctx, int index, std::string& out);

}  // namespace reprise
