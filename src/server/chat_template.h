// Turns an OpenAI-style conversation into a model prompt with the model's own
// Jinja chat template, passing the variables Hugging Face transformers and
// llama.cpp pass (messages, tools, add_generation_prompt, bos_token,
// eos_token, enable_thinking, date_string) so prompts match theirs exactly.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "server/jinja/template.h"

namespace reprise {

// JSON fields are ordered_json so tool schemas keep their key order into
// tojson (Python dicts are ordered); plain nlohmann::json converts implicitly.
struct ChatTemplateInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools = nullptr;  // null: the template sees tools = none
  bool add_generation_prompt = true;
  bool enable_thinking = true;  // read by Qwen3, DeepSeek-R1, SmolLM3...
  std::string bos_token, eos_token;
  // The tokenizer prepends BOS itself, so a bos_token the template renders at
  // the very start is dropped to avoid a doubled BOS (llama.cpp does this).
  bool tokenizer_adds_bos = false;
  // Extra template variables (reasoning_effort, documents, ...); they
  // override the defaults above.
  nlohmann::ordered_json extra_context = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // Parses the template; throws reprise::Error on a syntax error.
  explicit ChatTemplate(std::string source);

  // Renders the prompt; throws reprise::Error if the template fails or
  // raises (e.g. roles not alternating). The clock in `options` feeds
  // strftime_now() and date_string.
  std::string apply(const ChatTemplateInputs& inputs, const jinja::RenderOptions& options = {}) const;

  const std::string& source() const { return source_; }

  // False when the template rejects or drops a system message (Gemma 2).
  // apply() then folds system text into the next user turn, joined by a
  // newline, as llama.cpp does, instead of failing the request.
  bool supports_system_role() const { return supports_system_role_; }

 private:
  std::string render(const ChatTemplateInputs& inputs, const nlohmann::ordered_json& messages,
                     const jinja::RenderOptions& options) const;

  std::string source_;
  jinja::Template template_;
  bool supports_system_role_ = true;
};

// How a conversation's renderings relate as it grows, which decides what a
// prefix cache can reuse between turns. Let P_k be the prompt for the k-th
// assistant reply (everything before it, generation prompt on) and R_k the
// rendering through that reply (generation prompt off). An ideal template
// gives the chain P_1 <= R_1 <= P_2 <= R_2 <= ... where <= is "is a prefix of".
struct AppendStability {
  // History: every R_k is a prefix of every later rendering. This is what
  // is_append_stable() reports. False when a template re-renders earlier
  // turns once more messages follow (Qwen3 drops the empty think block of
  // earlier replies; LFM2.5 drops earlier reasoning).
  bool stable = true;
  size_t unstable_message = 0;   // the assistant message whose rendering changes later
  size_t divergence_offset = 0;  // first differing byte of the two renderings

  // Continuation: every P_k is a prefix of R_k, i.e. the reply is rendered as
  // a continuation of the prompt the model generated it from. False when the
  // template rewrites the reply (strips <think>, swaps the end marker) or
  // reshuffles history (Mistral puts the system prompt into the last user
  // turn). prompt_divergence < prompt_length means the history before the
  // reply already differed, so a cache loses far more than the reply.
  bool prompt_continues = true;
  size_t prompt_message = 0;     // the assistant message where it breaks
  size_t prompt_divergence = 0;  // first differing byte of P_k and R_k
  size_t prompt_length = 0;      // length of P_k

  std::string problem;  // set when a rendering itself failed (stable is then false)
};

AppendStability check_append_stability(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                                       const ChatTemplateInputs& base = {},
                                       const jinja::RenderOptions& options = {});

// True when re-rendering the conversation truncated after each assistant turn
// (without generation prompt) always yields a prefix of every longer
// rendering: earlier turns are never rendered differently later on.
bool is_append_stable(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages);

}  // namespace reprise
