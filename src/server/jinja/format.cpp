#include "server/jinja/format.h"

#include <unicode/uchar.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "server/jinja/budget.h"
#include "server/jinja/text.h"
#include "util/error.h"

namespace reprise::jinja::format {

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then laid out the way
  // Python's repr does: fixed notation for 1e-4 <= |d| < 1e16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  int exponent = std::atoi(sci.c_str() + e_pos + 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  int decimal_point = exponent + 1;  // digits[0:decimal_point] is the integer part
  std::string out = negative ? "-" : "";
  if (decimal_point > -4 && decimal_point <= 16) {
    if (decimal_point <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decimal_point), '0');
      out += digits;
    } else if (static_cast<size_t>(decimal_point) >= digits.size()) {
      out += digits;
      out.append(static_cast<size_t>(decimal_point) - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decimal_point));
      out += '.';
      out += digits.substr(static_cast<size_t>(decimal_point));
    }
    return out;
  }
  out += digits[0];
  if (digits.size() > 1) {
    out += '.';
    out += digits.substr(1);
  }
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  out += exp_buf;
  return out;
}

static bool python_printable(char32_t cp) {
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp < 0x7F) return true;
  int8_t type = u_charType(static_cast<UChar32>(cp));
  switch (type) {
    case U_CONTROL_CHAR: case U_FORMAT_CHAR: case U_SURROGATE: case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED: case U_LINE_SEPARATOR: case U_PARAGRAPH_SEPARATOR: case U_SPACE_SEPARATOR:
      return false;
    default:
      return true;
  }
}

std::string string_repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out;
  out.reserve(s.size() + 2);
  out += quote;
  for (size_t pos = 0, len = 0; pos < s.size(); pos += len) {
    char32_t cp = text::decode(s, pos, len);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (len == 1 && cp >= 0x80) {
      // A stray byte; Python would have decoded it with surrogateescape.
      char b[16];
      std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(cp));
      out += b;
    } else if (!python_printable(cp)) {
      char b[16];
      if (cp < 0x100) std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(cp));
      else if (cp < 0x10000) std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(cp));
      else std::snprintf(b, sizeof b, "\\U%08x", static_cast<unsigned>(cp));
      out += b;
    } else {
      out.append(s.substr(pos, len));
    }
  }
  out += quote;
  return out;
}

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (size_t pos = 0, len = 0; pos < s.size(); pos += len) {
    char32_t cp = text::decode(s, pos, len);
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    char b[16];
    if (cp < 0x20) {
      std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(cp));
      out += b;
    } else if (ensure_ascii && cp >= 0x80) {
      if (cp >= 0x10000) {
        char32_t v = cp - 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                      static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(cp));
      }
      out += b;
    } else {
      out.append(s.substr(pos, len));
    }
  }
  out += '"';
}

namespace {

// A parsed conversion spec shared by % and str.format.
struct Spec {
  std::string fill = " ";
  char align = 0;     // '<', '>', '^', '=' or 0 (type default)
  char sign = '-';    // '-', '+', ' '
  bool alternate = false;
  bool zero = false;
  int width = -1;
  bool thousands = false;
  int precision = -1;
  char type = 0;
};

int64_t int_for_format(const Value& v, char type) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  if (v.is_float()) {
    double d = v.as_double();
    if (!std::isfinite(d)) throw Error("cannot convert float " + float_repr(d) + " to integer");
    return static_cast<int64_t>(d);
  }
  throw Error(std::string("%") + type + " format: a real number is required, not " +
              std::string(type_name(v)));
}

double float_for_format(const Value& v) {
  if (v.is_number() || v.is_bool()) return v.as_double();
  throw Error("must be real number, not " + std::string(type_name(v)));
}

std::string with_thousands(std::string digits) {
  std::string out;
  size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    out += digits[i];
    size_t left = n - 1 - i;
    if (left > 0 && left % 3 == 0) out += ',';
  }
  return out;
}

