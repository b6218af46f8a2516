#include "server/messages_request.h"

#include <limits>

#include "server/openai_response.h"
#include "server/request_fields.h"

namespace reprise {

namespace {

using ordered_json = nlohmann::ordered_json;
using request_fields::fail;
using request_fields::Fields;
using request_fields::guarded;
using request_fields::parse_body;
using request_fields::type_name;

// Anthropic names fields by dotted paths: messages.0.content.1.
std::string at(const std::string& where, size_t i) { return where + "." + std::to_string(i); }

// A text block's text.
std::string block_text(const Fields& f, const std::string& where) {
  const auto text = f.string("text");
  if (!text) fail(where + ".text: Field required", where + ".text");
  return *text;
}

// An image block as a chat image part: base64 sources become data: URLs
// (the server fetches no URLs).
ordered_json image_part(const ordered_json& block, const std::string& where) {
  Fields f(block, where + ".");
  const ordered_json* source = f.get("source");
  if (!source || !source->is_object()) fail(where + ".source: Field required", where + ".source");
  Fields sf(*source, where + ".source.");
  const std::string type = sf.string("type").value_or("");
  if (type != "base64")
    fail(where + ".source.type: only base64 images are supported (the server fetches no URLs)",
         where + ".source.type", "unsupported_parameter");
  const auto media = sf.string("media_type");
  const auto data = sf.string("data");
  if (!media || !data) fail(where + ".source: media_type and data are required", where + ".source");
  return {{"type", "image_url"}, {"image_url", {{"url", "data:" + *media + ";base64," + *data}}}};
}

// A tool_result block's content: a string, or text (and image) blocks.
ordered_json tool_result_content(const ordered_json* content, const std::string& where) {
  if (!content) return "";
  if (content->is_string()) return *content;
  if (!content->is_array()) fail(where + ".content: must be a string or a list of blocks", where + ".content");
  std::string text;
  for (size_t j = 0; j < content->size(); ++j) {
    const std::string bwhere = at(where + ".content", j);
    const ordered_json& block = (*content)[j];
    if (!block.is_object()) fail(bwhere + ": must be an object", bwhere);
    Fields bf(block, bwhere + ".");
    const std::string type = bf.string("type").value_or("");
    if (type != "text")
      fail(bwhere + ".type: tool results hold text here (got '" + type + "')", bwhere + ".type",
           "unsupported_parameter");
    if (!text.empty()) text += "\n";
    text += block_text(bf, bwhere);
  }
  return text;
}

// One Anthropic message -> chat messages (a user message with tool results
// is several: the tool messages, then what else it says).
void read_message(const ordered_json& m, size_t index, ordered_json& out) {
  const std::string where = at("messages", index);
  if (!m.is_object()) fail(where + ": must be an object, not " + std::string(type_name(m)), where);
  Fields f(m, where + ".");
  const auto role = f.string("role");
  if (!role || (*role != "user" && *role != "assistant"))
    fail(where + ".role: must be 'user' or 'assistant'", where + ".role");
  const ordered_json* content = f.get("content");
  if (!content) fail(where + ".content: Field required", where + ".content");
  if (content->is_string()) {
    out.push_back({{"role", *role}, {"content", *content}});
    return;
  }
  if (!content->is_array()) fail(where + ".content: must be a string or a list of blocks", where + ".content");
  ordered_json parts = ordered_json::array();
  ordered_json calls = ordered_json::array();
  std::string reasoning;
  for (size_t j = 0; j < content->size(); ++j) {
    const std::string bwhere = at(where + ".content", j);
    const ordered_json& block = (*content)[j];
    if (!block.is_object()) fail(bwhere + ": must be an object", bwhere);
    Fields bf(block, bwhere + ".");
    const auto type = bf.string("type");
    if (!type) fail(bwhere + ".type: Field required", bwhere + ".type");
    if (*type == "text") {
      parts.push_back({{"type", "text"}, {"text", block_text(bf, bwhere)}});
    } else if (*type == "image" && *role == "user") {
      parts.push_back(image_part(block, bwhere));
    } else if (*type == "tool_use" && *role == "assistant") {
      const auto id = bf.string("id");
      const auto name = bf.string("name");
      if (!id || !name || name->empty()) fail(bwhere + ": tool_use needs id and name", bwhere);
      const ordered_json* input = bf.get("input");
      if (input && !input->is_object()) fail(bwhere + ".input: must be an object", bwhere + ".input");
      calls.push_back({{"id", *id},
                       {"type", "function"},
                       {"function", {{"name", *name}, {"arguments", dump_json(input ? *input : ordered_json::object())}}}});
    } else if (*type == "tool_result" && *role == "user") {
      const auto id = bf.string("tool_use_id");
      if (!id) fail(bwhere + ".tool_use_id: Field required", bwhere + ".tool_use_id");
      bf.boolean("is_error");  // type-checked; the template sees the result's text
      out.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", tool_result_content(bf.get("content"), bwhere)}});
    } else if (*type == "thinking" && *role == "assistant") {
      const auto thinking = bf.string("thinking");
      if (!thinking) fail(bwhere + ".thinking: Field required", bwhere + ".thinking");
      reasoning += *thinking;
    } else if (*type == "redacted_thinking" && *role == "assistant") {
      // Another model's encrypted reasoning: nothing this one can read.
    } else {
      fail(bwhere + ".type: '" + *type + "' blocks are not supported in " + *role + " messages", bwhere + ".type",
           "unsupported_parameter");
    }
  }
  if (*role == "user") {
    if (!parts.empty()) out.push_back({{"role", "user"}, {"content", std::move(parts)}});
    return;
  }
  ordered_json message = {{"role", "assistant"}, {"content", parts.empty() ? ordered_json(nullptr) : std::move(parts)}};
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  out.push_back(std::move(message));
}

ordered_json chat_tools(const ordered_json& tools) {
  if (!tools.is_array()) fail("tools: must be a list", "tools");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = at("tools", i);
    if (!tools[i].is_object()) fail(where + ": must be an object", where);
    Fields f(tools[i], where + ".");
    if (auto type = f.string("type"); type && *type != "custom")
      fail(where + ".type: server tools ('" + *type + "') are not supported", where + ".type", "unsupported_parameter");
    const auto name = f.string("name");
    if (!name || name->empty()) fail(where + ".name: Field required", where + ".name");
    ordered_json function = {{"name", *name}};
    if (auto d = f.string("description")) function["description"] = *d;
    const ordered_json* schema = f.get("input_schema");
    if (!schema) fail(where + ".input_schema: Field required", where + ".input_schema");
    function["parameters"] = *schema;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

}  // namespace

ordered_json anthropic_error_json(const ApiError& error) {
  const char* type = error.status == 401   ? "authentication_error"
                     : error.status == 403 ? "permission_error"
                     : error.status == 404 ? "not_found_error"
                     : error.status == 413 ? "request_too_large"
                     : error.status == 429 ? "rate_limit_error"
                     : error.status == 503 ? "overloaded_error"
                     : error.status >= 500 ? "api_error"
                                           : "invalid_request_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", error.message}}}};
}

