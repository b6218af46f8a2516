// The Responses API's output: a Response object put together from what a
// choice says (reasoning, text, function calls, its finish), and, when the
// request streams, the typed server-sent events that describe it as it
// grows (response.created ... response.completed), numbered in order.
//
// Items are opened and closed as the reply moves between them: reasoning
// is a `reasoning` item, text a `message` item with one output_text part,
// each call a `function_call` item. A stream's events are ordered so that
// every delta names an item (output_index) and part (content_index) already
// announced, which is what OpenAI's SDKs check.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/choice_stream.h"
#include "server/openai_response.h"

namespace reprise {

class ResponseBuilder final : public ReplyBuilder {
 public:
  // `shell`: the Response object's fields other than status, output, usage
  // and error (id, created_at, model and the echoed request fields).
  // `events`: where a stream's events go; null when the reply is not streamed.
  ResponseBuilder(nlohmann::ordered_json shell, std::string* events);

  // response.created and response.in_progress (streams only).
  void start() override;

  void reasoning(const std::string& text, Logprobs logprobs) override;
  void content(const std::string& text, Logprobs logprobs) override;
  void tool_calls(const std::vector<ToolCall>& calls, Logprobs logprobs) override;
  void finish(const std::string& finish_reason) override;

  // The Response once its choice has finished: "completed", or
  // "incomplete" (max_output_tokens) when it was cut short; a stream gets
  // response.completed / response.incomplete with it.
  nlohmann::ordered_json complete(const GenerationOutcome& outcome, int64_t reasoning_tokens) override;
  // A Response that failed (status "failed", the error); a stream gets
  // response.failed with it.
  nlohmann::ordered_json fail(const ApiError& error) override;

  // The reply as the chat assistant message a continued conversation
  // shows its template: content, reasoning_content, tool_calls.
  nlohmann::ordered_json assistant_message() const;

 private:
  enum class Open { None, Reasoning, Message };
  void emit(nlohmann::ordered_json event);
  void open(Open kind);
  void close(const std::string& status = "completed");
  nlohmann::ordered_json response(const std::string& status) const;

  nlohmann::ordered_json shell_;
  std::string* events_;
  int64_t sequence_ = 0;
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();
  Open open_ = Open::None;
  std::string item_id_;  // the open item's
  std::string text_;     // the open item's text
  std::vector<LogprobEntry> logprobs_;
  std::string finish_reason_;
};

}  // namespace reprise
