#include "server/tool_call_parser.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace reprise {

using nlohmann::ordered_json;

namespace {

constexpr int kMaxCallDepth = 64;  // JSON nesting read out of a reply
constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";

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

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }
// `s` is shorter than `marker` and begins it (more bytes may complete it).
bool may_begin(std::string_view s, std::string_view marker) {
  return !marker.empty() && s.size() < marker.size() && marker.substr(0, s.size()) == s;
}

// The end of the JSON object or array starting at `pos` (after whitespace):
// brackets balanced outside strings, at most kMaxCallDepth deep; npos when
// there is none. The text is validated by the parser afterwards.
size_t json_value_end(std::string_view s, size_t pos) {
  while (pos < s.size() && is_space(s[pos])) ++pos;
  if (pos >= s.size() || (s[pos] != '{' && s[pos] != '[')) return std::string_view::npos;
  int depth = 0;
  for (size_t i = pos; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '"') {
      for (++i; i < s.size() && s[i] != '"'; ++i)
        if (s[i] == '\\') ++i;
      if (i >= s.size()) return std::string_view::npos;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxCallDepth) return std::string_view::npos;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

// {"name": string, "arguments" | "parameters": object or JSON string} -> a call.
std::optional<ToolCall> call_from(const ordered_json& v, ToolCallSyntax syntax) {
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
  ToolCall call{make_tool_call_id(syntax), v["name"].get<std::string>(), std::move(arguments)};
  // Mistral's calls carry their own ids (9 alphanumerics): keep them.
  if (v.contains("id") && v["id"].is_string() && !v["id"].get<std::string>().empty()) call.id = v["id"];
  return call;
}

// Appends the calls `body` holds (an object, or an array of objects when
// `array`); false when it holds anything else.
bool append_calls(std::string_view body, bool array, ToolCallSyntax syntax, std::vector<ToolCall>& out) {
  const ordered_json v = ordered_json::parse(trim(body), nullptr, false);
  if (v.is_discarded()) return false;
  if (array != v.is_array()) return false;
  if (!array) {
    auto call = call_from(v, syntax);
    if (!call) return false;
    out.push_back(std::move(*call));
    return true;
  }
  if (v.empty()) return false;
  for (const auto& item : v) {
    auto call = call_from(item, syntax);
    if (!call) return false;
    out.push_back(std::move(*call));
  }
  return true;
}

}  // namespace

std::optional<ToolCall> forced_tool_call(std::string_view reply, ToolCallSyntax id_syntax) {
  const ordered_json doc = ordered_json::parse(reply, nullptr, false);
  // Arguments are an object unless a tool's schema (a $ref or a union)
  // allowed another value: any JSON value is passed on as its text.
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("name") || !doc["name"].is_string() ||
      !doc.contains("arguments"))
    return std::nullopt;
  return ToolCall{make_tool_call_id(id_syntax), doc["name"].get<std::string>(), dump_json(doc["arguments"])};
}

std::string ParsedToolCalls::content_from(size_t from) const {
  std::string text = before.substr(std::min(from, before.size())) + after;
  while (!text.empty() && is_space(text.back())) text.pop_back();
  return text;
}

ToolCallSyntax detect_tool_call_syntax(std::string_view source) {
  auto has = [&](std::string_view s) { return source.find(s) != std::string_view::npos; };
  if (has("<tool_call>")) return ToolCallSyntax::Hermes;
  if (has("[TOOL_CALLS]")) return ToolCallSyntax::Mistral;
  if (has("<|tool_call|>")) return ToolCallSyntax::Granite;
  if (has("<TOOLCALL>")) return ToolCallSyntax::Nemotron;
  if (has("<|python_tag|>") || has("\"parameters\": dictionary of argument name")) return ToolCallSyntax::Llama3;
  return ToolCallSyntax::None;
}

std::vector<std::string> tool_call_markers(ToolCallSyntax syntax) {
  const Markers m = markers_of(syntax);
  std::vector<std::string> out;
  if (!m.open.empty()) out.emplace_back(m.open);
  if (!m.close.empty()) out.emplace_back(m.close);
  return out;
}

std::string make_tool_call_id(ToolCallSyntax syntax) {
  return syntax == ToolCallSyntax::Mistral ? make_response_id("", 9) : make_response_id("call_");
}

size_t ToolCallTextGate::free_prefix(std::string_view reply) {
  if (syntax_ == ToolCallSyntax::None) return reply.size();
  if (syntax_ == ToolCallSyntax::Llama3) {
    // A call is the whole reply: text once its first visible byte shows otherwise.
    const std::string_view t = trim(reply), tag = markers_of(syntax_).open;
    if (t.empty() || t.front() == '{' || starts_with(t, tag) || may_begin(t, tag)) return 0;
    return reply.size();
  }
  const std::string_view open = markers_of(syntax_).open;
  size_t i = scanned_;
  while (!found_ && i < reply.size()) {
    const std::string_view rest = reply.substr(i);
    if (in_think_) {
      if (starts_with(rest, kThinkClose)) {
        in_think_ = false;
        i += kThinkClose.size();
      } else if (may_begin(rest, kThinkClose)) {
        break;  // wait for the bytes that tell
      } else {
        ++i;
      }
      continue;
    }
    if (starts_with(rest, kThinkOpen)) {
      in_think_ = true;
      i += kThinkOpen.size();
    } else if (starts_with(rest, open)) {
      found_ = true;
    } else if (may_begin(rest, open) || may_begin(rest, kThinkOpen)) {
      break;
    } else {
      ++i;
    }
  }
  scanned_ = i;
  size_t free = i;
  while (free > 0 && is_space(reply[free - 1])) --free;
  return free;
}

std::optional<ParsedToolCalls> parse_tool_calls(ToolCallSyntax syntax, std::string_view reply,
                                                const std::vector<std::string>& tool_names) {
  if (syntax == ToolCallSyntax::None) return std::nullopt;
  ParsedToolCalls out;
  if (syntax == ToolCallSyntax::Llama3) {
    std::string_view body = trim(reply);
    if (const std::string_view tag = markers_of(syntax).open; starts_with(body, tag)) body.remove_prefix(tag.size());
    if (json_value_end(body, 0) != body.size()) return std::nullopt;
    if (!append_calls(body, false, syntax, out.calls)) return std::nullopt;
    if (std::find(tool_names.begin(), tool_names.end(), out.calls.front().name) == tool_names.end())
      return std::nullopt;
    return out;
  }
  const Markers m = markers_of(syntax);
  // The first marker outside reasoning starts the calls.
  ToolCallTextGate gate(syntax);
  gate.free_prefix(reply);
  size_t at = gate.call_start().value_or(std::string_view::npos);
  if (at == std::string_view::npos) return std::nullopt;
  out.before = std::string(reply.substr(0, at));
  while (at != std::string_view::npos) {
    const size_t body_begin = at + m.open.size();
    const size_t body_end = json_value_end(reply, body_begin);
    if (body_end == std::string_view::npos) return std::nullopt;
    if (!append_calls(reply.substr(body_begin, body_end - body_begin), m.array, syntax, out.calls)) return std::nullopt;
    size_t next = body_end;
    if (!m.close.empty()) {
      while (next < reply.size() && is_space(reply[next])) ++next;
      if (!starts_with(reply.substr(next), m.close)) return std::nullopt;  // an unclosed call: text
      next += m.close.size();
    }
    at = m.close.empty() ? std::string_view::npos : reply.find(m.open, next);
    out.after += std::string(reply.substr(next, (at == std::string_view::npos ? reply.size() : at) - next));
  }
  return out;
}

}  // namespace reprise
