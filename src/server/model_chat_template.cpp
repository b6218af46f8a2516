#include "server/model_chat_template.h"

#include <optional>

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

void probe_chat_template(ModelChatTemplate& t, bool tokenizer_adds_bos) {
  if (!t.chat_template) return;
  using nlohmann::ordered_json;
  auto render = [&](ordered_json messages, ordered_json tools) -> std::optional<std::string> {
    ChatTemplateInputs in;
    in.messages = std::move(messages);
    in.tools = std::move(tools);
    in.bos_token = t.bos_token;
    in.eos_token = t.eos_token;
    in.tokenizer_adds_bos = tokenizer_adds_bos;
    try {
      return t.chat_template->apply(in);
    } catch (const std::exception&) {
      return std::nullopt;  // a plain chat's failure is reported, with its message, on each request
    }
  };
  t.renders_plain_chat = render(ordered_json::array({{{"role", "user"}, {"content", "Hello"}}}), nullptr).has_value();
  if (!t.renders_plain_chat) return;
  // A tool call whose arguments come as an object and as the JSON string an
  // OpenAI client sends: a template that prints the string escaped
  // (\"needle\") and the object as JSON wants objects.
  auto with_arguments = [&](ordered_json arguments) {
    const ordered_json call = {{"id", "call_1"},
                               {"type", "function"},
                               {"function", {{"name", "probe_tool"}, {"arguments", std::move(arguments)}}}};
    const ordered_json messages = ordered_json::array(
        {{{"role", "user"}, {"content", "Hello"}},
         {{"role", "assistant"}, {"content", ""}, {"tool_calls", ordered_json::array({call})}},
         {{"role", "tool"}, {"tool_call_id", "call_1"}, {"name", "probe_tool"}, {"content", "ok"}}});
    const ordered_json tools = ordered_json::array(
        {{{"type", "function"},
          {"function", {{"name", "probe_tool"},
                        {"description", "a tool"},
                        {"parameters", {{"type", "object"}, {"properties", {{"needle", {{"type", "string"}}}}}}}}}}});
    return render(messages, tools);
  };
  const auto as_object = with_arguments({{"needle", "reprise_probe"}});
  const auto as_string = with_arguments("{\"needle\": \"reprise_probe\"}");
  t.wants_object_arguments = as_object && as_object->find("\"needle\"") != std::string::npos && as_string &&
                             as_string->find("\\\"needle\\\"") != std::string::npos;
}

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
  out.tool_call_syntax = detect_tool_call_syntax(source);
  out.reasoning_tags = source.find("<think>") != std::string::npos;
  out.harmony = source.find("<|channel|>") != std::string::npos;
  try {
    out.chat_template = std::make_unique<ChatTemplate>(source);
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  probe_chat_template(out, tok.add_bos());
  return out;
}

}  // namespace reprise
