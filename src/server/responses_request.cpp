#include "server/responses_request.h"

#include <cctype>
#include <limits>
#include <unordered_map>
#include <utility>

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

// Chat fields a Responses body may hold beside the pass-through ones.
constexpr const char* kResponsesChatFields[] = {"stop", "user", "parallel_tool_calls"};

// Features of the Responses API that need what reprise does not have
// (hosted state beyond stored responses, background jobs, prompt objects).
constexpr const char* kRefusedFields[] = {"background", "conversation", "prompt"};

// The text of a content list whose parts are all text (a tool's output, a
// system message): parts joined by "\n", as the chat parser joins them.
std::string joined_text(const ordered_json& parts, const std::string& where) {
  std::string text;
  for (size_t j = 0; j < parts.size(); ++j) {
    const std::string pwhere = where + "[" + std::to_string(j) + "]";
    const ordered_json& part = parts[j];
    if (!part.is_object()) fail(pwhere + " must be an object", pwhere);
    Fields pf(part, pwhere + ".");
    const auto type = pf.string("type");
    if (!type || (*type != "input_text" && *type != "output_text"))
      fail(pwhere + " must be a text part here (input_text)", pwhere + ".type");
    const auto t = pf.string("text");
    if (!t) fail(pwhere + ".text is required", pwhere + ".text");
    if (j > 0) text += "\n";
    text += *t;
  }
  return text;
}

// A message item's content as chat content parts; `listed` receives it as
// OpenAI lists it back (a list of typed parts).
ordered_json chat_content(const ordered_json& content, const std::string& role, const std::string& where,
                          ordered_json& listed) {
  const char* text_type = role == "assistant" ? "output_text" : "input_text";
  listed = ordered_json::array();
  if (content.is_string()) {
    listed.push_back({{"type", text_type}, {"text", content}});
    if (role == "assistant") listed.back()["annotations"] = ordered_json::array();
    return content;
  }
  if (!content.is_array()) fail(where + " must be a string or an array of content parts", where);
  ordered_json parts = ordered_json::array();
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string pwhere = where + "[" + std::to_string(j) + "]";
    const ordered_json& part = content[j];
    if (!part.is_object()) fail(pwhere + " must be an object", pwhere);
    Fields pf(part, pwhere + ".");
    const auto type = pf.string("type");
    if (!type) fail(pwhere + ".type is required", pwhere + ".type");
    if (*type == "input_text" || *type == "output_text") {
      const auto t = pf.string("text");
      if (!t) fail(pwhere + ".text is required", pwhere + ".text");
      parts.push_back({{"type", "text"}, {"text", *t}});
      listed.push_back({{"type", *type}, {"text", *t}});
      if (*type == "output_text") listed.back()["annotations"] = ordered_json::array();
    } else if (*type == "refusal" && role == "assistant") {
      const auto t = pf.string("refusal");
      if (!t) fail(pwhere + ".refusal is required", pwhere + ".refusal");
      parts.push_back({{"type", "text"}, {"text", *t}});
      listed.push_back({{"type", "refusal"}, {"refusal", *t}});
    } else if (*type == "input_image") {
      if (pf.get("file_id")) fail(pwhere + ": images by file_id are not supported (send image_url)", pwhere + ".file_id", "unsupported_parameter");
      const auto url = pf.string("image_url");
      if (!url) fail(pwhere + ".image_url is required", pwhere + ".image_url");
      const std::string detail = pf.string("detail").value_or("auto");
      parts.push_back({{"type", "image_url"}, {"image_url", {{"url", *url}}}});
      listed.push_back({{"type", "input_image"}, {"image_url", *url}, {"detail", detail}});
    } else if (*type == "input_file") {
      fail(pwhere + ": file inputs are not supported", pwhere + ".type", "unsupported_parameter");
    } else {
      fail(pwhere + ".type '" + *type + "' is not supported (input_text, input_image, output_text)", pwhere + ".type");
    }
  }
  return parts;
}

