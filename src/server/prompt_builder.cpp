#include "server/prompt_builder.h"

#include "server/jinja/raise.h"
#include "server/reasoning_splitter.h"
#include "util/error.h"

namespace reprise {

namespace {

Parsed<BuiltPrompt> check_length(BuiltPrompt prompt, int64_t n_ctx, const char* what) {
  const int64_t n = static_cast<int64_t>(prompt.tokens.size());
  if (n == 0) return ApiError::invalid(std::string(what) + " is empty after tokenization", what);
  if (n >= n_ctx)
    return ApiError::invalid("This model's maximum context length is " + std::to_string(n_ctx) +
                                 " tokens. However, your " + what + " resulted in " + std::to_string(n) +
                                 " tokens.",
                             what, "context_length_exceeded");
  return prompt;
}

// Each tool call's `function.arguments` that is a JSON string, replaced by
// the value it holds (a string that is no JSON stays a string).
void parse_tool_call_arguments(nlohmann::ordered_json& messages) {
  for (auto& message : messages) {
    if (!message.is_object() || !message.contains("tool_calls") || !message["tool_calls"].is_array()) continue;
    for (auto& call : message["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
      auto& function = call["function"];
      if (!function.contains("arguments") || !function["arguments"].is_string()) continue;
      auto parsed = nlohmann::ordered_json::parse(function["arguments"].get<std::string>(), nullptr, false);
      if (!parsed.is_discarded()) function["arguments"] = std::move(parsed);
    }
  }
}

}  // namespace

bool chat_prompt_opens_reasoning(const ModelChatTemplate& chat, std::string_view prompt) {
  return chat.reasoning_tags && ReasoningSplitter::prompt_opens_reasoning(prompt);
}

std::vector<int32_t> tokenize_prompt(const Tokenizer& tokenizer, const std::string& text) {
  std::vector<int32_t> tokens = tokenizer.encode(text, /*add_special=*/false, /*parse_special=*/true);
  const int32_t bos = tokenizer.bos_id();
  if (tokenizer.add_bos() && bos >= 0 && (tokens.empty() || tokens.front() != bos)) tokens.insert(tokens.begin(), bos);
  return tokens;
}

Parsed<std::string> render_chat_prompt(const ModelChatTemplate& chat, const Tokenizer& tokenizer,
                                       const ChatCompletionRequest& request) {
  if (!chat.chat_template)
    return ApiError::server("the model's chat template (" + chat.origin + ") failed to parse: " + chat.error,
                            "chat_template_error");
  ChatTemplateInputs inputs;
  inputs.messages = request.messages;
  // The template prints arguments as JSON itself: give it the object the
  // client's JSON string holds.
  if (chat.wants_object_arguments) parse_tool_call_arguments(inputs.messages);
  inputs.tools = request.tools;
  inputs.add_generation_prompt = !request.continue_final_message;
  inputs.bos_token = chat.bos_token;
  inputs.eos_token = chat.eos_token;
  inputs.tokenizer_adds_bos = tokenizer.add_bos();
  inputs.extra_context = request.template_kwargs;
  // The template's own raise_exception() rejects this conversation: the
  // client's to fix (400). So is any other render failure of a template that
  // renders a plain conversation: this request's content made it fail (a
  // tool without a description, a template variable of the wrong type), as
  // Jinja2 would too. A template that renders nothing is the server's
  // problem (500).
  try {
    std::string text = chat.chat_template->apply(inputs);
    if (request.continue_final_message) {
      // The prompt ends where the final message's text does: what the
      // template writes after it (its end-of-turn) is cut, so the reply
      // continues it. A template that does not show the text as given (it
      // trimmed or rewrote it) cannot be continued.
      const std::string& prefill = request.messages.back()["content"].get_ref<const std::string&>();
      const size_t at = text.rfind(prefill);
      if (at == std::string::npos)
        return ApiError::invalid("the model's chat template does not show the final assistant message as given, so "
                                 "the reply cannot continue it",
                                 "messages", "cannot_continue");
      text.resize(at + prefill.size());
    }
    return text;
  } catch (const jinja::TemplateRaised& e) {
    return ApiError{400, std::string("chat template error: ") + e.what(), "invalid_request_error", "messages",
                    "chat_template_error"};
  } catch (const std::exception& e) {
    if (chat.renders_plain_chat)
      return ApiError{400,
                      "the model's chat template (" + chat.origin + ") cannot render this request: " + e.what(),
                      "invalid_request_error", "messages", "chat_template_error"};
    return ApiError::server(std::string("the model's chat template (" + chat.origin + ") failed: ") + e.what(),
                            "chat_template_error");
  }
}

Parsed<BuiltPrompt> build_chat_prompt(const ModelChatTemplate& chat, const Tokenizer& tokenizer, int64_t n_ctx,
                                      const ChatCompletionRequest& request) {
  Parsed<std::string> text = render_chat_prompt(chat, tokenizer, request);
  if (!text.ok()) return text.error();
  BuiltPrompt prompt;
  try {
    prompt.tokens = tokenize_prompt(tokenizer, text.value());
  } catch (const std::exception& e) {
    return ApiError::invalid(std::string("cannot tokenize the prompt: ") + e.what(), "messages");
  }
  prompt.implicit_stops = chat.implicit_stops;
  prompt.opens_reasoning = chat_prompt_opens_reasoning(chat, text.value());
  return check_length(std::move(prompt), n_ctx, "messages");
}

Parsed<BuiltPrompt> build_completion_prompt(const Tokenizer& tokenizer, int64_t n_ctx, int64_t n_vocab,
                                            const CompletionPrompt& request, const std::string& param) {
  BuiltPrompt prompt;
  if (request.is_tokens) {
    for (int32_t id : request.tokens)
      if (id < 0 || id >= n_vocab)
        return ApiError::invalid("prompt token id " + std::to_string(id) + " is out of range (vocabulary has " +
                                     std::to_string(n_vocab) + " tokens)",
                                 param);
    prompt.tokens = request.tokens;
  } else {
    try {
      prompt.tokens = tokenize_prompt(tokenizer, request.text);
    } catch (const std::exception& e) {
      return ApiError::invalid(std::string("cannot tokenize the prompt: ") + e.what(), param);
    }
  }
  return check_length(std::move(prompt), n_ctx, param.c_str());
}

}  // namespace reprise