Parsed<MessagesRequest> parse_messages_request(std::string_view body, const RequestLimits& limits) {
  return guarded<MessagesRequest>([&]() -> Parsed<MessagesRequest> {
    const ordered_json doc = parse_body(body, limits);
    Fields f(doc);
    MessagesRequest out;
    ordered_json chat = ordered_json::object();
    for (const char* field : request_fields::kChatPassThroughFields)
      if (const ordered_json* v = f.get(field)) chat[field] = *v;
    if (auto v = f.integer("max_tokens", 1, std::numeric_limits<int64_t>::max())) chat["max_completion_tokens"] = *v;
    if (const ordered_json* stops = f.get("stop_sequences")) {
      if (!stops->is_array()) fail("stop_sequences: must be a list of strings", "stop_sequences");
      for (const ordered_json& s : *stops) {
        if (!s.is_string()) fail("stop_sequences: must be a list of strings", "stop_sequences");
        out.stop_sequences.push_back(s.get<std::string>());
      }
      chat["stop"] = *stops;
    }

    ordered_json messages = ordered_json::array();
    if (const ordered_json* system = f.get("system")) {
      std::string text;
      if (system->is_string()) {
        text = system->get<std::string>();
      } else if (system->is_array()) {
        for (size_t i = 0; i < system->size(); ++i) {
          const std::string where = at("system", i);
          if (!(*system)[i].is_object()) fail(where + ": must be an object", where);
          Fields bf((*system)[i], where + ".");
          if (bf.string("type").value_or("") != "text") fail(where + ".type: must be 'text'", where + ".type");
          if (!text.empty()) text += "\n";
          text += block_text(bf, where);
        }
      } else {
        fail("system: must be a string or a list of text blocks", "system");
      }
      if (!text.empty()) messages.push_back({{"role", "system"}, {"content", text}});
    }
    const ordered_json* list = f.get("messages");
    if (!list) fail("messages: Field required", "messages");
    if (!list->is_array() || list->empty()) fail("messages: must be a non-empty list", "messages");
    for (size_t i = 0; i < list->size(); ++i) read_message((*list)[i], i, messages);
    if (messages.empty() || messages.back()["role"] == "system") fail("messages: nothing to reply to", "messages");
    chat["messages"] = std::move(messages);

    if (const ordered_json* tools = f.get("tools")) {
      ordered_json converted = chat_tools(*tools);
      if (!converted.empty()) chat["tools"] = std::move(converted);
    }
    if (const ordered_json* choice = f.get("tool_choice")) {
      if (!choice->is_object()) fail("tool_choice: must be an object", "tool_choice");
      Fields cf(*choice, "tool_choice.");
      const std::string type = cf.string("type").value_or("");
      if (type == "auto") chat["tool_choice"] = "auto";
      else if (type == "any") chat["tool_choice"] = "required";
      else if (type == "none") chat["tool_choice"] = "none";
      else if (type == "tool") {
        const auto name = cf.string("name");
        if (!name) fail("tool_choice.name: Field required", "tool_choice.name");
        chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
      } else {
        fail("tool_choice.type: must be auto, any, tool or none", "tool_choice.type");
      }
      if (cf.boolean("disable_parallel_tool_use").value_or(false)) chat["parallel_tool_calls"] = false;
    }
    if (const ordered_json* thinking = f.get("thinking")) {
      if (!thinking->is_object()) fail("thinking: must be an object", "thinking");
      Fields tf(*thinking, "thinking.");
      const std::string type = tf.string("type").value_or("");
      if (type != "enabled" && type != "disabled") fail("thinking.type: must be enabled or disabled", "thinking.type");
      tf.integer("budget_tokens", 0, std::numeric_limits<int64_t>::max());  // type-checked; max_tokens bounds the reply
      if (!chat.contains("chat_template_kwargs") || !chat["chat_template_kwargs"].is_object())
        chat["chat_template_kwargs"] = ordered_json::object();
      chat["chat_template_kwargs"]["enable_thinking"] = type == "enabled";
    }
    if (const ordered_json* metadata = f.get("metadata"); metadata && !metadata->is_object())
      fail("metadata: must be an object", "metadata");

    Parsed<ChatCompletionRequest> parsed = parse_chat_completion_request(dump_json(chat), limits);
    if (!parsed.ok()) return parsed.error();
    out.chat = std::move(parsed.value());
    return out;
  });
}

}  // namespace reprise
