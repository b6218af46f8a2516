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

namespace {

size_t common_prefix(const std::string& a, const std::string& b) {
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  return k;
}

}  // namespace

AppendStability check_append_stability(const ChatTemplate& chat_template, const ordered_json& messages,
                                       const ChatTemplateInputs& base, const jinja::RenderOptions& options) {
  AppendStability result;
  if (!messages.is_array()) {
    result.stable = result.prompt_continues = false;
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
  // Every rendering a growing conversation goes through, in order: the
  // prompt before each reply, the rendering through each reply, and the
  // whole conversation at the end.
  struct Rendering {
    size_t message;  // assistant message it belongs to
    bool with_reply;
    std::string text;
  };
  std::vector<Rendering> chain;
  const size_t n = messages.size();
  size_t current = 0;
  try {
    for (size_t i = 1; i < n; ++i) {
      if (!is_role(messages[i], "assistant")) continue;
      current = i;
      chain.push_back({i, false, render_prefix(i, true)});
      chain.push_back({i, true, render_prefix(i + 1, false)});
    }
    if (n > 0 && !chain.empty() && chain.back().message + 1 < n) {
      chain.push_back({n, false, render_prefix(n, !is_role(messages[n - 1], "assistant"))});
    }
  } catch (const Error& e) {
    result.stable = result.prompt_continues = false;
    result.unstable_message = result.prompt_message = current;
    result.problem = e.what();
    return result;
  }
  for (size_t a = 0; a < chain.size(); ++a) {
    if (!chain[a].with_reply) continue;
    const std::string& reply = chain[a].text;
    const std::string& prompt = chain[a - 1].text;  // P_k precedes R_k
    if (result.prompt_continues && !reply.starts_with(prompt)) {
      result.prompt_continues = false;
      result.prompt_message = chain[a].message;
      result.prompt_divergence = common_prefix(prompt, reply);
      result.prompt_length = prompt.size();
    }
    for (size_t b = a + 1; b < chain.size() && result.stable; ++b) {
      if (!chain[b].text.starts_with(reply)) {
        result.stable = false;
        result.unstable_message = chain[a].message;
        result.divergence_offset = common_prefix(reply, chain[b].text);
      }
    }
  }
  return result;
}

bool is_append_stable(const ChatTemplate& chat_template, const ordered_json& messages) {
  return check_append_stability(chat_template, messages).stable;
}

}  // namespace reprise
