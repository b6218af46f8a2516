#include "server/request_fields.h"

namespace reprise::request_fields {

namespace {

// 0x0000-0xFFFF from the four hex digits at s[i], or -1.
int hex4(std::string_view s, size_t i) {
  if (i + 4 > s.size()) return -1;
  int v = 0;
  for (size_t k = i; k < i + 4; ++k) {
    const char c = s[k];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

// The body with each \u escape of a lone UTF-16 surrogate (a high one not
// followed by a low one, or a low one alone) replaced by \ufffd. JavaScript
// clients send them when a string is cut inside an emoji, and Python's
// json (OpenAI's, vLLM's) accepts them; nlohmann's parser refuses them.
std::string replace_lone_surrogates(std::string_view body) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 >= body.size()) {
      out += body[i];
      continue;
    }
    if (body[i + 1] != 'u') {  // another escape, copied whole: an escaped backslash before 'u' starts none
      out += body[i];
      out += body[++i];
      continue;
    }
    const int unit = hex4(body, i + 2);
    const bool high = unit >= 0xD800 && unit <= 0xDBFF, low = unit >= 0xDC00 && unit <= 0xDFFF;
    if (high && i + 12 <= body.size() && body[i + 6] == '\\' && body[i + 7] == 'u') {
      const int next = hex4(body, i + 8);
      if (next >= 0xDC00 && next <= 0xDFFF) {  // a pair: kept
        out.append(body.substr(i, 12));
        i += 11;
        continue;
      }
    }
    if (high || low) {
      out += "\\ufffd";
      i += 5;
      continue;
    }
    out += body[i];
  }
  return out;
}

}  // namespace

ordered_json parse_body(std::string_view body, const RequestLimits& limits) {
  if (json_nesting_depth(body, limits.max_nesting_depth) > limits.max_nesting_depth)
    fail("request body nests deeper than " + std::to_string(limits.max_nesting_depth) + " levels", "");
  ordered_json doc = ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  // Lone surrogate escapes are refused by the parser but not by OpenAI's:
  // tried again with them replaced (only bodies that failed pay for it).
  if (doc.is_discarded() && body.find("\\u") != std::string_view::npos)
    doc = ordered_json::parse(replace_lone_surrogates(body), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) fail("request body is not valid JSON", "", "invalid_json");
  if (!doc.is_object()) fail("request body must be a JSON object, not " + std::string(type_name(doc)), "");
  return doc;
}

}  // namespace reprise::request_fields
