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

// Whether re-rendering a longer conversation keeps the earlier prompt as a
// prefix, so a prefix cache can reuse it. For every assistant turn that is
// followed by more messages, the conversation up to and including that turn
// is rendered without a generation prompt and compared with the rendering
// up to the next user turn with one.
struct AppendStability {
  bool stable = true;
  size_t unstable_message = 0;   // index of the first assistant turn that breaks it
  size_t divergence_offset = 0;  // first differing byte between the two renderings
  std::string problem;           // set when a rendering itself failed
};

AppendStability check_append_stability(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                                       const ChatTemplateInputs& base = {},
                                       const jinja::RenderOptions& options = {});

bool is_append_stable(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages);

}  // namespace reprise
