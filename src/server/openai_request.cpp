#include "server/openai_request.h"

#include <charconv>
#include <cmath>
#include <limits>

#include "server/request_fields.h"
#include "util/error.h"

namespace reprise {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;
using request_fields::fail;
using request_fields::Fields;
using request_fields::guarded;
using request_fields::parse_body;
using request_fields::read_cache_salt;
using request_fields::type_name;

// Compiled once: every json_object request shares them.
std::shared_ptr<const JsonSchema> any_json_object() {
  static const auto schema = JsonSchema::any_object();
  return schema;
}
std::shared_ptr<const JsonSchema> any_json_value() {
  static const auto schema = JsonSchema::compile(nlohmann::json(true));
  return schema;
}

void parse_stop(const Fields& f, const RequestLimits& limits, std::vector<std::string>& out) {
  const ordered_json* v = f.get("stop");
  if (!v) return;
  auto add = [&](const ordered_json& s) {
    if (!s.is_string()) fail("stop must be a string or an array of strings", "stop");
    std::string text = s.get<std::string>();
    if (text.size() > limits.max_stop_bytes)
      fail("each stop string must be at most " + std::to_string(limits.max_stop_bytes) + " bytes", "stop");
    if (!text.empty()) out.push_back(std::move(text));  // "" would match everywhere: ignored
  };
  if (v->is_string()) {
    add(*v);
  } else if (v->is_array()) {
    if (v->size() > limits.max_stop_strings)
      fail("at most " + std::to_string(limits.max_stop_strings) + " stop strings are allowed", "stop");
    for (const auto& s : *v) add(s);
  } else {
    fail("stop must be a string or an array of strings", "stop");
  }
}

// Structured output: OpenAI's {"type": "json_object"} and {"type":
// "json_schema", "json_schema": {"name", "schema", "strict"}}, and
// llama.cpp's {"type": "json_object", "schema": ...}.
void parse_response_format(const ordered_json& rf, GenerationOptions& o) {
  if (!rf.is_object()) fail("response_format must be an object", "response_format");
  Fields f(rf, "response_format.");
  const std::string type = f.string("type").value_or("text");
  const ordered_json* schema = nullptr;
  std::string param = "response_format.schema";
  if (type == "text") return;
  if (type == "json_object") {
    schema = f.get("schema");
    if (!schema) {
      o.json_schema = any_json_object();
      return;
    }
  } else if (type == "json_schema") {
    const ordered_json* js = f.get("json_schema");
    if (!js || !js->is_object()) fail("response_format.json_schema must be an object", "response_format.json_schema");
    Fields jf(*js, "response_format.json_schema.");
    jf.string("name");  // type-checked; the schema is what is enforced
    jf.string("description");
    jf.boolean("strict");
    schema = jf.get("schema");
    param = "response_format.json_schema.schema";
    if (!schema) {
      o.json_schema = any_json_value();
      return;
    }
  } else {
    fail("response_format type '" + type + "' is not supported (text, json_object or json_schema)",
         "response_format.type", "unsupported_parameter");
  }
  try {
    o.json_schema = JsonSchema::compile(nlohmann::json(*schema));
  } catch (const Error& e) {
    fail(param + ": " + e.what(), param, "unsupported_schema");
  }
}

// A tool's parameters with its references moved to where the combined
// schema keeps it ("#/..." -> "#/$defs/<name>/...").
nlohmann::json rebase_refs(const nlohmann::json& schema, const std::string& base) {
  if (schema.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& v : schema) out.push_back(rebase_refs(v, base));
    return out;
  }
  if (!schema.is_object()) return schema;
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : schema.items()) {
    if (key == "$ref" && value.is_string() && value.get<std::string>().rfind('#', 0) == 0)
      out[key] = base + value.get<std::string>().substr(1);
    else if (key == "const" || key == "enum")
      out[key] = value;  // values, not schemas
    else
      out[key] = rebase_refs(value, base);
  }
  return out;
}

