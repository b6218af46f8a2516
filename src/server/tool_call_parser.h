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
// A reply whose markup does not hold well-formed calls stays text.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai_response.h"

namespace reprise {

enum class ToolCallSyntax { None, Hermes, Mistral, Granite, Nemotron, Llama3 };

// The syntax a chat template's source shows its model; None when it shows none.
ToolCallSyntax detect_tool_call_syntax(std::string_view template_source);
const char* tool_call_syntax_name(ToolCallSyntax syntax);

struct ParsedToolCalls {
  std::string before;  // the reply's text before the first call
  std::string after;   // its text after the first call's start, outside the calls
  std::vector<ToolCall> calls;

  // The reply's text beside the calls, and the part after the first call's
  // start, without surrounding whitespace.
  std::string content() const;
  std::string trailing() const;
};

// The calls in a finished reply, or nullopt when it holds none (or markup
// that does not parse: the reply is then text). `tool_names`: the request's
// tools (Llama 3.1's bare JSON is read only for these).
std::optional<ParsedToolCalls> parse_tool_calls(ToolCallSyntax syntax, std::string_view reply,
                                                const std::vector<std::string>& tool_names);

// For streaming: how many leading bytes of the reply so far are text for
// certain (before a call's start, or before a tail that may begin one).
size_t tool_call_free_prefix(ToolCallSyntax syntax, std::string_view reply);

}  // namespace reprise