// `input` -> chat messages, and the items to list back: built from the
// fields read (nothing else a client sent is kept), with ids of the
// server's own (a client's may repeat).
void read_input(const ordered_json& input, ResponsesRequest& req) {
  if (input.is_string()) {
    req.input_messages.push_back({{"role", "user"}, {"content", input}});
    req.input_items.push_back({{"id", make_response_id("msg_")},
                               {"type", "message"},
                               {"role", "user"},
                               {"content", ordered_json::array({{{"type", "input_text"}, {"text", input}}})},
                               {"status", "completed"}});
    return;
  }
  if (!input.is_array()) fail("input must be a string or an array of items", "input");
  if (input.empty()) fail("input must not be empty", "input");
  ordered_json& messages = req.input_messages;
  std::string pending_reasoning;  // a reasoning item's text, for the next assistant message
  auto assistant_message = [&]() -> ordered_json& {
    ordered_json m = {{"role", "assistant"}, {"content", nullptr}};
    if (!pending_reasoning.empty()) m["reasoning_content"] = std::exchange(pending_reasoning, {});
    messages.push_back(std::move(m));
    return messages.back();
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string where = "input[" + std::to_string(i) + "]";
    const ordered_json& item = input[i];
    if (!item.is_object()) fail(where + " must be an object, not " + std::string(type_name(item)), where);
    Fields f(item, where + ".");
    std::string type = f.string("type").value_or(item.contains("role") ? "message" : "");
    ordered_json listed = {
        {"id", make_response_id(type == "function_call" ? "fc_" : type == "function_call_output" ? "fco_" : "msg_")},
        {"type", type}};
    if (type == "message") {
      const auto role = f.string("role");
      if (!role) fail(where + ".role is required", where + ".role");
      if (*role != "user" && *role != "assistant" && *role != "system" && *role != "developer")
        fail(where + ".role must be one of user, assistant, system, developer (got '" + *role + "')", where + ".role");
      const ordered_json* content = f.get("content");
      if (!content) fail(where + ".content is required", where + ".content");
      ordered_json parts;
      ordered_json chat = chat_content(*content, *role, where + ".content", parts);
      if (*role == "assistant") {
        assistant_message()["content"] = std::move(chat);
      } else {
        messages.push_back({{"role", *role}, {"content", std::move(chat)}});
      }
      listed["role"] = *role;
      listed["content"] = std::move(parts);
    } else if (type == "function_call") {
      const auto call_id = f.string("call_id");
      const auto name = f.string("name");
      const auto arguments = f.string("arguments");
      if (!call_id) fail(where + ".call_id is required", where + ".call_id");
      if (!name || name->empty()) fail(where + ".name is required", where + ".name");
      if (!arguments) fail(where + ".arguments is required (a JSON string)", where + ".arguments");
      // Calls join the assistant message they follow (its text, or calls
      // before them), as one chat message holds a turn's text and calls.
      ordered_json* turn = nullptr;
      if (!messages.empty() && messages.back()["role"] == "assistant" && pending_reasoning.empty())
        turn = &messages.back();
      if (!turn) turn = &assistant_message();
      if (!turn->contains("tool_calls")) (*turn)["tool_calls"] = ordered_json::array();
      (*turn)["tool_calls"].push_back(
          {{"id", *call_id}, {"type", "function"}, {"function", {{"name", *name}, {"arguments", *arguments}}}});
      listed["call_id"] = *call_id;
      listed["name"] = *name;
      listed["arguments"] = *arguments;
    } else if (type == "function_call_output") {
      const auto call_id = f.string("call_id");
      if (!call_id) fail(where + ".call_id is required", where + ".call_id");
      const ordered_json* output = f.get("output");
      if (!output) fail(where + ".output is required", where + ".output");
      std::string text;
      if (output->is_string()) text = output->get<std::string>();
      else if (output->is_array()) text = joined_text(*output, where + ".output");
      else fail(where + ".output must be a string or an array of text parts", where + ".output");
      listed["call_id"] = *call_id;
      listed["output"] = text;
      messages.push_back({{"role", "tool"}, {"tool_call_id", *call_id}, {"content", std::move(text)}});
    } else if (type == "reasoning") {
      // Its text (content, else its summary) goes to the next assistant
      // turn as reasoning_content: the template decides what to show.
      std::string text;
      for (const char* field : {"content", "summary"}) {
        const ordered_json* parts = f.get(field);
        if (!parts) continue;
        if (!parts->is_array()) fail(where + "." + field + " must be an array", where + "." + field);
        for (const ordered_json& part : *parts)
          if (part.is_object() && part.contains("text") && part["text"].is_string())
            text += (text.empty() ? "" : "\n") + part["text"].get<std::string>();
        if (!text.empty()) break;
      }
      if (!pending_reasoning.empty() && !text.empty()) pending_reasoning += "\n";
      pending_reasoning += text;
      continue;  // not listed back (OpenAI's input items have no reasoning)
    } else if (type.empty()) {
      fail(where + ".type is required", where + ".type");
    } else {
      fail(where + ".type '" + type + "' is not supported (message, function_call, function_call_output, reasoning)",
           where + ".type", "unsupported_parameter");
    }
    listed["status"] = "completed";
    req.input_items.push_back(std::move(listed));
  }
  if (messages.empty()) fail("input holds no message", "input");
}