// tool_choice: "auto" and "none" leave the reply free ("none" still renders
// the tools); "required" and {"type": "function", "function": {"name"}}
// constrain it to one call, {"name": ..., "arguments": {...}}, of the allowed
// tools, each tool's arguments to its parameters schema.
void parse_tool_choice(const ordered_json& choice, ChatCompletionRequest& req) {
  if (choice.is_string() && (choice == "auto" || choice == "none")) {
    req.tool_choice_none = choice == "none";
    return;
  }
  std::string only;  // a named function
  if (choice.is_object()) {
    Fields cf(choice, "tool_choice.");
    if (cf.string("type").value_or("") != "function")
      fail("tool_choice.type must be \"function\"", "tool_choice.type");
    const ordered_json* fn = cf.get("function");
    if (!fn || !fn->is_object()) fail("tool_choice.function must be an object", "tool_choice.function");
    Fields ff(*fn, "tool_choice.function.");
    only = ff.string("name").value_or("");
    if (only.empty()) fail("tool_choice.function.name is required", "tool_choice.function.name");
  } else if (!choice.is_string() || choice != "required") {
    fail("tool_choice must be \"auto\", \"none\", \"required\" or a function", "tool_choice");
  }
  if (!req.tools.is_array() || req.tools.empty()) fail("tool_choice needs tools", "tool_choice");
  if (req.options.json_schema) fail("tool_choice and response_format cannot both constrain the reply", "tool_choice");
  nlohmann::json combined = {{"$defs", nlohmann::json::object()}, {"anyOf", nlohmann::json::array()}};
  for (size_t i = 0; i < req.tools.size(); ++i) {
    const std::string param = "tools[" + std::to_string(i) + "]";
    const ordered_json& tool = req.tools[i];
    const ordered_json* fn = tool.contains("function") ? &tool["function"] : nullptr;
    const bool typed_function = !tool.contains("type") || (tool["type"].is_string() && tool["type"] == "function");
    if (!typed_function || !fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
      fail(param + " must be {\"type\": \"function\", \"function\": {\"name\", ...}}", param);
    const std::string name = (*fn)["name"].get<std::string>();
    if (!only.empty() && name != only) continue;
    nlohmann::json parameters = {{"type", "object"}, {"properties", nlohmann::json::object()}};
    if (fn->contains("parameters") && !(*fn)["parameters"].is_null())
      parameters = nlohmann::json((*fn)["parameters"]);
    // Arguments are an object (OpenAI sends them as one's JSON text): a
    // schema that says nothing of its type ({} included) is an object's,
    // and one that says another type is refused, as OpenAI refuses it.
    if (!parameters.is_object() ||
        (parameters.contains("type") && parameters["type"] != "object"))
      fail(param + ".function.parameters must be an object schema (arguments are a JSON object)",
           param + ".function.parameters");
    if (!parameters.contains("type")) {
      bool bare = true;
      for (const char* k : {"$ref", "anyOf", "oneOf", "allOf", "enum", "const"}) bare = bare && !parameters.contains(k);
      if (bare) parameters["type"] = "object";
    }
    try {
      JsonSchema::compile(parameters);  // its own errors, named by its own paths
    } catch (const Error& e) {
      fail(param + ".function.parameters: " + e.what(), param + ".function.parameters", "unsupported_schema");
    }
    const std::string def = "p" + std::to_string(i);
    combined["$defs"][def] = rebase_refs(parameters, "#/$defs/" + def);
    combined["anyOf"].push_back({{"type", "object"},
                                 {"properties", {{"name", {{"const", name}}}, {"arguments", {{"$ref", "#/$defs/" + def}}}}},
                                 {"required", {"name", "arguments"}}});
  }
  if (combined["anyOf"].empty()) fail("tool_choice names no function in tools", "tool_choice.function.name");
  try {
    req.options.json_schema = JsonSchema::compile(combined);
  } catch (const Error& e) {
    fail(std::string("tools: ") + e.what(), "tools", "unsupported_schema");
  }
  req.options.tool_call_reply = true;
}

// llama.cpp's per-request adapters: [{"id": index or name, "scale": s}].
// Whether each names an adapter of the model is checked once it is leased.
void parse_lora(const Fields& f, std::vector<LoraRequest>& out) {
  const ordered_json* list = f.get("lora");
  if (!list || list->is_null()) return;
  constexpr size_t kMaxAdapters = 16;
  if (!list->is_array()) fail("lora must be an array of {\"id\", \"scale\"} objects", "lora");
  if (list->size() > kMaxAdapters) fail("lora names at most " + std::to_string(kMaxAdapters) + " adapters", "lora");
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string where = "lora[" + std::to_string(i) + "]";
    const ordered_json& entry = (*list)[i];
    if (!entry.is_object()) fail(where + " must be an object with \"id\" and \"scale\"", where);
    Fields ef(entry, where + ".");
    LoraRequest r;
    const ordered_json* id = ef.get("id");
    if (!id) fail(where + ".id is required (the adapter's index or name)", where + ".id");
    if (id->is_string()) {
      r.name = id->get<std::string>();
      if (r.name.empty()) fail(where + ".id must not be empty", where + ".id");
    } else {
      r.index = Fields::integer_value(*id, where + ".id", 0, kMaxAdapters * 1024);
    }
    if (auto v = ef.number("scale", -kLoraScaleLimit, kLoraScaleLimit)) r.scale = static_cast<float>(*v);
    out.push_back(std::move(r));
  }
}

