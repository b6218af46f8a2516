// Separates a thinking model's reasoning from its answer, as OpenAI-style
// clients expect them: `<think>...</think>` (Qwen3, QwQ, DeepSeek-R1 and its
// distills, SmolLM3) becomes message.reasoning_content (streamed as
// delta.reasoning_content), the rest message.content.
//
// Reasoning is what follows an opening tag at the very start of the reply
// (after whitespace), or the reply's start when the prompt already opened
// it (DeepSeek-R1's templates end the generation prompt with "<think>\n"),
// up to the closing tag; whitespace right after the closing tag is dropped.
// A reply cut off inside its reasoning is all reasoning. Text is handed on
// as it comes, except a tail that may be the start of a tag, which is held
// until the next text tells.
#pragma once
#include <string>
#include <string_view>

namespace reprise {

class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool starts_in_reasoning);

  struct Parts {
    std::string reasoning;
    std::string content;
  };
  // The parts of `text` (following what came before) that can be told now.
  Parts push(std::string_view text);
  // The rest, at the reply's end.
  Parts flush();

  // Whether a rendered chat prompt leaves the model inside its reasoning
  // (it ends with the opening tag, and perhaps whitespace).
  static bool prompt_opens_reasoning(std::string_view prompt);

 private:
  enum class State { Start, Reasoning, AfterReasoning, Content };
  State state_;
  std::string held_;  // Start: leading whitespace and a partial opening tag; Reasoning: a partial closing tag
  size_t held_whitespace_ = 0;  // Start: the leading whitespace bytes of held_ already seen
};

}  // namespace reprise
