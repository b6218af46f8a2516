#include "server/tool_call_parser.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "server/jinja/text.h"

namespace reprise {

using nlohmann::ordered_json;

namespace {

constexpr int kMaxCallDepth = 64;  // JSON nesting read out of a reply
constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
// DeepSeek's markers (full-width bars and "▁" in the vocabulary's pieces).
constexpr std::string_view kDeepSeekCallsBegin = "<｜tool▁calls▁begin｜>", kDeepSeekCallsEnd = "<｜tool▁calls▁end｜>",
                           kDeepSeekCallBegin = "<｜tool▁call▁begin｜>", kDeepSeekCallEnd = "<｜tool▁call▁end｜>",
                           kDeepSeekSep = "<｜tool▁sep｜>";

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
    case ToolCallSyntax::DeepSeek: return {kDeepSeekCallsBegin, kDeepSeekCallsEnd, false};
    case ToolCallSyntax::Pythonic: return {"<|python_start|>", "<|python_end|>", true};
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

// A tool name as a model writes it: no spaces or control characters.
bool plain_name(std::string_view name) {
  if (name.empty()) return false;
  for (unsigned char c : name)
    if (c <= ' ' || c == 0x7f) return false;
  return true;
}

// DeepSeek's calls from `pos` (just after <｜tool▁calls▁begin｜>) to the
// end of <｜tool▁calls▁end｜>, whose position after it is returned (npos
// when the text is not such a list). Each call is
// <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜> (R1
// and its distills) or <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜> (V3.1);
// the arguments are read as a JSON object, so markers inside its strings
// are text.
size_t read_deepseek_calls(std::string_view reply, size_t pos, std::vector<ToolCall>& out) {
  constexpr size_t npos = std::string_view::npos;
  auto skip_space = [&] {
    while (pos < reply.size() && is_space(reply[pos])) ++pos;
  };
  auto take = [&](std::string_view marker) {
    skip_space();
    if (!starts_with(reply.substr(pos), marker)) return false;
    pos += marker.size();
    return true;
  };
  size_t calls = 0;
  while (!take(kDeepSeekCallsEnd)) {
    if (!take(kDeepSeekCallBegin)) return npos;
    const size_t sep = reply.find(kDeepSeekSep, pos);
    if (sep == npos) return npos;
    std::string_view name = trim(reply.substr(pos, sep - pos));
    pos = sep + kDeepSeekSep.size();
    skip_space();
    // R1 writes the type, then the name on the line after the separator
    // (V3.1 writes the name, then the arguments: also for a tool named
    // "function", whose arguments open with '{').
    if (name == "function" && pos < reply.size() && reply[pos] != '{') {
      const size_t nl = reply.find('\n', pos);
      if (nl == npos) return npos;
      name = trim(reply.substr(pos, nl - pos));
      pos = nl + 1;
      skip_space();
    }
    if (!plain_name(name)) return npos;
    const bool fenced = starts_with(reply.substr(pos), "```");
    if (fenced) {
      const size_t nl = reply.find('\n', pos);
      if (nl == npos) return npos;
      pos = nl + 1;
    }
    const size_t args_end = json_value_end(reply, pos);
    if (args_end == npos) return npos;
    const ordered_json args = ordered_json::parse(reply.substr(pos, args_end - pos), nullptr, false);
    if (args.is_discarded() || !args.is_object()) return npos;
    pos = args_end;
    if ((fenced && !take("```")) || !take(kDeepSeekCallEnd)) return npos;
    out.push_back(ToolCall{make_tool_call_id(ToolCallSyntax::DeepSeek), std::string(name), dump_json(args)});
    ++calls;
  }
  return calls > 0 ? pos : npos;
}

// A reader of Python call lists: [name(key=literal, ...), ...], literals
// being strings, numbers, True/False/None, lists, tuples and dicts, read
// into JSON values.
class PythonicReader {
 public:
  explicit PythonicReader(std::string_view s) : s_(s) {}

  bool calls(std::vector<ToolCall>& out) {
    if (!take('[')) return false;
    if (take(']')) return false;  // no calls
    do {
      if (peek(']')) break;  // a trailing comma
      std::string name;
      ordered_json args = ordered_json::object();
      if (!dotted_name(name) || !take('(')) return false;
      do {
        if (peek(')')) break;  // none, or a trailing comma
        std::string key;
        ordered_json value;
        if (!identifier(key) || !take('=') || !literal(value, 0)) return false;
        if (args.contains(key)) return false;  // a keyword given twice: Python's SyntaxError
        args[key] = std::move(value);
      } while (take(','));
      if (!take(')')) return false;
      out.push_back(ToolCall{make_tool_call_id(ToolCallSyntax::Pythonic), name, dump_json(args)});
    } while (take(','));
    if (!take(']')) return false;
    skip_space();
    return pos_ == s_.size();
  }