// Formats a number without padding; returns (sign, body).
std::pair<std::string, std::string> format_number(const Value& v, const Spec& spec) {
  char type = spec.type;
  std::string sign;
  std::string body;
  bool is_float_type = type == 'f' || type == 'F' || type == 'e' || type == 'E' || type == 'g' ||
                       type == 'G' || type == '%';
  bool as_float = is_float_type || (type == 0 && v.is_float());
  if (as_float) {
    double d = float_for_format(v);
    bool negative = std::signbit(d) && !std::isnan(d);
    double mag = std::fabs(d);
    if (type == 0 && spec.precision < 0) {
      body = float_repr(mag);
    } else {
      char t = type == 0 ? 'g' : type;
      double shown = t == '%' ? mag * 100 : mag;
      if (t == '%') t = 'f';
      int precision = spec.precision < 0 ? 6 : spec.precision;
      std::string fmt = std::string("%") + (spec.alternate ? "#" : "") + "." +
                        std::to_string(precision) + t;
      int n = std::snprintf(nullptr, 0, fmt.c_str(), shown);
      body.resize(static_cast<size_t>(n) + 1);
      std::snprintf(body.data(), body.size(), fmt.c_str(), shown);
      body.resize(static_cast<size_t>(n));
      if (type == '%') body += '%';
    }
    if (spec.thousands) {
      size_t dot = body.find_first_not_of("0123456789");
      body = with_thousands(body.substr(0, dot)) + (dot == std::string::npos ? "" : body.substr(dot));
    }
    if (negative) sign = "-";
    else if (spec.sign == '+') sign = "+";
    else if (spec.sign == ' ') sign = " ";
    return {sign, body};
  }
  int64_t i = int_for_format(v, type ? type : 'd');
  bool negative = i < 0;
  uint64_t mag = negative ? 0 - static_cast<uint64_t>(i) : static_cast<uint64_t>(i);
  char buf[80];
  switch (type) {
    case 'x': std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(mag)); break;
    case 'X': std::snprintf(buf, sizeof buf, "%llX", static_cast<unsigned long long>(mag)); break;
    case 'o': std::snprintf(buf, sizeof buf, "%llo", static_cast<unsigned long long>(mag)); break;
    case 'b': {
      std::string bits;
      do {
        bits.insert(bits.begin(), static_cast<char>('0' + (mag & 1)));
        mag >>= 1;
      } while (mag);
      std::snprintf(buf, sizeof buf, "%s", bits.c_str());
      break;
    }
    case 'c': {
      std::string ch;
      text::append_utf8(ch, static_cast<char32_t>(mag));
      return {"", ch};
    }
    default: std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(mag)); break;
  }
  body = buf;
  if (spec.thousands) body = with_thousands(body);
  if (spec.alternate) {
    if (type == 'x') body = "0x" + body;
    else if (type == 'X') body = "0X" + body;
    else if (type == 'o') body = "0o" + body;
    else if (type == 'b') body = "0b" + body;
  }
  if (negative) sign = "-";
  else if (spec.sign == '+') sign = "+";
  else if (spec.sign == ' ') sign = " ";
  return {sign, body};
}

std::string pad(const std::string& sign, const std::string& body, const Spec& spec, char default_align) {
  char align = spec.align ? spec.align : default_align;
  std::string fill = spec.fill;
  if (spec.zero && !spec.align) {
    align = '=';
    fill = "0";
  }
  size_t len = text::length(sign) + text::length(body);
  if (spec.width < 0 || len >= static_cast<size_t>(spec.width)) return sign + body;
  check_size(static_cast<size_t>(spec.width) * fill.size());
  size_t missing = static_cast<size_t>(spec.width) - len;
  auto repeat = [&](size_t n) {
    std::string s;
    for (size_t i = 0; i < n; ++i) s += fill;
    return s;
  };
  switch (align) {
    case '<': return sign + body + repeat(missing);
    case '^': return repeat(missing / 2) + sign + body + repeat(missing - missing / 2);
    case '=': return sign + repeat(missing) + body;
    default: return repeat(missing) + sign + body;
  }
}

