// Which chat template a served model uses, decided once at load time:
// --chat-template-file if given, else the GGUF's tokenizer.chat_template,
// else a ChatML-style fallback (documented in docs/server.md).
//
// A template that fails to parse does not stop the model from loading: text
// completions still work, and chat requests get a 500 carrying the parser's
// message.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/chat_template.h"
#include "server/tool_call_parser.h"

namespace reprise {

struct ModelBundle;

// ChatML, for models whose GGUF carries no template. Its end marker
// <|im_end|> is also a stop string, since such models may not have it as a
// token.
extern const char* const kFallbackChatTemplate;
extern const char* const kFallbackChatTemplateStop;

struct ModelChatTemplate {
  std::unique_ptr<ChatTemplate> chat_template;  // null when it failed to parse
  std::string origin;                           // "file", "gguf" or "fallback"
  std::string error;                            // parse error when chat_template is null
  std::vector<std::string> implicit_stops;      // stop strings every chat request gets
  std::string bos_token, eos_token;             // token texts the template may print
  // Whether the template renders a one-message user conversation (tried at
  // load). When it does, a later failure to render a request is that
  // request's doing (a tool without a field the template reads, a template
  // variable of the wrong type): a 400, not the server's 500.
  bool renders_plain_chat = false;
  // Whether the template prints a tool call's arguments as JSON itself
  // (`arguments | tojson`, as Qwen2.5's and Llama 3.1's do), so it needs
  // them as an object: OpenAI clients send them as a JSON string, which
  // such a template would print quoted and escaped. Templates that test
  // `is string` or concatenate the string (Qwen3, DeepSeek-R1) get it as
  // sent. Tried at load, as llama.cpp does.
  bool wants_object_arguments = false;
  // How the template teaches the model to write tool calls (read back out
  // of replies to requests with tools; tool_call_parser.h).
  ToolCallSyntax tool_call_syntax = ToolCallSyntax::None;
  // Whether the template knows `<think>` reasoning (Qwen3, QwQ,
  // DeepSeek-R1, SmolLM3): replies are split into reasoning_content and
  // content (reasoning_splitter.h).
  bool reasoning_tags = false;
  // Whether the template is gpt-oss's harmony (channels): replies are read
  // back into reasoning, content and tool calls (harmony_parser.h).
  bool harmony = false;
};

// The load-time probes behind renders_plain_chat and wants_object_arguments.
void probe_chat_template(ModelChatTemplate& t, bool tokenizer_adds_bos);

// `override_source`: the --chat-template-file contents, if any.
ModelChatTemplate load_model_chat_template(const ModelBundle& bundle, const std::optional<std::string>& override_source);

}  // namespace reprise