// Function tools: {"type":"function","name",...} -> {"type":"function","function":{...}}.
ordered_json chat_tools(const ordered_json& tools) {
  if (!tools.is_array()) fail("tools must be an array", "tools");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = "tools[" + std::to_string(i) + "]";
    const ordered_json& tool = tools[i];
    if (!tool.is_object()) fail(where + " must be an object", where);
    Fields f(tool, where + ".");
    const auto type = f.string("type");
    if (!type) fail(where + ".type is required", where + ".type");
    if (*type != "function")
      fail(where + ".type '" + *type + "' is not supported (function tools only)", where + ".type",
           "unsupported_parameter");
    const auto name = f.string("name");
    if (!name || name->empty()) fail(where + ".name is required", where + ".name");
    ordered_json function = {{"name", *name}};
    if (auto d = f.string("description")) function["description"] = *d;
    if (const ordered_json* p = f.get("parameters")) function["parameters"] = *p;
    if (auto s = f.boolean("strict")) function["strict"] = *s;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

ordered_json chat_tool_choice(const ordered_json& choice) {
  if (choice.is_string()) return choice;  // auto, none, required (the chat parser checks)
  if (!choice.is_object()) fail("tool_choice must be \"auto\", \"none\", \"required\" or a function", "tool_choice");
  Fields f(choice, "tool_choice.");
  const auto type = f.string("type");
  if (type != "function")
    fail("tool_choice type '" + type.value_or("") + "' is not supported (\"auto\", \"none\", \"required\" or a function)",
         "tool_choice.type", "unsupported_parameter");
  const auto name = f.string("name");
  if (!name) fail("tool_choice.name is required", "tool_choice.name");
  return {{"type", "function"}, {"function", {{"name", *name}}}};
}

// text.format -> response_format.
ordered_json chat_response_format(const ordered_json& text) {
  if (!text.is_object()) fail("text must be an object", "text");
  Fields f(text, "text.");
  const ordered_json* format = f.get("format");
  if (!format) return nullptr;
  if (!format->is_object()) fail("text.format must be an object", "text.format");
  Fields ff(*format, "text.format.");
  const auto type = ff.string("type");
  if (!type) fail("text.format.type is required", "text.format.type");
  if (*type == "text") return nullptr;
  if (*type == "json_object") return {{"type", "json_object"}};
  if (*type != "json_schema")
    fail("text.format.type '" + *type + "' is not supported (text, json_object or json_schema)", "text.format.type",
         "unsupported_parameter");
  ordered_json schema = ordered_json::object();
  for (const char* field : {"name", "description", "schema", "strict"})
    if (const ordered_json* v = ff.get(field)) schema[field] = *v;
  if (!schema.contains("schema")) fail("text.format.schema is required", "text.format.schema");
  return {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
}

}  // namespace

ApiError in_responses_terms(ApiError error) {
  request_fields::rename_error_field(error, "response_format.json_schema", "text.format");
  request_fields::rename_error_field(error, "response_format", "text.format");
  request_fields::rename_error_field(error, "max_completion_tokens", "max_output_tokens");
  // Message indexes count the instructions and a stored conversation's
  // messages: the error names the input as a whole.
  if (error.param.rfind("messages", 0) == 0) error.param = "input";
  for (size_t at = 0; (at = error.message.find("messages", at)) != std::string::npos;) {
    size_t end = at + 8;
    while (end < error.message.size() && (error.message[end] == '[' || error.message[end] == ']' ||
                                          std::isdigit(static_cast<unsigned char>(error.message[end]))))
      ++end;
    error.message.replace(at, end - at, "input");
    at += 5;
  }
  return error;
}

Parsed<ResponsesRequest> parse_responses_request(std::string_view body, const RequestLimits& limits) {
  return guarded<ResponsesRequest>([&]() -> Parsed<ResponsesRequest> {
    const ordered_json doc = parse_body(body, limits);
    Fields f(doc);
    ResponsesRequest req;
    for (const char* field : kRefusedFields)
      if (f.get(field) && !(doc[field].is_boolean() && !doc[field].get<bool>()))
        fail(std::string(field) + " is not supported", field, "unsupported_parameter");
    ordered_json& chat = req.chat_body;
    request_fields::copy_fields(f, request_fields::kChatPassThroughFields, chat);
    request_fields::copy_fields(f, kResponsesChatFields, chat);
    if (auto v = f.boolean("store")) req.store = *v;
    req.cache_salt = request_fields::read_cache_salt(f, limits);
    if (auto v = f.string("previous_response_id")) {
      if (v->empty()) fail("previous_response_id must not be empty", "previous_response_id");
      req.previous_response_id = *v;
    }
    if (auto v = f.string("instructions")) req.instructions = *v;

    const ordered_json* input = f.get("input");
    if (!input) fail("input is required", "input");
    read_input(*input, req);

    if (auto v = f.integer("max_output_tokens", 1, std::numeric_limits<int64_t>::max()))
      chat["max_completion_tokens"] = *v;
    if (const ordered_json* tools = f.get("tools")) {
      ordered_json converted = chat_tools(*tools);
      if (!converted.empty()) chat["tools"] = std::move(converted);
    }
    if (const ordered_json* choice = f.get("tool_choice")) chat["tool_choice"] = chat_tool_choice(*choice);
    if (const ordered_json* text = f.get("text")) {
      ordered_json format = chat_response_format(*text);
      if (!format.is_null()) chat["response_format"] = std::move(format);
    }
    if (const ordered_json* reasoning = f.get("reasoning")) {
      if (!reasoning->is_object()) fail("reasoning must be an object", "reasoning");
      Fields rf(*reasoning, "reasoning.");
      if (auto effort = rf.string("effort")) chat["reasoning_effort"] = *effort;
      rf.string("summary");  // type-checked; reasoning comes back as its text, not a summary
    }
    // Logprobs: asked for with include's "message.output_text.logprobs"
    // (top_logprobs alone also asks, as OpenAI's does).
    bool logprobs = false;
    if (const ordered_json* include = f.get("include")) {
      if (!include->is_array()) fail("include must be an array of strings", "include");
      for (const ordered_json& what : *include) {
        if (!what.is_string()) fail("include must be an array of strings", "include");
        logprobs |= what == "message.output_text.logprobs";
      }
    }
    if (auto top = f.integer("top_logprobs", 0, limits.max_top_logprobs)) {
      chat["top_logprobs"] = *top;
      logprobs |= *top > 0;
    }
    if (logprobs) chat["logprobs"] = true;
    if (const ordered_json* metadata = f.get("metadata")) {
      if (!metadata->is_object() || metadata->size() > 16)
        fail("metadata must be an object of at most 16 string values", "metadata");
      for (const auto& [key, value] : metadata->items())
        if (!value.is_string() || key.size() > 64 || value.get<std::string>().size() > 512)
          fail("metadata must map keys of at most 64 characters to strings of at most 512", "metadata");
    }
    if (auto v = f.string("truncation"); v && *v != "disabled" && *v != "auto")
      fail("truncation must be \"disabled\" or \"auto\"", "truncation");

    ordered_json& e = req.echoed;
    e["instructions"] = req.instructions.empty() ? ordered_json(nullptr) : ordered_json(req.instructions);
    e["max_output_tokens"] = chat.contains("max_completion_tokens") ? chat["max_completion_tokens"] : ordered_json(nullptr);
    e["metadata"] = f.get("metadata") ? doc["metadata"] : ordered_json::object();
    e["parallel_tool_calls"] = f.boolean("parallel_tool_calls").value_or(true);
    e["previous_response_id"] =
        req.previous_response_id.empty() ? ordered_json(nullptr) : ordered_json(req.previous_response_id);
    e["reasoning"] = f.get("reasoning") ? doc["reasoning"] : ordered_json{{"effort", nullptr}, {"summary", nullptr}};
    e["store"] = req.store;
    e["text"] = f.get("text") ? doc["text"] : ordered_json{{"format", {{"type", "text"}}}};
    e["tool_choice"] = f.get("tool_choice") ? doc["tool_choice"] : ordered_json("auto");
    e["tools"] = f.get("tools") ? doc["tools"] : ordered_json::array();
    e["top_logprobs"] = chat.contains("top_logprobs") ? chat["top_logprobs"] : ordered_json(0);
    e["truncation"] = f.string("truncation").value_or("disabled");
    e["user"] = f.get("user") ? doc["user"] : ordered_json(nullptr);
    return req;
  });
}

Parsed<ChatCompletionRequest> responses_chat_request(const ResponsesRequest& request, const ordered_json& history,
                                                     const RequestLimits& limits) {
  ordered_json body = request.chat_body;
  ordered_json messages = ordered_json::array();
  if (!request.instructions.empty()) messages.push_back({{"role", "system"}, {"content", request.instructions}});
  for (const ordered_json& m : history) messages.push_back(m);
  for (const ordered_json& m : request.input_messages) messages.push_back(m);
  // A tool message names its function where the call it answers is known
  // (some templates show the name beside the result).
  std::unordered_map<std::string, ordered_json> call_names;
  for (ordered_json& m : messages) {
    if (m.contains("tool_calls"))
      for (const ordered_json& call : m["tool_calls"])
        if (call.contains("id") && call["id"].is_string() && call.contains("function") && call["function"].is_object())
          call_names[call["id"].get<std::string>()] = call["function"].value("name", ordered_json());
    if (m["role"] != "tool" || m.contains("name") || !m["tool_call_id"].is_string()) continue;
    if (auto it = call_names.find(m["tool_call_id"].get<std::string>()); it != call_names.end() && it->second.is_string())
      m["name"] = it->second;
  }
  body["messages"] = std::move(messages);
  Parsed<ChatCompletionRequest> chat = guarded<ChatCompletionRequest>(
      [&]() -> Parsed<ChatCompletionRequest> { return request_fields::read_chat_completion(body, limits); });
  if (!chat.ok()) return in_responses_terms(chat.error());
  return chat;
}

}  // namespace reprise