std::string truncate_codepoints(const std::string& s, int precision) {
  if (precision < 0) return s;
  std::vector<size_t> b = text::boundaries(s);
  if (static_cast<size_t>(precision) + 1 >= b.size()) return s;
  return s.substr(0, b[static_cast<size_t>(precision)]);
}

std::string apply_spec(const Value& v, const Spec& spec) {
  char type = spec.type;
  bool numeric_type = type && std::string_view("dbcoxXnfFeEgG%").find(type) != std::string_view::npos;
  if (numeric_type || (type == 0 && (v.is_number()) && (spec.sign != '-' || spec.zero ||
                                                        spec.thousands || spec.precision >= 0))) {
    Spec s = spec;
    if (s.type == 'n') s.type = 'd';
    auto [sign, body] = format_number(v, s);
    return pad(sign, body, s, '>');
  }
  if (type == 0 && v.is_number()) {
    return pad("", to_str(v), spec, '>');
  }
  if (type != 0 && type != 's' && type != 'r') {
    throw Error(std::string("unknown format code '") + type + "' for object of type '" +
                std::string(type_name(v)) + "'");
  }
  std::string body = type == 'r' ? repr(v) : to_str(v);
  return pad("", truncate_codepoints(body, spec.precision), spec, '<');
}

int parse_int(std::string_view s, size_t& i) {
  int n = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    n = n * 10 + (s[i] - '0');
    if (n > 100000) throw Error("format width or precision too big");
    ++i;
  }
  return n;
}

}  // namespace

std::string percent(std::string_view fmt, const Value& args) {
  std::vector<Value> positional;
  const DictData* mapping = nullptr;
  if (args.is_list() && args.as_list().is_tuple) positional = args.as_list().items;
  else {
    positional.push_back(args);
    if (args.is_dict()) mapping = &args.as_dict();
  }
  size_t next_arg = 0;
  bool used_mapping = false;
  auto take = [&]() -> const Value& {
    if (next_arg >= positional.size()) throw Error("not enough arguments for format string");
    return positional[next_arg++];
  };
  std::string out;
  for (size_t i = 0; i < fmt.size();) {
    char c = fmt[i];
    if (c != '%') {
      out += c;
      ++i;
      continue;
    }
    ++i;
    if (i >= fmt.size()) throw Error("incomplete format");
    Value keyed;
    bool has_key = false;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string_view::npos) throw Error("incomplete format key");
      if (!mapping) throw Error("format requires a mapping");
      std::string key(fmt.substr(i + 1, close - i - 1));
      const Value* found = mapping->find(key);
      if (!found) throw Error("format key '" + key + "' not found");
      keyed = *found;
      has_key = true;
      used_mapping = true;
      i = close + 1;
    }
    Spec spec;
    for (; i < fmt.size(); ++i) {
      char f = fmt[i];
      if (f == '-') spec.align = '<';
      else if (f == '+') spec.sign = '+';
      else if (f == ' ') { if (spec.sign != '+') spec.sign = ' '; }
      else if (f == '#') spec.alternate = true;
      else if (f == '0') spec.zero = true;
      else break;
    }
    if (i < fmt.size() && fmt[i] == '*') {
      spec.width = static_cast<int>(int_for_format(take(), 'd'));
      ++i;
    } else if (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') {
      spec.width = parse_int(fmt, i);
    }
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      spec.precision = parse_int(fmt, i);
    }
    while (i < fmt.size() && (fmt[i] == 'l' || fmt[i] == 'h' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) throw Error("incomplete format");
    char type = fmt[i++];
    if (type == '%') {
      out += '%';
      continue;
    }
    if (spec.align == '<') spec.zero = false;
    const Value& arg = has_key ? keyed : take();
    switch (type) {
      case 's': case 'r': case 'a':
        spec.type = type == 's' ? 's' : 'r';
        spec.zero = false;
        if (!spec.align) spec.align = '>';  // printf right-aligns strings (str.format left-aligns)
        out += apply_spec(arg, spec);
        break;
      case 'd': case 'i': case 'u':
        spec.type = 'd';
        out += apply_spec(arg, spec);
        break;
      case 'x': case 'X': case 'o': case 'e': case 'E': case 'f': case 'F': case 'g': case 'G':
      case 'c':
        spec.type = type;
        out += apply_spec(arg, spec);
        break;
      default:
        throw Error(std::string("unsupported format character '") + type + "'");
    }
    check_size(out.size());
  }
  // Python only complains about unused arguments for tuples and scalars:
  // anything with __getitem__ (dicts, lists) may go unused.
  bool indexable = args.is_dict() || (args.is_list() && !args.as_list().is_tuple);
  if (!used_mapping && next_arg < positional.size() && !indexable) {
    throw Error("not all arguments converted during string formatting");
  }
  return out;
}