// Fields both endpoints accept. Logprobs differ (chat: bool + top_logprobs,
// completions: an integer) and are parsed by the callers.
void parse_common(const Fields& f, const RequestLimits& limits, GenerationOptions& o) {
  constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
  if (auto v = f.string("model")) o.model = *v;
  if (auto v = f.boolean("stream")) o.stream = *v;
  if (const ordered_json* so = f.get("stream_options")) {
    if (!so->is_object()) fail("stream_options must be an object", "stream_options");
    Fields sf(*so, "stream_options.");
    if (auto v = sf.boolean("include_usage")) o.include_usage = *v;
  }
  if (auto v = f.integer("max_tokens", 0, kMaxInt)) o.max_tokens = *v;
  if (auto v = f.integer("max_completion_tokens", 0, kMaxInt)) o.max_tokens = *v;  // the newer name wins
  if (auto v = f.integer("n", 1, limits.max_choices)) o.choices = static_cast<int>(*v);

  SamplingParams& s = o.sampling;
  if (auto v = f.number("temperature", 0, 2)) s.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p", 0, 1)) {
    // OpenAI accepts 0: the nucleus is then the most likely token alone,
    // which the smallest positive top_p keeps.
    s.top_p = *v > 0 ? static_cast<float>(*v) : std::numeric_limits<float>::min();
  }
  if (auto v = f.integer("top_k", 0, std::numeric_limits<int32_t>::max())) s.top_k = static_cast<int>(*v);
  if (auto v = f.number("min_p", 0, 1)) s.min_p = static_cast<float>(*v);
  if (auto v = f.number("repeat_penalty", 0, 10)) {
    if (*v <= 0) fail("repeat_penalty must be greater than 0", "repeat_penalty");
    s.repeat_penalty = static_cast<float>(*v);
  }
  if (auto v = f.integer("repeat_last_n", 0, 1 << 20)) s.repeat_last_n = static_cast<int>(*v);
  if (const ordered_json* seed = f.get("seed")) {
    if (seed->is_number_unsigned()) {
      s.seed = seed->get<uint64_t>();
    } else {
      s.seed = static_cast<uint64_t>(
          Fields::integer_value(*seed, "seed", std::numeric_limits<int64_t>::min(), kMaxInt));
    }
    o.seed_given = true;
  }
  // Over the last repeat_last_n tokens of the prompt and the reply, as
  // llama.cpp's server applies them (docs/server.md).
  if (auto v = f.number("frequency_penalty", -2, 2)) s.frequency_penalty = static_cast<float>(*v);
  if (auto v = f.number("presence_penalty", -2, 2)) s.presence_penalty = static_cast<float>(*v);
  if (const ordered_json* bias = f.get("logit_bias")) {
    if (!bias->is_object()) fail("logit_bias must be an object", "logit_bias");
    if (bias->size() > 1024) fail("logit_bias holds at most 1024 tokens", "logit_bias");
    for (const auto& [key, value] : bias->items()) {
      const std::string param = "logit_bias." + key;
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > std::numeric_limits<int32_t>::max())
        fail("logit_bias keys must be token ids (decimal strings)", param);
      if (!value.is_number()) fail("logit_bias values must be numbers", param);
      const double b = value.get<double>();
      if (!(b >= -100 && b <= 100)) fail("logit_bias values must be in [-100, 100]", param);
      s.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
    }
  }
  if (const ordered_json* rf = f.get("response_format")) parse_response_format(*rf, o);
  parse_stop(f, limits, o.stop);
  o.cache_salt = read_cache_salt(f, limits);
  if (auto v = f.boolean("ignore_eos")) o.ignore_eos = *v;
  if (auto v = f.integer("draft_max", 0, 64)) o.draft_max = static_cast<int>(*v);
  parse_lora(f, o.lora);
  f.string("user");  // accepted (type-checked) and otherwise unused
  if (auto err = s.validate(); !err.empty()) fail(err, "");
}

