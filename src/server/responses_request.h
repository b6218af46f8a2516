// OpenAI's Responses API (POST /v1/responses) read as a chat completion.
//
// A Responses request is validated here (its own field names in errors)
// and rewritten as the Chat Completions body it means: `instructions`
// becomes a leading system message, `input` items become messages (a
// function_call joins the assistant message before it as a tool call, a
// function_call_output becomes a tool message, reasoning items become the
// next assistant message's reasoning_content), function tools and
// tool_choice lose their flat form, text.format becomes response_format,
// max_output_tokens max_completion_tokens. That body then goes through the
// chat parser, so both APIs share one set of checks and one generation path.
//
// A conversation continued with previous_response_id gets the stored
// conversation's messages between the instructions and the new input
// (instructions are not carried over, as OpenAI documents).
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "server/api_error.h"
#include "server/openai_request.h"

namespace reprise {

struct ResponsesRequest {
  // The Chat Completions body without messages.
  nlohmann::ordered_json chat_body = nlohmann::ordered_json::object();
  std::string instructions;  // "" none
  // This request's input as chat messages, and as Responses items (each
  // with an id, for GET /v1/responses/{id}/input_items).
  nlohmann::ordered_json input_messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json input_items = nlohmann::ordered_json::array();
  std::string previous_response_id;  // "" none
  std::string cache_salt;            // scopes stored responses as it scopes the cache
  bool store = true;
  // The request's fields a Response object repeats, as given (OpenAI's
  // defaults where absent; temperature and top_p are filled in later from
  // the parsed sampling options).
  nlohmann::ordered_json echoed = nlohmann::ordered_json::object();
};

Parsed<ResponsesRequest> parse_responses_request(std::string_view body, const RequestLimits& limits = {});

// An error about the chat completion a Responses request was read as (its
// parse, its prompt), with the fields named as the Responses API names them.
ApiError in_responses_terms(ApiError error);

// The chat completion the request means, with `history` (chat messages of
// the conversation it continues; an empty array for none) before its input.
// Errors name the Responses API's fields where they differ.
Parsed<ChatCompletionRequest> responses_chat_request(const ResponsesRequest& request,
                                                     const nlohmann::ordered_json& history,
                                                     const RequestLimits& limits = {});

}  // namespace reprise
