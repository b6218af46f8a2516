// Tool calls a model writes in its own syntax, read back out of its reply
// (tool_choice "auto"), so that clients get message.tool_calls instead of
// the raw markup.
//
// The syntax is decided by the chat template that taught it to the model:
//   Hermes     <tool_call>{"name": ..., "arguments": {...}}</tool_call>, repeated
//              (Qwen2.5, Qwen3, Hermes, SmolLM3)
//   Mistral    [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
//   Granite    <|tool_call|>[{...}, ...]
//   Nemotron   <TOOLCALL>[{...}, ...]</TOOLCALL>
//   Llama 3.1  the whole reply is {"name": ..., "parameters": {...}}, perhaps
//              after <|python_tag|>; read only when the name is a tool the
//              request declared, so a plain JSON answer stays text
//   DeepSeek   <｜tool▁calls▁begin｜> then per call
//              <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>
//              (R1 and its distills) or <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
//              (V3.1), then <｜tool▁calls▁end｜>
//   Pythonic   the whole reply is [name(arg=value, ...), ...] with Python
//              literals as values (Llama 3.2's and Llama 4's templates),
//              perhaps inside <|python_start|>...<|python_end|>; read only
//              when every name is a declared tool
// A reply whose markup does not hold well-formed calls stays text. Markers
// inside <think>...</think> reasoning are reasoning, not calls. Call bodies
// are read as JSON values (a closing marker inside a string is text), at
// most 64 levels deep.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai_response.h"

namespace reprise {

enum class ToolCallSyntax { None, Hermes, Mistral, Granite, Nemotron, Llama3, DeepSeek, Pythonic };

// The syntax a chat template's source shows its model; None when it shows none.
ToolCallSyntax detect_tool_call_syntax(std::string_view template_source);
// The syntax's markers (to show them when a vocabulary holds them as
// control tokens).
std::vector<std::string> tool_call_markers(ToolCallSyntax syntax);
// A fresh call id in the form the syntax's templates accept: Mistral's
// templates require 9 alphanumerics, others get OpenAI's call_ + 24.
std::string make_tool_call_id(ToolCallSyntax syntax);

// The call a reply constrained to one (tool_choice "required" or named)
// holds: {"name": ..., "arguments": ...}; nullopt when the text is not one
// (a reply cut short by max_tokens). Its id takes the form `id_syntax`'s
// templates accept.
std::optional<ToolCall> forced_tool_call(std::string_view reply, ToolCallSyntax id_syntax);

struct ParsedToolCalls {
  std::string before;  // the reply's text before the first call
  std::string after;   // its text after the first call's start, outside the calls
  std::vector<ToolCall> calls;

  // The reply's text beside the calls from byte `from` of `before` on,
  // without trailing whitespace (what streaming sends after the text it
  // released; content() is all of it).
  std::string content_from(size_t from) const;
  std::string content() const { return content_from(0); }
};

// The calls in a finished reply, or nullopt when it holds none (or markup
// that does not parse: the reply is then text). `tool_names`: the request's
// tools (Llama 3.1's bare JSON is read only for these).
std::optional<ParsedToolCalls> parse_tool_calls(ToolCallSyntax syntax, std::string_view reply,
                                                const std::vector<std::string>& tool_names);

// For streaming: how much of a growing reply is text for certain (before a
// call's start or a tail that may begin one, without trailing whitespace,
// which a call would drop). Fed the whole reply so far each time; costs only
// the new bytes.
class ToolCallTextGate {
 public:
  explicit ToolCallTextGate(ToolCallSyntax syntax) : syntax_(syntax) {}
  size_t free_prefix(std::string_view reply);
  // Where the first call starts, once free_prefix has seen its marker.
  std::optional<size_t> call_start() const {
    return found_ ? std::optional<size_t>(scanned_) : std::nullopt;
  }

 private:
  ToolCallSyntax syntax_;
  size_t scanned_ = 0;   // bytes classified so far
  size_t text_end_ = 0;  // the free prefix as last returned
  bool in_think_ = false;
  bool found_ = false;   // a call starts at scanned_
};

}  // namespace reprise