// One chat message -> the normalised form the template sees.
ordered_json parse_message(const ordered_json& m, size_t index, bool& has_image, std::vector<ImageRef>& images) {
  const std::string where = "messages[" + std::to_string(index) + "]";
  if (!m.is_object()) fail(where + " must be an object, not " + type_name(m), where);
  Fields f(m, where + ".");
  auto role = f.string("role");
  if (!role) fail(where + ".role is required", where + ".role");
  std::string r = *role;
  if (r == "developer") r = "system";  // OpenAI's newer name for the system role
  if (r != "system" && r != "user" && r != "assistant" && r != "tool")
    fail(where + ".role must be one of system, developer, user, assistant, tool (got '" + *role + "')",
         where + ".role");

  ordered_json out = ordered_json::object();
  out["role"] = r;
  const ordered_json* content = f.get("content");
  if (!content) {
    if (r != "assistant") fail(where + ".content is required", where + ".content");
    out["content"] = nullptr;
  } else if (content->is_string()) {
    out["content"] = *content;
  } else if (content->is_array()) {
    std::string text;
    bool first = true;
    for (size_t j = 0; j < content->size(); ++j) {
      const ordered_json& part = (*content)[j];
      const std::string pwhere = where + ".content[" + std::to_string(j) + "]";
      if (!part.is_object()) fail(pwhere + " must be an object", pwhere);
      Fields pf(part, pwhere + ".");
      auto type = pf.string("type");
      if (!type) fail(pwhere + ".type is required", pwhere + ".type");
      if (*type == "text" || (*type == "refusal" && r == "assistant")) {
        // An assistant's refusal part (OpenAI's) is its text, as the
        // template would see a refusal written as content.
        const char* field = *type == "text" ? "text" : "refusal";
        auto t = pf.string(field);
        if (!t) fail(pwhere + "." + field + " is required", pwhere + "." + field);
        if (!first) text += "\n";
        text += *t;
        first = false;
      } else if (*type == "image_url" || *type == "input_image") {
        has_image = true;
        // OpenAI: {"type":"image_url","image_url":{"url":...}}; Responses-style
        // input_image: {"type":"input_image","image_url":"..."}.
        std::string url;
        const auto it = part.find("image_url");
        if (it != part.end() && it->is_string()) url = it->get<std::string>();
        else if (it != part.end() && it->is_object() && it->contains("url") && (*it)["url"].is_string())
          url = (*it)["url"].get<std::string>();
        else fail(pwhere + ".image_url.url is required", pwhere + ".image_url");
        images.push_back({std::move(url), pwhere + ".image_url"});
        // The image's place in the rendered prompt (see ChatCompletionRequest::images).
        if (!first) text += "\n";
        text += "<__media__>";
        first = false;
      } else {
        fail(pwhere + ": content parts of type '" + *type + "' are not supported", pwhere + ".type",
             "unsupported_content");
      }
    }
    out["content"] = text;
  } else {
    fail(where + ".content must be a string or an array of content parts, not " + type_name(*content),
         where + ".content");
  }
  if (auto v = f.string("name")) out["name"] = *v;
  if (auto v = f.string("tool_call_id")) out["tool_call_id"] = *v;
  if (auto v = f.string("reasoning_content")) out["reasoning_content"] = *v;
  if (const ordered_json* calls = f.get("tool_calls")) {
    if (!calls->is_array()) fail(where + ".tool_calls must be an array", where + ".tool_calls");
    for (const auto& call : *calls)
      if (!call.is_object()) fail(where + ".tool_calls entries must be objects", where + ".tool_calls");
    out["tool_calls"] = *calls;
  }
  return out;
}

