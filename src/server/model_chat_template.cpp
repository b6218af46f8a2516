#include "server/model_chat_template.h"

#include "engine/model_bundle.h"
#include "util/error.h"

namespace reprise {

const char* const kFallbackChatTemplate =
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

const char* const kFallbackChatTemplateStop = "<|im_end|>";

ModelChatTemplate load_model_chat_template(const ModelBundle& bundle, const std::optional<std::string>& override_source) {
  ModelChatTemplate out;
  const Tokenizer& tok = *bundle.tokenizer;
  if (tok.bos_id() >= 0) out.bos_token = tok.token_text(tok.bos_id());
  if (tok.eos_id() >= 0) out.eos_token = tok.token_text(tok.eos_id());

  std::string source;
  if (override_source) {
    source = *override_source;
    out.origin = "file";
  } else if (std::string from_gguf = bundle.chat_template(); !from_gguf.empty()) {
    source = std::move(from_gguf);
    out.origin = "gguf";
  } else {
    source = kFallbackChatTemplate;
    out.origin = "fallback";
    // Only when the marker is not a real end-of-generation token already.
    auto id = tok.find_token(kFallbackChatTemplateStop);
    if (!id || !tok.is_eog(*id)) out.implicit_stops.push_back(kFallbackChatTemplateStop);
  }
  try {
    out.chat_template = std::make_unique<ChatTemplate>(source);
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  if (out.chat_template) {
    ChatTemplateInputs plain;
    plain.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "Hello"}}});
    plain.bos_token = out.bos_token;
    plain.eos_token = out.eos_token;
    plain.tokenizer_adds_bos = tok.add_bos();
    try {
      out.chat_template->apply(plain);
      out.renders_plain_chat = true;
    } catch (const std::exception&) {
      // Reported, with the renderer's message, on each chat request.
    }
  }
  return out;
}

}  // namespace reprise
