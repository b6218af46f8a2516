// Request -> prompt tokens: chat messages rendered with the model's chat
// template, or a completion prompt, tokenized and checked against the context.
//
// Tokenization parses special-token text (the template writes markers such
// as <|im_start|> as text) and adds BOS only when the model wants one and the
// template did not already print it, so a prompt never starts with two BOS
// tokens (llama.cpp does the same).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"
#include "server/model_chat_template.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace reprise {

struct BuiltPrompt {
  std::vector<int32_t> tokens;
  std::vector<std::string> implicit_stops;  // e.g. the fallback template's end marker
  bool opens_reasoning = false;  // the chat prompt ends inside an opened <think>
};

// Template render errors: 400 with the template's message when it rejects
// the conversation (raise_exception, bad roles), 500 when the template itself
// is broken.
Parsed<std::string> render_chat_prompt(const ModelChatTemplate& chat, const Tokenizer& tokenizer,
                                       const ChatCompletionRequest& request);

Parsed<BuiltPrompt> build_chat_prompt(const ModelChatTemplate& chat, const Tokenizer& tokenizer, int64_t n_ctx,
                                      const ChatCompletionRequest& request);
// One prompt of a completions request; `param` names it in errors.
Parsed<BuiltPrompt> build_completion_prompt(const Tokenizer& tokenizer, int64_t n_ctx, int64_t n_vocab,
                                            const CompletionPrompt& prompt, const std::string& param = "prompt");

// Whether a rendered chat prompt leaves the model inside its <think>
// reasoning (a template that knows the tags, a prompt ending in the opening
// one), so the reply starts in it.
bool chat_prompt_opens_reasoning(const ModelChatTemplate& chat, std::string_view prompt);

// Text -> tokens with the BOS rule above.
std::vector<int32_t> tokenize_prompt(const Tokenizer& tokenizer, const std::string& text);

}  // namespace reprise