// A prompt field: a string, an array of token ids, or a batch of either
// (at most max_batch), appended to `out`.
void read_prompts(const ordered_json& prompt, const std::string& name, size_t max_batch,
                  std::vector<CompletionPrompt>& out) {
  auto token_list = [&](const ordered_json& arr, const std::string& param) {
    CompletionPrompt p;
    p.is_tokens = true;
    if (arr.empty()) fail(param + " must not be empty", param);
    for (size_t j = 0; j < arr.size(); ++j)
      p.tokens.push_back(static_cast<int32_t>(Fields::integer_value(arr[j], param + "[" + std::to_string(j) + "]", 0,
                                                                    std::numeric_limits<int32_t>::max())));
    return p;
  };
  if (prompt.is_string()) {
    out.push_back({prompt.get<std::string>(), {}, false});
  } else if (prompt.is_array()) {
    if (prompt.empty()) fail(name + " must not be empty", name);
    const ordered_json& first = prompt[0];
    if (first.is_string() || first.is_array()) {
      // A batch: strings, or arrays of token ids.
      if (prompt.size() > max_batch) fail("at most " + std::to_string(max_batch) + " " + name + "s per request", name);
      for (size_t i = 0; i < prompt.size(); ++i) {
        const ordered_json& one = prompt[i];
        const std::string param = name + "[" + std::to_string(i) + "]";
        if (one.is_string() != first.is_string() || !(one.is_string() || one.is_array()))
          fail("a batch of " + name + "s holds strings, or arrays of token ids, not both", param);
        if (one.is_string()) out.push_back({one.get<std::string>(), {}, false});
        else out.push_back(token_list(one, param));
      }
    } else {
      out.push_back(token_list(prompt, name));
    }
  } else {
    fail(name + " must be a string, an array of token ids, or an array of those", name);
  }
}

}  // namespace

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

Parsed<TokenizeRequest> parse_tokenize_request(std::string_view body, const RequestLimits& limits) {
  return guarded<TokenizeRequest>([&]() -> Parsed<TokenizeRequest> {
    const ordered_json doc = parse_body(body, limits);
    Fields f(doc);
    TokenizeRequest req;
    if (auto v = f.string("model")) req.model = *v;
    const auto content = f.string("content");
    if (!content) fail("content is required", "content");
    req.content = *content;
    if (auto v = f.boolean("add_special")) req.add_special = *v;
    if (auto v = f.boolean("parse_special")) req.parse_special = *v;
    if (auto v = f.boolean("with_pieces")) req.with_pieces = *v;
    return req;
  });
}

