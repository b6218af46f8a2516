// OpenAI request bodies -> validated structs.
//
// This is the only place that looks at untrusted JSON. Every field is
// type-checked and range-checked here so the rest of the server works with
// plain values; anything wrong becomes an ApiError (400) naming the field.
// The parse functions never throw, whatever the body holds (the fuzz test in
// tests/server_test.cpp checks that).
//
// Fields set to null are treated as absent, as OpenAI does. Unknown fields are
// ignored (clients and agent frameworks send many). Fields reprise cannot
// honour with a non-default value (n > 1, a JSON Schema keyword it does not
// enforce, ...) are rejected rather than silently ignored.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"
#include "grammar/json_schema.h"
#include "model/lora_adapter.h"
#include "server/api_error.h"

namespace reprise {

// What chat and text completions share.
// One entry of a request's `lora` field (llama.cpp's form): an adapter by
// its index in the model's list or by name, at a scale.
struct LoraRequest {
  int64_t index = -1;  // -1: by name
  std::string name;
  float scale = 1.0f;
};

struct GenerationOptions {
  std::string model;  // "" = the server's default model
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  std::optional<int64_t> max_tokens;    // max_completion_tokens or max_tokens; unset = until the context is full
  SamplingParams sampling;              // omitted fields keep SamplingParams' defaults (llama.cpp's)
  bool seed_given = false;              // false: the server picks a random seed
  std::vector<std::string> stop;        // non-empty strings
  bool logprobs = false;
  int top_logprobs = 0;
  std::string cache_salt;               // goes into the prefix cache namespace
  int draft_max = -1;                   // speculative decoding per request: 0 off, -1 the server's --draft-max
  bool ignore_eos = false;              // keep generating past end-of-generation tokens (benchmarks)
  int choices = 1;                      // n: independent replies to the same prompt
  bool raw_reasoning = false;           // reasoning_format "none": <think> stays in content
  // response_format json_object / json_schema: the output is a JSON
  // document this schema allows (structured output); null: free text.
  std::shared_ptr<const JsonSchema> json_schema;
  // tool_choice "required" or a named function: json_schema holds
  // {"name", "arguments"} for the allowed tools, and the reply is returned
  // as message.tool_calls (finish_reason "tool_calls").
  bool tool_call_reply = false;
  std::vector<LoraRequest> lora;  // the `lora` field, as given
  // The adapters the request runs with, resolved against its model's
  // (the model named, when it names an adapter, and the `lora` field) once
  // the model is leased.
  std::vector<LoraUse> loras;
};

// An image content part: its URL (data: URLs are decoded by the vision
// pipeline) and where it was in the request, for error messages.
struct ImageRef {
  std::string url;
  std::string param;
};

struct ChatCompletionRequest {
  GenerationOptions options;
  // Normalised for the chat template: role in {system, user, assistant,
  // tool}, content a string (text parts joined by "\n") or null, plus
  // name / tool_calls / tool_call_id / reasoning_content when given.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools = nullptr;  // passed to the template as given
  bool tool_choice_none = false;           // tool_choice "none": calls in the reply stay text
  bool parallel_tool_calls = true;         // false: a reply's first call only
  // chat_template_kwargs (and reasoning_effort): extra template variables.
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  // The reply continues the final (assistant) message instead of starting
  // a turn of its own (a prefill: Anthropic's trailing assistant message,
  // vLLM's continue_final_message).
  bool continue_final_message = false;
  // Index of the first message with an image part, if any (the model decides
  // whether it can take images).
  std::optional<size_t> first_image_message;
  // Image parts in order; each left the marker "<__media__>" in its
  // message's text where the image goes.
  std::vector<ImageRef> images;
};

// One prompt of a text completion: text, or token ids.
struct CompletionPrompt {
  std::string text;
  std::vector<int32_t> tokens;
  bool is_tokens = false;
};

struct CompletionRequest {
  GenerationOptions options;
  // One or more (a batch): each gets options.choices replies, choice
  // `index` = prompt * n + choice.
  std::vector<CompletionPrompt> prompts;
  // The reply's text starts with its prompt; with logprobs, so do the
  // logprobs (the first token's is null).
  bool echo = false;
};

struct RequestLimits {
  int max_nesting_depth = 64;     // deeper JSON is refused before parsing
  size_t max_stop_strings = 16;
  size_t max_stop_bytes = 1024;   // per stop string
  int max_top_logprobs = 20;
  size_t max_cache_salt_bytes = 1024;
  // n: choices per request. Each is a sequence of its own on a scheduler
  // slot (the prompt is computed once and shared through the cache).
  int max_choices = 16;
  // Prompts in one completions request, and their generations (prompts x n).
  size_t max_prompts = 64;
  // Inputs of one embeddings request (each is a sequence of its own), and
  // their tokens in all.
  size_t max_embedding_inputs = 256;
  size_t max_embedding_tokens = 131072;
};

// POST /v1/embeddings: one embedding per input.
struct EmbeddingsRequest {
  std::string model;
  std::vector<CompletionPrompt> inputs;  // text (never empty) or token ids
  bool base64 = false;                   // encoding_format "base64": little-endian float32 bytes
  std::optional<int64_t> dimensions;     // keep the first N values (renormalized)
  std::string cache_salt;
  std::vector<LoraRequest> lora;         // as GenerationOptions::lora
};

// vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter:
// {"lora_name", "lora_path" (loading only), "model" (reprise's: the
// adapter's model; the default one when absent)}.
struct LoraAdapterRequest {
  std::string name, path, model;
};
Parsed<LoraAdapterRequest> parse_lora_adapter_request(std::string_view body, const RequestLimits& limits,
                                                      bool with_path);

// llama.cpp's server utilities: POST /tokenize and /detokenize ("model"
// picks one of several; default the server's).
struct TokenizeRequest {
  std::string model;
  std::string content;
  bool add_special = false;   // the BOS token the model adds to prompts
  bool parse_special = true;  // control tokens' text becomes those tokens
  bool with_pieces = false;   // each token with its text
};
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
Parsed<TokenizeRequest> parse_tokenize_request(std::string_view body, const RequestLimits& limits = {});
Parsed<DetokenizeRequest> parse_detokenize_request(std::string_view body, const RequestLimits& limits = {});

Parsed<ChatCompletionRequest> parse_chat_completion_request(std::string_view body, const RequestLimits& limits = {});
Parsed<CompletionRequest> parse_completion_request(std::string_view body, const RequestLimits& limits = {});
Parsed<EmbeddingsRequest> parse_embeddings_request(std::string_view body, const RequestLimits& limits = {});

// Deepest array/object nesting of a JSON text (strings are skipped), stopping
// early once `limit` is exceeded. Used to refuse hostile bodies before the
// recursive parts of nlohmann::json (dump) and the template ever see them.
int json_nesting_depth(std::string_view text, int limit);

}  // namespace reprise