std::string brace(std::string_view fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size();) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        i += 2;
        continue;
      }
      throw Error("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      ++i;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      i += 2;
      continue;
    }
    size_t close = fmt.find('}', i);
    if (close == std::string_view::npos) throw Error("Single '{' encountered in format string");
    std::string_view field = fmt.substr(i + 1, close - i - 1);
    i = close + 1;
    std::string_view spec_text;
    char conversion = 0;
    size_t colon = field.find(':');
    if (colon != std::string_view::npos) {
      spec_text = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    size_t bang = field.find('!');
    if (bang != std::string_view::npos) {
      if (bang + 1 < field.size()) conversion = field[bang + 1];
      field = field.substr(0, bang);
    }
    const Value* arg = nullptr;
    if (field.empty()) {
      if (auto_index >= args.positional.size()) {
        throw Error("Replacement index " + std::to_string(auto_index) + " out of range");
      }
      arg = &args.positional[auto_index++];
    } else if (field[0] >= '0' && field[0] <= '9') {
      size_t k = 0;
      size_t index = static_cast<size_t>(parse_int(field, k));
      if (index >= args.positional.size()) {
        throw Error("Replacement index " + std::to_string(index) + " out of range");
      }
      arg = &args.positional[index];
    } else {
      for (const auto& [name, value] : args.named) {
        if (name == field) arg = &value;
      }
      if (!arg) throw Error("format: missing key '" + std::string(field) + "'");
    }
    Spec spec;
    size_t k = 0;
    std::string_view s = spec_text;
    // [[fill]align]
    auto is_align = [](char a) { return a == '<' || a == '>' || a == '^' || a == '='; };
    if (!s.empty()) {
      size_t first_len = 0;
      text::decode(s, 0, first_len);
      if (first_len < s.size() && is_align(s[first_len])) {
        spec.fill = std::string(s.substr(0, first_len));
        spec.align = s[first_len];
        k = first_len + 1;
      } else if (is_align(s[0])) {
        spec.align = s[0];
        k = 1;
      }
    }
    if (k < s.size() && (s[k] == '+' || s[k] == '-' || s[k] == ' ')) spec.sign = s[k++];
    if (k < s.size() && s[k] == '#') { spec.alternate = true; ++k; }
    if (k < s.size() && s[k] == '0') { spec.zero = true; ++k; }
    if (k < s.size() && s[k] >= '0' && s[k] <= '9') spec.width = parse_int(s, k);
    if (k < s.size() && (s[k] == ',' || s[k] == '_')) { spec.thousands = true; ++k; }
    if (k < s.size() && s[k] == '.') {
      ++k;
      spec.precision = parse_int(s, k);
    }
    if (k < s.size()) spec.type = s[k++];
    if (k != s.size()) throw Error("Invalid format specifier '" + std::string(spec_text) + "'");
    if (conversion == 'r' || conversion == 'a') {
      out += apply_spec(Value::string(repr(*arg)), spec);
    } else if (conversion == 's') {
      out += apply_spec(Value::string(to_str(*arg)), spec);
    } else {
      out += apply_spec(*arg, spec);
    }
    check_size(out.size());
  }
  return out;
}

}  // namespace reprise::jinja::format