Parsed<DetokenizeRequest> parse_detokenize_request(std::string_view body, const RequestLimits& limits) {
  return guarded<DetokenizeRequest>([&]() -> Parsed<DetokenizeRequest> {
    const ordered_json doc = parse_body(body, limits);
    Fields f(doc);
    DetokenizeRequest req;
    if (auto v = f.string("model")) req.model = *v;
    const ordered_json* tokens = f.get("tokens");
    if (!tokens) fail("tokens is required", "tokens");
    if (!tokens->is_array()) fail("tokens must be an array of token ids", "tokens");
    for (const auto& t : *tokens)
      req.tokens.push_back(
          static_cast<int32_t>(Fields::integer_value(t, "tokens", 0, std::numeric_limits<int32_t>::max())));
    return req;
  });
}

namespace request_fields {

ChatCompletionRequest read_chat_completion(const ordered_json& doc, const RequestLimits& limits) {
  Fields f(doc);
  ChatCompletionRequest req;
  parse_common(f, limits, req.options);

  if (auto v = f.boolean("logprobs")) req.options.logprobs = *v;
  if (auto v = f.integer("top_logprobs", 0, limits.max_top_logprobs)) {
    if (!req.options.logprobs && *v > 0)
      fail("top_logprobs requires logprobs to be true", "top_logprobs");
    req.options.top_logprobs = static_cast<int>(*v);
  }

  const ordered_json* messages = f.get("messages");
  if (!messages) fail("messages is required", "messages");
  if (!messages->is_array()) fail("messages must be an array", "messages");
  if (messages->empty()) fail("messages must not be empty", "messages");
  for (size_t i = 0; i < messages->size(); ++i) {
    bool has_image = false;
    req.messages.push_back(parse_message((*messages)[i], i, has_image, req.images));
    if (has_image && !req.first_image_message) req.first_image_message = i;
  }

  if (const ordered_json* tools = f.get("tools")) {
    if (!tools->is_array()) fail("tools must be an array", "tools");
    for (const auto& t : *tools)
      if (!t.is_object()) fail("tools entries must be objects", "tools");
    if (!tools->empty()) req.tools = *tools;
  }
  if (const ordered_json* choice = f.get("tool_choice")) parse_tool_choice(*choice, req);
  if (const ordered_json* kwargs = f.get("chat_template_kwargs")) {
    if (!kwargs->is_object()) fail("chat_template_kwargs must be an object", "chat_template_kwargs");
    // The conversation itself only comes through the validated fields.
    for (const char* reserved : {"messages", "tools", "bos_token", "eos_token"})
      if (kwargs->contains(reserved))
        fail(std::string("chat_template_kwargs must not set '") + reserved + "'", "chat_template_kwargs");
    req.template_kwargs = *kwargs;
  }
  if (auto v = f.string("reasoning_effort")) req.template_kwargs["reasoning_effort"] = *v;
  if (auto v = f.boolean("parallel_tool_calls")) req.parallel_tool_calls = *v;
  if (f.boolean("continue_final_message").value_or(false)) {
    const ordered_json& last = req.messages.back();
    if (last["role"] != "assistant" || !last["content"].is_string() || last["content"].get_ref<const std::string&>().empty() ||
        last.contains("tool_calls"))
      fail("continue_final_message needs a final assistant message with text (and no tool calls)",
           "continue_final_message");
    req.continue_final_message = true;
  }
  if (auto v = f.string("reasoning_format")) {
    if (*v != "none" && *v != "auto" && *v != "deepseek")
      fail("reasoning_format must be \"none\", \"auto\" or \"deepseek\"", "reasoning_format");
    req.options.raw_reasoning = *v == "none";
  }
  return req;
}

}  // namespace request_fields

