// gpt-oss's "harmony" replies read back into OpenAI's fields. The model
// writes messages on channels, separated by control tokens (shown as text
// for this):
//   <|channel|>analysis<|message|>reasoning...<|end|>
//   <|start|>assistant<|channel|>final<|message|>the answer
//   <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{args}<|call|>
// (the recipient may also stand before <|channel|>). The analysis channel
// becomes reasoning_content, final (and commentary without a recipient)
// content, and messages to functions.NAME tool calls. A reply without
// harmony markup is content as written. Text is handed on as it comes,
// except a tail that may begin a marker; a tool call's arguments are held
// until its message ends.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai_response.h"

namespace reprise {

class HarmonyStream {
 public:
  // `read_calls`: messages to functions become calls (the request has
  // tools); otherwise their arguments are content, as written.
  explicit HarmonyStream(bool read_calls = true) : read_calls_(read_calls) {}

  struct Parts {
    std::string reasoning;
    std::string content;
  };
  // The parts of `text` (following what came before) that can be told now.
  Parts push(std::string_view text);
  // The rest, at the reply's end. `complete`: the model ended the reply (a
  // message then ends with it: gpt-oss's <|call|> and <|return|> are
  // end-of-generation tokens, not shown); otherwise it was cut short, and
  // a call cut short is content, as written. A header cut short is markup
  // and is dropped.
  Parts flush(bool complete);
  // The calls whose messages have ended, in order (ids made for `id_syntax`
  // are the caller's; these have none).
  const std::vector<ToolCall>& calls() const { return calls_; }

  // The harmony markers (to show them when a vocabulary holds them as
  // control tokens).
  static const std::vector<std::string>& markers();

 private:
  enum class State { Header, Body, Between };
  enum class Channel { Reasoning, Content, Call };
  State state_ = State::Header;  // the prompt ended with <|start|>assistant
  Channel channel_ = Channel::Content;
  std::string header_;     // the current message's header so far
  std::string call_name_;  // the current message's function
  std::string call_body_;  // its arguments so far
  std::string held_;       // a tail that may begin a marker
  bool raw_ = false;       // no harmony markup: everything is content
  bool first_ = true;      // before the reply's first byte
  bool first_message_ = true;  // no message has ended yet
  const bool read_calls_;
  std::vector<ToolCall> calls_;

  void take(std::string_view text, Parts& out);
  void end_message();
  void begin_body();
};

}  // namespace reprise
