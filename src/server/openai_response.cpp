#include "server/openai_response.h"

#include <sys/random.h>

#include <cerrno>
#include <stdexcept>

namespace reprise {

namespace {

ordered_json null_if_empty(const std::string& s) { return s.empty() ? ordered_json(nullptr) : ordered_json(s); }

ordered_json token_bytes(const std::string& token) {
  ordered_json bytes = ordered_json::array();
  for (unsigned char c : token) bytes.push_back(static_cast<int>(c));
  return bytes;
}

ordered_json chat_logprobs_or_null(const std::optional<std::vector<LogprobEntry>>& logprobs) {
  if (!logprobs) return nullptr;
  return chat_logprobs_json(*logprobs);
}

ordered_json meta_object(const ResponseMeta& meta, const char* object) {
  ordered_json out = ordered_json::object();
  out["id"] = meta.id;
  out["object"] = object;
  out["created"] = meta.created;
  out["model"] = meta.model;
  out["system_fingerprint"] = null_if_empty(meta.system_fingerprint);
  return out;
}

}  // namespace

ordered_json error_json(const ApiError& error) {
  ordered_json body = ordered_json::object();
  body["message"] = error.message;
  body["type"] = error.type;
  body["param"] = null_if_empty(error.param);
  body["code"] = null_if_empty(error.code);
  return ordered_json{{"error", body}};
}

ordered_json usage_json(const UsageCounts& usage) {
  ordered_json out = ordered_json::object();
  out["prompt_tokens"] = usage.prompt_tokens;
  out["completion_tokens"] = usage.completion_tokens;
  out["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  out["prompt_tokens_details"] = {{"cached_tokens", usage.cached_tokens}};
  return out;
}

ordered_json chat_logprobs_json(std::span<const LogprobEntry> entries) {
  ordered_json content = ordered_json::array();
  for (const LogprobEntry& e : entries) {
    ordered_json item = ordered_json::object();
    item["token"] = e.token;
    item["logprob"] = e.logprob;
    item["bytes"] = token_bytes(e.token);
    ordered_json top = ordered_json::array();
    for (const auto& alt : e.top)
      top.push_back({{"token", alt.token}, {"logprob", alt.logprob}, {"bytes", token_bytes(alt.token)}});
    item["top_logprobs"] = std::move(top);
    content.push_back(std::move(item));
  }
  return ordered_json{{"content", std::move(content)}, {"refusal", nullptr}};
}

namespace {

// An assistant message's choice: the fields a text reply and a tool-call
// reply share, with `message` holding the rest of the message.
ordered_json assistant_choice(int index, ordered_json content, const std::string& reasoning, ordered_json tool_calls,
                              const std::optional<std::vector<LogprobEntry>>& logprobs,
                              const std::string& finish_reason) {
  ordered_json message = ordered_json::object();
  message["role"] = "assistant";
  message["content"] = std::move(content);
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  message["refusal"] = nullptr;
  if (!tool_calls.is_null()) message["tool_calls"] = std::move(tool_calls);
  ordered_json choice = ordered_json::object();
  choice["index"] = index;
  choice["message"] = std::move(message);
  choice["logprobs"] = chat_logprobs_or_null(logprobs);
  choice["finish_reason"] = finish_reason;
  return choice;
}

}  // namespace

ordered_json chat_choice_json(int index, const std::string& text, const std::string& finish_reason,
                              const std::optional<std::vector<LogprobEntry>>& logprobs, const std::string& reasoning) {
  return assistant_choice(index, text, reasoning, nullptr, logprobs, finish_reason);
}

ordered_json chat_completion_json(const ResponseMeta& meta, ordered_json choices, const UsageCounts& usage) {
  ordered_json out = meta_object(meta, "chat.completion");
  out["choices"] = std::move(choices);
  out["usage"] = usage_json(usage);
  return out;
}

ordered_json chat_completion_json(const ResponseMeta& meta, const std::string& text, const std::string& finish_reason,
                                  const std::optional<std::vector<LogprobEntry>>& logprobs, const UsageCounts& usage) {
  return chat_completion_json(meta, ordered_json::array({chat_choice_json(0, text, finish_reason, logprobs)}), usage);
}

namespace {

ordered_json tool_call_json(const ToolCall& call, std::optional<int> index) {
  ordered_json out = ordered_json::object();
  if (index) out["index"] = *index;
  out["id"] = call.id;
  out["type"] = "function";
  out["function"] = {{"name", call.name}, {"arguments", call.arguments}};
  return out;
}

}  // namespace

ordered_json chat_tool_call_choice_json(int index, const std::string& content, const std::vector<ToolCall>& calls,
                                        const std::optional<std::vector<LogprobEntry>>& logprobs,
                                        const std::string& reasoning) {
  ordered_json tool_calls = ordered_json::array();
  for (const ToolCall& call : calls) tool_calls.push_back(tool_call_json(call, std::nullopt));
  return assistant_choice(index, null_if_empty(content), reasoning, std::move(tool_calls), logprobs, "tool_calls");
}

ordered_json chat_tool_call_completion_json(const ResponseMeta& meta, const std::string& content,
                                            const std::vector<ToolCall>& calls,
                                            const std::optional<std::vector<LogprobEntry>>& logprobs,
                                            const UsageCounts& usage) {
  return chat_completion_json(meta, ordered_json::array({chat_tool_call_choice_json(0, content, calls, logprobs)}),
                              usage);
}

ordered_json tool_call_delta(const ToolCall& call, int index) {
  return {{"tool_calls", ordered_json::array({tool_call_json(call, index)})}};
}

ordered_json chat_chunk_json(const ResponseMeta& meta, const ordered_json& delta, const std::string& finish_reason,
                             const std::optional<std::vector<LogprobEntry>>& logprobs, bool usage_null_field,
                             int index) {
  ordered_json out = meta_object(meta, "chat.completion.chunk");
  ordered_json choice = ordered_json::object();
  choice["index"] = index;
  choice["delta"] = delta;
  choice["logprobs"] = chat_logprobs_or_null(logprobs);
  choice["finish_reason"] = null_if_empty(finish_reason);
  out["choices"] = ordered_json::array({std::move(choice)});
  if (usage_null_field) out["usage"] = nullptr;
  return out;
}

ordered_json chat_usage_chunk_json(const ResponseMeta& meta, const UsageCounts& usage) {
  ordered_json out = meta_object(meta, "chat.completion.chunk");
  out["choices"] = ordered_json::array();
  out["usage"] = usage_json(usage);
  return out;
}

size_t utf8_characters(std::string_view text) {
  size_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

ordered_json completion_logprobs_json(std::span<const LogprobEntry> entries, size_t text_offset0) {
  ordered_json tokens = ordered_json::array(), token_logprobs = ordered_json::array(),
               top_logprobs = ordered_json::array(), text_offset = ordered_json::array();
  size_t offset = text_offset0;
  for (const LogprobEntry& e : entries) {
    tokens.push_back(e.token);
    text_offset.push_back(offset);
    offset += utf8_characters(e.token);
    if (!e.predicted) {
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(e.logprob);
    ordered_json top = ordered_json::object();
    for (const auto& alt : e.top) top[alt.token] = alt.logprob;
    // OpenAI's legacy shape holds the chosen token too (up to logprobs + 1
    // entries), also when it is not among the most likely.
    if (!top.contains(e.token)) top[e.token] = e.logprob;
    top_logprobs.push_back(std::move(top));
  }
  ordered_json out = ordered_json::object();
  out["tokens"] = std::move(tokens);
  out["token_logprobs"] = std::move(token_logprobs);
  out["top_logprobs"] = std::move(top_logprobs);
  out["text_offset"] = std::move(text_offset);
  return out;
}

void append_completion_logprobs(ordered_json& into, std::span<const LogprobEntry> entries, size_t text_offset0) {
  ordered_json part = completion_logprobs_json(entries, text_offset0);
  if (!into.is_object()) {
    into = std::move(part);
    return;
  }
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (auto& v : part[key]) into[key].push_back(std::move(v));
}

ordered_json completion_choice_json(int index, const std::string& text, const std::string& finish_reason,
                                   ordered_json logprobs) {
  ordered_json choice = ordered_json::object();
  choice["text"] = text;
  choice["index"] = index;
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = null_if_empty(finish_reason);
  return choice;
}

ordered_json completion_choice_json(int index, const std::string& text, const std::string& finish_reason,
                                   const std::optional<std::vector<LogprobEntry>>& logprobs, size_t text_offset0) {
  return completion_choice_json(index, text, finish_reason,
                                logprobs ? completion_logprobs_json(*logprobs, text_offset0) : ordered_json(nullptr));
}

ordered_json completion_json(const ResponseMeta& meta, ordered_json choices, const UsageCounts& usage) {
  ordered_json out = meta_object(meta, "text_completion");
  out["choices"] = std::move(choices);
  out["usage"] = usage_json(usage);
  return out;
}

ordered_json completion_json(const ResponseMeta& meta, const std::string& text, const std::string& finish_reason,
                             const std::optional<std::vector<LogprobEntry>>& logprobs, const UsageCounts& usage) {
  return completion_json(meta, ordered_json::array({completion_choice_json(0, text, finish_reason, logprobs, 0)}),
                         usage);
}

ordered_json completion_chunk_json(const ResponseMeta& meta, const std::string& text,
                                   const std::string& finish_reason,
                                   const std::optional<std::vector<LogprobEntry>>& logprobs, size_t text_offset0,
                                   bool usage_null_field, int index) {
  ordered_json out = meta_object(meta, "text_completion");
  out["choices"] = ordered_json::array({completion_choice_json(index, text, finish_reason, logprobs, text_offset0)});
  if (usage_null_field) out["usage"] = nullptr;
  return out;
}

ordered_json completion_usage_chunk_json(const ResponseMeta& meta, const UsageCounts& usage) {
  ordered_json out = meta_object(meta, "text_completion");
  out["choices"] = ordered_json::array();
  out["usage"] = usage_json(usage);
  return out;
}

std::string dump_json(const ordered_json& value) {
  try {
    return value.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  } catch (const std::exception&) {
    // Only reachable on allocation failure; a fixed body keeps the contract.
    return R"({"error":{"message":"response could not be serialised","type":"server_error","param":null,"code":null}})";
  }
}

std::string sse_event(const ordered_json& value) { return "data: " + dump_json(value) + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string typed_sse_event(const ordered_json& event) {
  return "event: " + event.value("type", std::string()) + "\ndata: " + dump_json(event) + "\n\n";
}

std::string make_response_id(const std::string& prefix, int length) {
  // Ids name stored responses (GET, previous_response_id, DELETE): they
  // are capabilities, so every character comes from the kernel's CSPRNG
  // (a seeded engine's ids would let one id reveal the others). 62 letters:
  // bytes >= 248 are redrawn so each letter is equally likely.
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  constexpr unsigned kLetters = sizeof(kAlphabet) - 1, kLimit = 256 - 256 % kLetters;
  std::string id = prefix;
  unsigned char bytes[64];
  while (static_cast<int>(id.size() - prefix.size()) < length) {
    const ssize_t got = getrandom(bytes, sizeof bytes, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) throw std::runtime_error("getrandom failed");
    for (ssize_t i = 0; i < got && static_cast<int>(id.size() - prefix.size()) < length; ++i)
      if (bytes[i] < kLimit) id += kAlphabet[bytes[i] % kLetters];
  }
  return id;
}

}  // namespace reprise
