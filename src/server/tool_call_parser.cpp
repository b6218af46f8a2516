#include "server/tool_call_parser.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace reprise {

using nlohmann::ordered_json;

namespace {

struct Markers {
  std::string_view open, close;  // close empty: the call list runs to the end
  bool array;                    // the calls are a JSON array (else one object per block)
};

Markers markers_of(ToolCallSyntax s) {
  switch (s) {
    case ToolCallSyntax::Hermes: return {"<tool_call>", "</tool_call>", false};
    case ToolCallSyntax::Mistral: return {"[TOOL_CALLS]", "", true};
    case ToolCallSyntax::Granite: return {"<|tool_call|>", "", true};
    case ToolCallSyntax::Nemotron: return {"<TOOLCALL>", "</TOOLCALL>", true};
    case ToolCallSyntax::Llama3: return {"<|python_tag|>", "", false};
    default: return {"", "", false};
  }
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// {"name": string, "arguments" | "parameters": object or JSON string} -> a call.
std::optional<ToolCall> call_from(const ordered_json& v) {
  if (!v.is_object() || !v.contains("name") || !v["name"].is_string() || v["name"].get<std::string>().empty())
    return std::nullopt;
  const char* key = v.contains("arguments") ? "arguments" : v.contains("parameters") ? "parameters" : nullptr;
  std::string arguments = "{}";
  if (key) {
    const ordered_json& a = v[key];
    if (a.is_object()) arguments = dump_json(a);
    else if (a.is_string()) arguments = a.get<std::string>();
    else return std::nullopt;
  }
  ToolCall call{make_response_id("call_"), v["name"].get<std::string>(), std::move(arguments)};
  // Mistral's calls carry their own ids (9 alphanumerics): keep them.
  if (v.contains("id") && v["id"].is_string() && !v["id"].get<std::string>().empty()) call.id = v["id"];
  return call;
}

// Appends the calls `body` holds (an object, or an array of objects when
// `array`); false when it holds anything else.
bool append_calls(std::string_view body, bool array, std::vector<ToolCall>& out) {
  const ordered_json v = ordered_json::parse(trim(body), nullptr, false);
  if (v.is_discarded()) return false;
  if (array != v.is_array()) return false;
  if (!array) {
    auto call = call_from(v);
    if (!call) return false;
    out.push_back(std::move(*call));
    return true;
  }
  if (v.empty()) return false;
  for (const auto& item : v) {
    auto call = call_from(item);
    if (!call) return false;
    out.push_back(std::move(*call));
  }
  return true;
}

}  // namespace

std::string ParsedToolCalls::content() const { return std::string(trim(before + after)); }
std::string ParsedToolCalls::trailing() const { return std::string(trim(after)); }

ToolCallSyntax detect_tool_call_syntax(std::string_view source) {
  auto has = [&](std::string_view s) { return source.find(s) != std::string_view::npos; };
  if (has("<tool_call>")) return ToolCallSyntax::Hermes;
  if (has("[TOOL_CALLS]")) return ToolCallSyntax::Mistral;
  if (has("<|tool_call|>")) return ToolCallSyntax::Granite;
  if (has("<TOOLCALL>")) return ToolCallSyntax::Nemotron;
  if (has("<|python_tag|>") || has("\"parameters\": dictionary of argument name")) return ToolCallSyntax::Llama3;
  return ToolCallSyntax::None;
}

const char* tool_call_syntax_name(ToolCallSyntax s) {
  switch (s) {
    case ToolCallSyntax::Hermes: return "hermes";
    case ToolCallSyntax::Mistral: return "mistral";
    case ToolCallSyntax::Granite: return "granite";
    case ToolCallSyntax::Nemotron: return "nemotron";
    case ToolCallSyntax::Llama3: return "llama3";
    default: return "none";
  }
}

std::optional<ParsedToolCalls> parse_tool_calls(ToolCallSyntax syntax, std::string_view reply,
                                                const std::vector<std::string>& tool_names) {
  if (syntax == ToolCallSyntax::None) return std::nullopt;
  ParsedToolCalls out;
  if (syntax == ToolCallSyntax::Llama3) {
    std::string_view body = trim(reply);
    if (body.substr(0, 14) == "<|python_tag|>") body.remove_prefix(14);
    if (!append_calls(body, false, out.calls)) return std::nullopt;
    if (std::find(tool_names.begin(), tool_names.end(), out.calls.front().name) == tool_names.end())
      return std::nullopt;
    return out;
  }
  const Markers m = markers_of(syntax);
  size_t at = reply.find(m.open);
  if (at == std::string_view::npos) return std::nullopt;
  out.before = std::string(reply.substr(0, at));
  while (at != std::string_view::npos) {
    const size_t body_begin = at + m.open.size();
    size_t body_end = reply.size(), next = reply.size();
    if (!m.close.empty()) {
      body_end = reply.find(m.close, body_begin);
      if (body_end == std::string_view::npos) return std::nullopt;  // an unclosed call: text
      next = body_end + m.close.size();
    }
    if (!append_calls(reply.substr(body_begin, body_end - body_begin), m.array, out.calls)) return std::nullopt;
    at = m.close.empty() ? std::string_view::npos : reply.find(m.open, next);
    out.after += std::string(reply.substr(next, (at == std::string_view::npos ? reply.size() : at) - next));
  }
  return out;
}

size_t tool_call_free_prefix(ToolCallSyntax syntax, std::string_view reply) {
  if (syntax == ToolCallSyntax::None) return reply.size();
  if (syntax == ToolCallSyntax::Llama3) {
    // A call is the whole reply: text once its first visible byte shows otherwise.
    const std::string_view t = trim(reply);
    if (t.empty()) return 0;
    constexpr std::string_view tag = "<|python_tag|>";
    if (t.front() == '{' || tag.substr(0, std::min(tag.size(), t.size())) == t.substr(0, tag.size())) return 0;
    return reply.size();
  }
  const std::string_view open = markers_of(syntax).open;
  if (const size_t at = reply.find(open); at != std::string_view::npos) return at;
  // Hold back a tail that is the start of the marker.
  for (size_t keep = std::min(open.size() - 1, reply.size()); keep > 0; --keep)
    if (reply.substr(reply.size() - keep) == open.substr(0, keep)) return reply.size() - keep;
  return reply.size();
}

}  // namespace reprise
