#include "server/messages_request.h"

#include <algorithm>
#include <limits>

#include "server/messages_output.h"
#include "server/openai_response.h"
#include "server/request_fields.h"
#include "vision/multimodal_prompt.h"

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

// A tool_result block's content as the tool message's text: a string, or
// text and image blocks (the images go to `images`, for the user message
// after the tool messages: a chat tool message holds text only).
std::string tool_result_content(const ordered_json* content, const std::string& where, ordered_json& images) {
  if (!content) return "";
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) fail(where + ".content: must be a string or a list of blocks", where + ".content");
  std::string text;
  for (size_t j = 0; j < content->size(); ++j) {
    const std::string bwhere = at(where + ".content", j);
    const ordered_json& block = (*content)[j];
    if (!block.is_object()) fail(bwhere + ": must be an object", bwhere);
    Fields bf(block, bwhere + ".");
    const std::string type = bf.string("type").value_or("");
    if (type == "image") {
      images.push_back(image_part(block, bwhere));
      continue;
    }
    if (type != "text")
      fail(bwhere + ".type: tool results hold text and images (got '" + type + "')", bwhere + ".type",
           "unsupported_parameter");
    if (!text.empty()) text += "\n";
    text += block_text(bf, bwhere);
  }
  return text;
}

// One Anthropic message -> chat messages (a user message with tool results
// is several: the tool messages, a user message with their images, then
// what else it says). The index of a message holding only tool results'
// images goes to request.tool_image_messages; a user's own image sets
// request.user_images.
void read_message(const ordered_json& m, size_t index, ordered_json& out, MessagesRequest& request) {
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
  ordered_json tool_images = ordered_json::array();
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
      request.user_images = true;
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
      std::string result = tool_result_content(bf.get("content"), bwhere, tool_images);
      // A failed call's result says so (the template has no other way to).
      if (bf.boolean("is_error").value_or(false)) result = "Error: " + result;
      out.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", std::move(result)}});
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
    if (!tool_images.empty()) {
      request.tool_image_messages.push_back(out.size());
      out.push_back({{"role", "user"}, {"content", std::move(tool_images)}});
    }
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

// An error the chat parser found, in the Messages API's terms.
ApiError in_messages_terms(ApiError error) {
  auto rename = [&](const std::string& from, const std::string& to) {
    request_fields::rename_error_field(error, from, to);
  };
  rename("response_format.json_schema.schema", "output_config.format.schema");
  rename("max_completion_tokens", "max_tokens");
  rename("stop strings", "stop_sequences");
  if (error.param == "stop") error.param = "stop_sequences";
  if (error.param.rfind("tools[", 0) == 0) error.param = "tools";
  if (error.param.rfind("messages[", 0) == 0) error.param = "messages";
  // Anthropic's errors carry no param: the message names the field.
  if (!error.param.empty() && error.message.find(error.param) == std::string::npos)
    error.message = error.param + ": " + error.message;
  return error;
}

}  // namespace

bool drop_tool_result_images(MessagesRequest& request) {
  if (request.user_images) return false;
  ChatCompletionRequest& chat = request.chat;
  const std::string marker(kMediaMarker);
  for (size_t k : request.tool_image_messages) {
    std::string text = chat.messages[k]["content"].get<std::string>();
    for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at))
      text.replace(at, marker.size(), "[image]");
    chat.messages[k]["content"] = std::move(text);
  }
  chat.images.clear();
  chat.first_image_message.reset();
  return true;
}

Parsed<MessagesRequest> parse_messages_request(std::string_view body, const RequestLimits& limits) {
  return guarded<MessagesRequest>([&]() -> Parsed<MessagesRequest> {
    const ordered_json doc = parse_body(body, limits);
    Fields f(doc);
    MessagesRequest out;
    ordered_json chat = ordered_json::object();
    request_fields::copy_fields(f, request_fields::kChatPassThroughFields, chat);
    if (auto v = f.integer("max_tokens", 1, std::numeric_limits<int64_t>::max())) chat["max_completion_tokens"] = *v;
    if (const ordered_json* stops = f.get("stop_sequences")) {
      if (!stops->is_array()) fail("stop_sequences: must be a list of strings", "stop_sequences");
      for (const ordered_json& s : *stops)
        if (!s.is_string()) fail("stop_sequences: must be a list of strings", "stop_sequences");
      chat["stop"] = *stops;
    }
    for (const char* field : {"mcp_servers", "container"})
      if (f.get(field)) fail(std::string(field) + ": not supported", field, "unsupported_parameter");
    // Structured output: output_config.format (what the SDK's parse() sends).
    if (const ordered_json* config = f.get("output_config")) {
      if (!config->is_object()) fail("output_config: must be an object", "output_config");
      Fields of(*config, "output_config.");
      if (auto effort = of.string("effort")) chat["reasoning_effort"] = *effort;
      if (const ordered_json* format = of.get("format")) {
        if (!format->is_object()) fail("output_config.format: must be an object", "output_config.format");
        Fields ff(*format, "output_config.format.");
        if (ff.string("type").value_or("") != "json_schema")
          fail("output_config.format.type: must be json_schema", "output_config.format.type");
        const ordered_json* schema = ff.get("schema");
        if (!schema) fail("output_config.format.schema: Field required", "output_config.format.schema");
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", *schema}}}};
      }
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
    for (size_t i = 0; i < list->size(); ++i) read_message((*list)[i], i, messages, out);
    if (messages.empty() || messages.back()["role"] == "system") fail("messages: nothing to reply to", "messages");
    // A final assistant message is a prefill: the reply continues it.
    if (messages.back()["role"] == "assistant") {
      ordered_json& last = messages.back();
      if (last.contains("tool_calls")) fail("messages: a final assistant message cannot hold tool_use", "messages");
      // Its text parts, joined as the chat parser joins them.
      std::string text;
      if (last["content"].is_array())
        for (const ordered_json& part : last["content"]) text += (text.empty() ? "" : "\n") + part["text"].get<std::string>();
      else if (last["content"].is_string()) text = last["content"].get<std::string>();
      if (text.empty()) fail("messages: a final assistant message needs text to continue", "messages");
      last["content"] = text;
      chat["continue_final_message"] = true;
    }
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
      // adaptive / between_tools: the model thinks when it will (it may).
      if (type != "enabled" && type != "disabled" && type != "adaptive" && type != "between_tools")
        fail("thinking.type: must be enabled, disabled, adaptive or between_tools", "thinking.type");
      tf.integer("budget_tokens", 0, std::numeric_limits<int64_t>::max());  // type-checked; max_tokens bounds the reply
      if (!chat.contains("chat_template_kwargs")) chat["chat_template_kwargs"] = ordered_json::object();
      if (!chat["chat_template_kwargs"].is_object()) fail("chat_template_kwargs: must be an object", "chat_template_kwargs");
      chat["chat_template_kwargs"]["enable_thinking"] = type != "disabled";
    }
    if (const ordered_json* metadata = f.get("metadata"); metadata && !metadata->is_object())
      fail("metadata: must be an object", "metadata");

    Parsed<ChatCompletionRequest> parsed = guarded<ChatCompletionRequest>(
        [&]() -> Parsed<ChatCompletionRequest> { return request_fields::read_chat_completion(chat, limits); });
    if (!parsed.ok()) return in_messages_terms(parsed.error());
    out.chat = std::move(parsed.value());
    return out;
  });
}

}  // namespace reprise