 private:
  void skip_space() {
    while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
  }
  bool take(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  bool peek(char c) {
    skip_space();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  static bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
  bool identifier(std::string& out) {
    skip_space();
    const size_t start = pos_;
    while (pos_ < s_.size() && (word_char(s_[pos_]) || (pos_ > start && s_[pos_] == '-'))) ++pos_;
    if (pos_ == start || std::isdigit(static_cast<unsigned char>(s_[start]))) return false;
    out = std::string(s_.substr(start, pos_ - start));
    return true;
  }
  bool dotted_name(std::string& out) {  // tool names may hold dots (namespaces)
    if (!identifier(out)) return false;
    std::string part;
    while (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!identifier(part)) return false;
      out += "." + part;
    }
    return true;
  }
  bool literal(ordered_json& out, int depth) {
    if (depth > kMaxCallDepth) return false;
    skip_space();
    if (pos_ >= s_.size()) return false;
    const char c = s_[pos_];
    if (c == '\'' || c == '"') {
      std::string text;
      if (!string_literal(text)) return false;
      out = std::move(text);
      return true;
    }
    if (c == '[' || c == '(') {
      const char close = c == '[' ? ']' : ')';
      ++pos_;
      out = ordered_json::array();
      if (take(close)) return true;
      bool comma = false;
      do {
        if (peek(close)) break;  // a trailing comma
        ordered_json item;
        if (!literal(item, depth + 1)) return false;
        out.push_back(std::move(item));
        comma = peek(',');
      } while (take(','));
      if (!take(close)) return false;
      // (x) is x; only (x,) is a tuple.
      if (close == ')' && out.size() == 1 && !comma) out = ordered_json(out[0]);
      return true;
    }
    if (c == '{') {
      ++pos_;
      out = ordered_json::object();
      if (take('}')) return true;
      do {
        skip_space();
        if (pos_ < s_.size() && s_[pos_] == '}') break;
        std::string key;
        ordered_json value;
        if (!string_literal(key) || !take(':') || !literal(value, depth + 1)) return false;
        out[key] = std::move(value);
      } while (take(','));
      return take('}');
    }
    std::string word;
    const size_t start = pos_;
    while (pos_ < s_.size() && (word_char(s_[pos_]) || s_[pos_] == '.' || s_[pos_] == '-' || s_[pos_] == '+'))
      ++pos_;
    word = std::string(s_.substr(start, pos_ - start));
    if (word == "True") out = true;
    else if (word == "False") out = false;
    else if (word == "None") out = nullptr;
    else {
      const ordered_json number = ordered_json::parse(word, nullptr, false);
      if (number.is_discarded() || !number.is_number()) return false;
      out = number;
    }
    return true;
  }
  bool string_literal(std::string& out) {
    skip_space();
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) return false;
    const char quote = s_[pos_++];
    for (; pos_ < s_.size(); ++pos_) {
      const char c = s_[pos_];
      if (c == quote) {
        ++pos_;
        return true;
      }
      if (c != '\\') {
        out += c;
        continue;
      }
      if (++pos_ >= s_.size()) return false;
      const char e = s_[pos_];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': break;  // a line continued
        case 'x': case 'u': case 'U': {
          const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t code = 0;
          if (!hex_digits(digits, code) || !append_utf8(code, out)) return false;
          break;
        }
        case 'N': return false;  // named characters: not read
        default:
          if (e >= '0' && e <= '7') {  // up to three octal digits
            uint32_t code = 0;
            for (int n = 0; n < 3 && pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '7'; ++n, ++pos_)
              code = code * 8 + static_cast<uint32_t>(s_[pos_] - '0');
            --pos_;  // the loop's ++pos_ steps past the last digit
            if (!append_utf8(code, out)) return false;
          } else if (e == '\\' || e == '\'' || e == '"') {
            out += e;
          } else {
            out += '\\';  // Python keeps an unknown escape as written
            out += e;
          }
      }
    }
    return false;
  }
  // `n` hex digits after the escape letter at pos_ (which ends on the last).
  bool hex_digits(size_t n, uint32_t& code) {
    if (pos_ + n >= s_.size()) return false;
    for (size_t i = 1; i <= n; ++i) {
      const char h = s_[pos_ + i];
      const int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (v < 0) return false;
      code = code * 16 + static_cast<uint32_t>(v);
    }
    pos_ += n;
    return true;
  }
  // A code point as UTF-8 (false for surrogates and beyond Unicode).
  static bool append_utf8(uint32_t c, std::string& out) {
    if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
    jinja::text::append_utf8(out, static_cast<char32_t>(c));
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

// The whole reply (trimmed) as Pythonic calls of declared tools.
bool append_pythonic_calls(std::string_view reply, const std::vector<std::string>& tool_names,
                           std::vector<ToolCall>& out) {
  std::string_view body = trim(reply);
  const Markers m = markers_of(ToolCallSyntax::Pythonic);
  if (starts_with(body, m.open)) body.remove_prefix(m.open.size());
  if (body.size() >= m.close.size() && body.substr(body.size() - m.close.size()) == m.close)
    body.remove_suffix(m.close.size());
  std::vector<ToolCall> calls;
  if (!PythonicReader(body).calls(calls)) return false;
  for (const ToolCall& c : calls)
    if (std::find(tool_names.begin(), tool_names.end(), c.name) == tool_names.end()) return false;
  out = std::move(calls);
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
  if (has("tool▁calls▁begin")) return ToolCallSyntax::DeepSeek;
  // Llama 3.2's and Llama 4's templates describe the format with this example.
  if (has("[func_name1(")) return ToolCallSyntax::Pythonic;
  if (has("<|python_tag|>") || has("\"parameters\": dictionary of argument name")) return ToolCallSyntax::Llama3;
  return ToolCallSyntax::None;
}

std::vector<std::string> tool_call_markers(ToolCallSyntax syntax) {
  const Markers m = markers_of(syntax);
  std::vector<std::string> out;
  if (!m.open.empty()) out.emplace_back(m.open);
  if (!m.close.empty()) out.emplace_back(m.close);
  if (syntax == ToolCallSyntax::DeepSeek)
    for (std::string_view marker : {kDeepSeekCallBegin, kDeepSeekCallEnd, kDeepSeekSep}) out.emplace_back(marker);
  return out;
}

std::string make_tool_call_id(ToolCallSyntax syntax) {
  return syntax == ToolCallSyntax::Mistral ? make_response_id("", 9) : make_response_id("call_");
}

size_t ToolCallTextGate::free_prefix(std::string_view reply) {
  if (syntax_ == ToolCallSyntax::None) return reply.size();
  if (syntax_ == ToolCallSyntax::Llama3 || syntax_ == ToolCallSyntax::Pythonic) {
    // A call is the whole reply: text once its first visible byte shows
    // otherwise. (scanned_: the leading whitespace seen so far.)
    while (scanned_ < reply.size() && is_space(reply[scanned_])) ++scanned_;
    const std::string_view t = reply.substr(scanned_), tag = markers_of(syntax_).open;
    const char opens = syntax_ == ToolCallSyntax::Llama3 ? '{' : '[';
    if (t.empty() || t.front() == opens || starts_with(t, tag) || may_begin(t, tag)) return 0;
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
  // The text ends at the last visible byte: among the bytes scanned now, or
  // where it ended before when they are all whitespace (so a long run of
  // whitespace is walked once, not at every call).
  size_t free = i;
  while (free > scanned_ && is_space(reply[free - 1])) --free;
  if (free == scanned_) free = std::min(free, text_end_);
  scanned_ = i;
  text_end_ = free;
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
  if (syntax == ToolCallSyntax::Pythonic) {
    if (!append_pythonic_calls(reply, tool_names, out.calls)) return std::nullopt;
    return out;
  }
  const Markers m = markers_of(syntax);
  // The first marker outside reasoning starts the calls.
  ToolCallTextGate gate(syntax);
  gate.free_prefix(reply);
  size_t at = gate.call_start().value_or(std::string_view::npos);
  if (at == std::string_view::npos) return std::nullopt;
  out.before = std::string(reply.substr(0, at));
  if (syntax == ToolCallSyntax::DeepSeek) {
    while (at != std::string_view::npos) {
      const size_t next = read_deepseek_calls(reply, at + m.open.size(), out.calls);
      if (next == std::string_view::npos) return std::nullopt;  // not a whole list: text
      at = reply.find(m.open, next);
      out.after += std::string(reply.substr(next, (at == std::string_view::npos ? reply.size() : at) - next));
    }
    return out;
  }
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
