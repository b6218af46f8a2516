#include "server/chat_template.h"

#include <chrono>
#include <ctime>

#include "util/error.h"

namespace reprise {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr const char* kSystemProbe = "<<reprise-system-probe>>";

std::time_t clock_now(const jinja::RenderOptions& options) {
  if (options.now) return options.now();
  return std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
}

// llama.cpp passes today's date as "26 Jul 2024" for Llama 3.x templates.
std::string date_string(std::time_t now) {
  std::tm local{};
  localtime_r(&now, &local);
  char buf[64];
  size_t n = std::strftime(buf, sizeof buf, "%d %b %Y", &local);
  return std::string(buf, n);
}

bool is_role(const ordered_json& message, const char* role) {
  return message.is_object() && message.contains("role") && message["role"] == role;
}

// Moves system messages into the next user turn ("system\nuser"), or into a
// user turn of their own when no user turn follows.
ordered_json fold_system_messages(const ordered_json& messages) {
  if (!messages.is_array()) return messages;
  ordered_json out = ordered_json::array();
  std::string pending;
  auto flush_as_user = [&]() {
    if (pending.empty()) return;
    out.push_back({{"role", "user"}, {"content", pending}});
    pending.clear();
  };
  for (const ordered_json& message : messages) {
    if (is_role(message, "system") && message.contains("content") && message["content"].is_string()) {
      if (!pending.empty()) pending += "\n";
      pending += message["content"].get<std::string>();
      continue;
    }
    if (!pending.empty() && is_role(message, "user") && message.contains("content") &&
        message["content"].is_string()) {
      ordered_json merged = message;
      std::string content = message["content"].get<std::string>();
      merged["content"] = content.empty() ? pending : pending + "\n" + content;
      pending.clear();
      out.push_back(std::move(merged));
      continue;
    }
    flush_as_user();
    out.push_back(message);
  }
  flush_as_user();
  return out;
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source)
    : source_(std::move(source)), template_(jinja::Template::parse(source_)) {
  // Probe once: does a system message survive rendering?
  ChatTemplateInputs probe;
  probe.messages = ordered_json::array({{{"role", "system"}, {"content", kSystemProbe}},
                                        {{"role", "user"}, {"content", "Hello"}}});
  probe.add_generation_prompt = true;
  jinja::RenderOptions limits;
  limits.max_output_bytes = 1u << 20;
  limits.max_steps = 200'000;
  try {
    supports_system_role_ = render(probe, probe.messages, limits).find(kSystemProbe) != std::string::npos;
  } catch (const Error&) {
    supports_system_role_ = false;
  }
}

std::string ChatTemplate::render(const ChatTemplateInputs& inputs, const ordered_json& messages,
                                 const jinja::RenderOptions& options) const {
  ordered_json context = ordered_json::object();
  context["messages"] = messages;
  context["tools"] = inputs.tools;
  context["add_generation_prompt"] = inputs.add_generation_prompt;
  context["bos_token"] = inputs.bos_token;
  context["eos_token"] = inputs.eos_token;
  context["enable_thinking"] = inputs.enable_thinking;
  context["date_string"] = date_string(clock_now(options));
  if (inputs.extra_context.is_object()) {
    for (auto it = inputs.extra_context.begin(); it != inputs.extra_context.end(); ++it) {
      context[it.key()] = it.value();
    }
  }
  std::string prompt = template_.render(context, options);
  if (inputs.tokenizer_adds_bos && !inputs.bos_token.empty() && prompt.starts_with(inputs.bos_token)) {
    prompt.erase(0, inputs.bos_token.size());
  }
  return prompt;
}

std::string ChatTemplate::apply(const ChatTemplateInputs& inputs, const jinja::RenderOptions& options) const {
  if (!inputs.messages.is_array()) throw Error("chat messages must be a JSON array");
  if (supports_system_role_) return render(inputs, inputs.messages, options);
  return render(inputs, fold_system_messages(inputs.messages), options);
}

AppendStability check_append_stability(const ChatTemplate& chat_template, const ordered_json& messages,
                                       const ChatTemplateInputs& base, const jinja::RenderOptions& options) {
  AppendStability result;
  if (!messages.is_array()) {
    result.stable = false;
    result.problem = "messages must be an array";
    return result;
  }
  auto render_prefix = [&](size_t count, bool generation_prompt) {
    ChatTemplateInputs inputs = base;
    inputs.messages = ordered_json::array();
    for (size_t i = 0; i < count; ++i) inputs.messages.push_back(messages[i]);
    inputs.add_generation_prompt = generation_prompt;
    return chat_template.apply(inputs, options);
  };
  const size_t n = messages.size();
  for (size_t i = 0; i + 1 < n; ++i) {
    if (!is_role(messages[i], "assistant")) continue;
    size_t next_user = i + 1;
    while (next_user < n && !is_role(messages[next_user], "user")) ++next_user;
    size_t count = next_user < n ? next_user + 1 : n;
    bool generation_prompt = next_user < n || !is_role(messages[n - 1], "assistant");
    std::string truncated, longer;
    try {
      truncated = render_prefix(i + 1, false);
      longer = render_prefix(count, generation_prompt);
    } catch (const Error& e) {
      result.stable = false;
      result.unstable_message = i;
      result.problem = e.what();
      return result;
    }
    if (!longer.starts_with(truncated)) {
      size_t k = 0;
      while (k < truncated.size() && k < longer.size() && truncated[k] == longer[k]) ++k;
      result.stable = false;
      result.unstable_message = i;
      result.divergence_offset = k;
      return result;
    }
  }
  return result;
}

bool is_append_stable(const ChatTemplate& chat_template, const ordered_json& messages) {
  return check_append_stability(chat_template, messages).stable;
}

}  // namespace reprise