Parsed<ChatCompletionRequest> parse_chat_completion_request(std::string_view body, const RequestLimits& limits) {
  return guarded<ChatCompletionRequest>([&]() -> Parsed<ChatCompletionRequest> {
    return request_fields::read_chat_completion(parse_body(body, limits), limits);
  });
}

Parsed<CompletionRequest> parse_completion_request(std::string_view body, const RequestLimits& limits) {
  return guarded<CompletionRequest>([&]() -> Parsed<CompletionRequest> {
    const ordered_json doc = parse_body(body, limits);
    Fields f(doc);
    CompletionRequest req;
    parse_common(f, limits, req.options);

    // Legacy completions: logprobs is the number of top alternatives (0..5).
    if (auto v = f.integer("logprobs", 0, 5)) {
      req.options.logprobs = true;
      req.options.top_logprobs = static_cast<int>(*v);
    }
    if (auto v = f.boolean("echo")) req.echo = *v;
    if (auto v = f.string("suffix"); v && !v->empty())
      fail("suffix is not supported", "suffix", "unsupported_parameter");
    if (auto v = f.integer("best_of", 1, std::numeric_limits<int64_t>::max()); v && *v != 1)
      fail("only best_of=1 is supported", "best_of", "unsupported_parameter");

    const ordered_json* prompt = f.get("prompt");
    if (!prompt) fail("prompt is required", "prompt");
    read_prompts(*prompt, "prompt", limits.max_prompts, req.prompts);
    if (req.prompts.size() * static_cast<size_t>(req.options.choices) > limits.max_prompts)
      fail("prompts x n may be at most " + std::to_string(limits.max_prompts), "n");
    return req;
  });
}

Parsed<LoraAdapterRequest> parse_lora_adapter_request(std::string_view body, const RequestLimits& limits,
                                                      bool with_path) {
  return guarded<LoraAdapterRequest>([&]() -> Parsed<LoraAdapterRequest> {
    const ordered_json doc = parse_body(body, limits);
    Fields f(doc);
    LoraAdapterRequest a;
    auto name = f.string("lora_name");
    if (!name || name->empty()) fail("lora_name is required", "lora_name");
    a.name = *name;
    if (with_path) {
      auto path = f.string("lora_path");
      if (!path || path->empty()) fail("lora_path is required", "lora_path");
      a.path = *path;
      if (auto model = f.string("model")) a.model = *model;
    }
    return a;
  });
}

Parsed<EmbeddingsRequest> parse_embeddings_request(std::string_view body, const RequestLimits& limits) {
  return guarded<EmbeddingsRequest>([&]() -> Parsed<EmbeddingsRequest> {
    const ordered_json doc = parse_body(body, limits);
    Fields f(doc);
    EmbeddingsRequest req;
    if (auto v = f.string("model")) req.model = *v;
    const ordered_json* input = f.get("input");
    if (!input) fail("input is required", "input");
    read_prompts(*input, "input", limits.max_embedding_inputs, req.inputs);
    for (size_t i = 0; i < req.inputs.size(); ++i)
      if (!req.inputs[i].is_tokens && req.inputs[i].text.empty())
        fail("input must not be an empty string", req.inputs.size() > 1 ? "input[" + std::to_string(i) + "]" : "input");
    if (auto v = f.string("encoding_format")) {
      if (*v != "float" && *v != "base64") fail("encoding_format must be \"float\" or \"base64\"", "encoding_format");
      req.base64 = *v == "base64";
    }
    if (auto v = f.integer("dimensions", 1, std::numeric_limits<int32_t>::max())) req.dimensions = *v;
    req.cache_salt = read_cache_salt(f, limits);
    parse_lora(f, req.lora);
    f.string("user");  // accepted (type-checked) and otherwise unused
    return req;
  });
}

}  // namespace reprise
