#include "server/jinja/filters.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "server/jinja/access.h"
#include "server/jinja/args.h"
#include "server/jinja/budget.h"
#include "server/jinja/format.h"
#include "server/jinja/renderer.h"
#include "server/jinja/tests.h"
#include "server/jinja/text.h"
#include "util/error.h"

namespace reprise::jinja {

namespace {

// ------------------------------------------------------------------ helpers

std::vector<Value> items_of(const Value& v, std::string_view filter) {
  if (v.is_dict() && v.as_dict().flavor != DictData::Flavor::Dict) {
    throw Error("filter '" + std::string(filter) + "': '" + std::string(type_name(v)) + "' object is not iterable");
  }
  if (v.is_number() || v.is_bool() || v.is_none() || v.is_callable()) {
    throw Error("filter '" + std::string(filter) + "': '" + std::string(type_name(v)) + "' object is not iterable");
  }
  return iterate(v);
}

// Jinja's attribute getter: "a.b.0" walks items, digit parts as indexes.
Value lookup_path(const Value& item, std::string_view path) {
  Value current = item;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string_view part = path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (numeric && part.size() < 18) current = get_item(current, Value::integer(std::atoll(std::string(part).c_str())));
    else current = get_item(current, Value::string(std::string(part)));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return current;
}

Value attribute_or_self(const Value& item, const Value& attribute) {
  if (attribute.is_undefined() || attribute.is_none()) return item;
  if (attribute.is_int()) return get_item(item, attribute);
  return lookup_path(item, to_str(attribute));
}

// Sort key used by sort/unique/min/max/dictsort: strings fold case unless
// case_sensitive, as Jinja's ignore_case() does.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(text::lower(v.as_string()));
  return v;
}

std::string str_of(const Value& v) { return to_str(v); }

// Marks a filter result as a Jinja2 generator (see ListData::is_generator).
Value generator(std::vector<Value> items) {
  Value v = Value::list(std::move(items));
  v.as_list().is_generator = true;
  return v;
}

// ------------------------------------------------------------------ strings

Value f_upper(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("upper", a, {});
  return Value::string(text::upper(str_of(in)));
}
Value f_lower(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("lower", a, {});
  return Value::string(text::lower(str_of(in)));
}
Value f_capitalize(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("capitalize", a, {});
  return Value::string(text::capitalize(str_of(in)));
}
Value f_title(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("title", a, {});
  return Value::string(text::jinja_title(str_of(in)));
}
Value f_trim(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("trim", a, {"chars"});
  std::string chars;
  bool has_chars = b.given(0) && !b[0].is_none();
  if (has_chars) chars = str_of(b[0]);
  return Value::string(text::strip(str_of(in), text::Side::Both, has_chars ? &chars : nullptr));
}
Value f_replace(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("replace", a, {"old", "new", "count"});
  return Value::string(text::replace(str_of(in), str_of(b[0]), str_of(b[1]), b.int_or(2, -1)));
}
Value f_string(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("string", a, {});
  return in.is_string() ? in : Value::string(to_str(in));
}
Value f_safe(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("safe", a, {});
  return in;
}
Value f_escape(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("escape", a, {});
  std::string out;
  for (char c : str_of(in)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value::string(std::move(out));
}
Value f_center(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("center", a, {"width"});
  std::string s = str_of(in);
  int64_t width = b.int_or(0, 80);
  int64_t len = static_cast<int64_t>(text::length(s));
  if (width <= len) return Value::string(s);
  check_size(static_cast<size_t>(width) + s.size());
  size_t missing = static_cast<size_t>(width - len);
  size_t left = missing / 2 + (missing & static_cast<size_t>(width) & 1);
  return Value::string(std::string(left, ' ') + s + std::string(missing - left, ' '));
}
Value f_indent(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("indent", a, {"width", "first", "blank"});
  std::string indention;
  if (b.given(0) && b[0].is_string()) {
    indention = b[0].as_string();
  } else {
    int64_t width = b.int_or(0, 4);
    check_size(static_cast<size_t>(std::max<int64_t>(width, 0)));
    indention = std::string(static_cast<size_t>(std::max<int64_t>(width, 0)), ' ');
  }
  bool first = b.bool_or(1, false), blank = b.bool_or(2, false);
  std::vector<std::string> lines = text::splitlines(str_of(in) + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += '\n';
      if (blank || !lines[i].empty()) out += indention;
    }
    out += lines[i];
    check_size(out.size());
  }
  if (first) out = indention + out;
  return Value::string(std::move(out));
}
Value f_wordcount(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("wordcount", a, {});
  std::string s = str_of(in);
  int64_t words = 0;
  bool in_word = false;
  for (unsigned char c : s) {
    bool word_char = std::isalnum(c) || c == '_' || c >= 0x80;
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return Value::integer(words);
}
Value f_truncate(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("truncate", a, {"length", "killwords", "end", "leeway"});
  std::string s = str_of(in);
  int64_t length = b.int_or(0, 255);
  bool killwords = b.bool_or(1, false);
  std::string end = b.string_or(2, "...");
  int64_t leeway = b.int_or(3, 5);
  int64_t end_len = static_cast<int64_t>(text::length(end));
  if (length < end_len) throw Error("expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
  if (leeway < 0) throw Error("expected leeway >= 0, got " + std::to_string(leeway));
  std::vector<size_t> bounds = text::boundaries(s);
  int64_t n = static_cast<int64_t>(bounds.size()) - 1;
  if (n <= length + leeway) return Value::string(s);
  std::string head = s.substr(0, bounds[static_cast<size_t>(length - end_len)]);
  if (killwords) return Value::string(head + end);
  size_t space = head.rfind(' ');
  if (space != std::string::npos) head = head.substr(0, space);
  return Value::string(head + end);
}
Value f_format(Renderer&, const Value& in, const CallArgs& a) {
  if (!a.positional.empty() && !a.named.empty()) throw Error("can't handle positional and keyword arguments at the same time");
  if (!a.named.empty()) {
    Value mapping = Value::dict();
    for (const auto& [k, v] : a.named) mapping.as_dict().set(k, v);
    return Value::string(format::percent(str_of(in), mapping));
  }
  return Value::string(format::percent(str_of(in), Value::list(a.positional, true)));
}

// ------------------------------------------------------------------ numbers

Value f_int(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("int", a, {"default", "base"});
  Value fallback = b.given(0) ? b[0] : Value::integer(0);
  int64_t base = b.int_or(1, 10);
  if (in.is_int()) return in;
  if (in.is_bool()) return Value::integer(in.as_int());
  if (in.is_float()) {
    double d = in.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
    return Value::integer(static_cast<int64_t>(d));
  }
  if (!in.is_string()) return fallback;
  std::string s = text::strip(in.as_string(), text::Side::Both);
  std::string digits;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && std::isalnum(static_cast<unsigned char>(s[i - 1])) &&
        std::isalnum(static_cast<unsigned char>(s[i + 1]))) {
      continue;
    }
    digits += s[i];
  }
  if (!digits.empty() && base >= 2 && base <= 36) {
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
    if (errno == 0 && end && *end == '\0' && !std::isspace(static_cast<unsigned char>(digits[0]))) {
      return Value::integer(v);
    }
  }
  // Jinja falls back to int(float(value)).
  char* end = nullptr;
  double d = std::strtod(digits.c_str(), &end);
  if (!digits.empty() && end && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18 &&
      digits.find_first_of("xXpP") == std::string::npos) {
    return Value::integer(static_cast<int64_t>(d));
  }
  return fallback;
}
Value f_float(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("float", a, {"default"});
  Value fallback = b.given(0) ? b[0] : Value::number(0.0);
  if (in.is_number() || in.is_bool()) return Value::number(in.as_double());
  if (!in.is_string()) return fallback;
  std::string s = text::strip(in.as_string(), text::Side::Both);
  if (s.empty() || s.find_first_of("xXpP") != std::string::npos) {
    std::string lower = text::lower(s);
    if (lower != "inf" && lower != "+inf" && lower != "-inf" && lower != "infinity" && lower != "nan") return fallback;
  }
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (end && *end == '\0') return Value::number(d);
  return fallback;
}
Value f_abs(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("abs", a, {});
  if (in.is_float()) return Value::number(std::fabs(in.as_double()));
  if (in.is_int() || in.is_bool()) {
    if (in.as_int() == INT64_MIN) throw Error("integer result too large");
    return Value::integer(std::llabs(in.as_int()));
  }
  throw Error("bad operand type for abs(): '" + std::string(type_name(in)) + "'");
}
Value f_round(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("round", a, {"precision", "method"});
  int64_t precision = b.int_or(0, 0);
  std::string method = b.string_or(1, "common");
  if (method != "common" && method != "ceil" && method != "floor") {
    throw Error("method must be 'common', 'ceil' or 'floor'");
  }
  if (!in.is_number() && !in.is_bool()) throw Error("round: a number is required, not " + std::string(type_name(in)));
  precision = std::clamp<int64_t>(precision, -300, 300);
  if (method == "common") {
    if (!in.is_float() && precision >= 0) return Value::integer(in.as_int());
    double d = in.as_double();
    if (!std::isfinite(d)) return Value::number(d);
    if (precision == 0) return Value::number(std::nearbyint(d));
    if (precision > 0) {
      // glibc prints the exactly rounded decimal, like Python's round().
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), d);
      return Value::number(std::strtod(buf, nullptr));
    }
    double scale = std::pow(10.0, static_cast<double>(-precision));
    return Value::number(std::nearbyint(d / scale) * scale);
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double d = in.as_double();
  double r = method == "ceil" ? std::ceil(d * scale) / scale : std::floor(d * scale) / scale;
  return Value::number(r);
}

// ---------------------------------------------------------------- sequences

Value f_length(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("length", a, {});
  switch (in.kind()) {
    case Value::Kind::Undefined: return Value::integer(0);
    case Value::Kind::String: return Value::integer(static_cast<int64_t>(text::length(in.as_string())));
    case Value::Kind::List: return Value::integer(static_cast<int64_t>(in.as_list().items.size()));
    case Value::Kind::Dict: return Value::integer(static_cast<int64_t>(in.as_dict().size()));
    default: throw Error("object of type '" + std::string(type_name(in)) + "' has no len()");
  }
}
Value f_first(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("first", a, {});
  if (in.is_list()) return in.as_list().items.empty() ? Value::undefined() : in.as_list().items.front();
  std::vector<Value> items = items_of(in, "first");
  return items.empty() ? Value::undefined() : items.front();
}
Value f_last(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("last", a, {});
  if (in.is_list()) return in.as_list().items.empty() ? Value::undefined() : in.as_list().items.back();
  std::vector<Value> items = items_of(in, "last");
  return items.empty() ? Value::undefined() : items.back();
}
Value f_list(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("list", a, {});
  return Value::list(items_of(in, "list"));
}
Value f_reverse(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("reverse", a, {});
  if (in.is_string()) {
    std::vector<Value> chars = iterate(in);
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->as_string();
    return Value::string(std::move(out));
  }
  std::vector<Value> items = items_of(in, "reverse");
  std::reverse(items.begin(), items.end());
  return generator(std::move(items));
}
Value f_join(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("join", a, {"d", "attribute"});
  std::string sep = b.given(0) ? str_of(b[0]) : "";
  std::string out;
  bool first = true;
  for (const Value& item : items_of(in, "join")) {
    if (!first) out += sep;
    first = false;
    out += to_str(attribute_or_self(item, b[1]));
    check_size(out.size());
  }
  return Value::string(std::move(out));
}
Value f_default(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("default", a, {"default_value", "boolean"});
  bool boolean = b.bool_or(1, false);
  if (in.is_undefined() || (boolean && !truthy(in))) return b.given(0) ? b[0] : Value::string("");
  return in;
}
Value f_items(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("items", a, {});
  if (in.is_undefined()) return generator({});
  if (!in.is_dict() || in.as_dict().flavor != DictData::Flavor::Dict) throw Error("Can only get item pairs from a mapping.");
  std::vector<Value> pairs;
  for (const auto& [key, value] : in.as_dict().entries()) pairs.push_back(Value::list({Value::string(key), value}, true));
  return generator(std::move(pairs));
}
Value f_keys(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("keys", a, {});
  if (in.is_undefined()) return Value::list();
  if (!in.is_dict()) throw Error("filter 'keys' needs a mapping");
  return Value::list(iterate(in));
}
Value f_values(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("values", a, {});
  if (in.is_undefined()) return Value::list();
  if (!in.is_dict()) throw Error("filter 'values' needs a mapping");
  std::vector<Value> values;
  for (const auto& entry : in.as_dict().entries()) values.push_back(entry.second);
  return Value::list(std::move(values));
}
Value f_dictsort(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (!in.is_dict()) throw Error("dictsort: a mapping is required");
  bool case_sensitive = b.bool_or(0, false);
  std::string by = b.string_or(1, "key");
  if (by != "key" && by != "value") throw Error("You can only sort by either 'key' or 'value'");
  bool reverse = b.bool_or(2, false);
  std::vector<Value> pairs;
  for (const auto& [key, value] : in.as_dict().entries()) pairs.push_back(Value::list({Value::string(key), value}, true));
  size_t pos = by == "key" ? 0 : 1;
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    Value kx = sort_key(x.as_list().items[pos], case_sensitive), ky = sort_key(y.as_list().items[pos], case_sensitive);
    return reverse ? compare(ky, kx) < 0 : compare(kx, ky) < 0;
  });
  return Value::list(std::move(pairs));
}
Value f_sort(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("sort", a, {"reverse", "case_sensitive", "attribute"});
  bool reverse = b.bool_or(0, false), case_sensitive = b.bool_or(1, false);
  std::vector<std::string> attributes;
  if (b.given(2) && !b[2].is_none()) {
    if (b[2].is_string()) {
      // Jinja accepts "a,b" to sort by several attributes.
      std::string comma = ",";
      for (const std::string& part : text::split(b[2].as_string(), &comma, -1)) {
        attributes.push_back(text::strip(part, text::Side::Both));
      }
    } else {
      attributes.push_back(to_str(b[2]));
    }
  }
  std::vector<Value> items = items_of(in, "sort");
  std::vector<std::pair<Value, Value>> keyed;
  keyed.reserve(items.size());
  for (Value& item : items) {
    std::vector<Value> keys;
    for (const std::string& attribute : attributes) keys.push_back(sort_key(lookup_path(item, attribute), case_sensitive));
    Value key = attributes.empty() ? sort_key(item, case_sensitive)
                                   : (keys.size() == 1 ? keys[0] : Value::list(std::move(keys), true));
    keyed.emplace_back(std::move(key), std::move(item));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
  });
  std::vector<Value> out;
  out.reserve(keyed.size());
  for (auto& entry : keyed) out.push_back(std::move(entry.second));
  return Value::list(std::move(out));
}
Value f_unique(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("unique", a, {"case_sensitive", "attribute"});
  bool case_sensitive = b.bool_or(0, false);
  std::vector<Value> seen_keys, out;
  for (const Value& item : items_of(in, "unique")) {
    Value key = sort_key(attribute_or_self(item, b[1]), case_sensitive);
    bool seen = std::any_of(seen_keys.begin(), seen_keys.end(), [&](const Value& k) { return equals(k, key); });
    if (seen) continue;
    seen_keys.push_back(std::move(key));
    out.push_back(item);
  }
  return generator(std::move(out));
}
Value min_max(const Value& in, const CallArgs& a, bool want_max) {
  BoundArgs b(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  bool case_sensitive = b.bool_or(0, false);
  std::vector<Value> items = items_of(in, want_max ? "max" : "min");
  if (items.empty()) return Value::undefined();
  size_t best = 0;
  Value best_key = sort_key(attribute_or_self(items[0], b[1]), case_sensitive);
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = sort_key(attribute_or_self(items[i], b[1]), case_sensitive);
    int c = compare(key, best_key);
    if (want_max ? c > 0 : c < 0) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}
Value f_max(Renderer&, const Value& in, const CallArgs& a) { return min_max(in, a, true); }
Value f_min(Renderer&, const Value& in, const CallArgs& a) { return min_max(in, a, false); }
Value f_sum(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("sum", a, {"attribute", "start"});
  Value total = b.given(1) ? b[1] : Value::integer(0);
  for (const Value& item : items_of(in, "sum")) {
    Value v = attribute_or_self(item, b[0]);
    if (!(v.is_number() || v.is_bool()) || !(total.is_number() || total.is_bool())) {
      throw Error("unsupported operand type(s) for +: '" + std::string(type_name(total)) + "' and '" +
                  std::string(type_name(v)) + "'");
    }
    if (total.is_float() || v.is_float()) {
      total = Value::number(total.as_double() + v.as_double());
    } else {
      int64_t r;
      if (__builtin_add_overflow(total.as_int(), v.as_int(), &r)) throw Error("integer result too large");
      total = Value::integer(r);
    }
  }
  return total;
}
Value f_batch(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("batch", a, {"linecount", "fill_with"});
  int64_t size = b.int_or(0, 0);
  if (size <= 0) throw Error("batch: linecount must be positive");
  std::vector<Value> batches, current;
  for (const Value& item : items_of(in, "batch")) {
    current.push_back(item);
    if (static_cast<int64_t>(current.size()) == size) {
      batches.push_back(Value::list(std::move(current)));
      current.clear();
    }
  }
  if (!current.empty()) {
    if (b.given(1) && !b[1].is_none()) {
      while (static_cast<int64_t>(current.size()) < size) current.push_back(b[1]);
    }
    batches.push_back(Value::list(std::move(current)));
  }
  return generator(std::move(batches));
}
Value f_attr(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("attr", a, {"name"});
  return get_attribute(in, b.string_or(0, ""));
}

// map / select / reject / selectattr / rejectattr

Value f_map(Renderer& r, const Value& in, const CallArgs& a) {
  // Jinja2's map, select and reject begin with `if value:`: a falsy input
  // (none, 0, an empty string, an assistant turn's null content) yields
  // nothing rather than failing.
  if (!truthy(in)) return generator({});
  std::vector<Value> items = items_of(in, "map");
  std::vector<Value> out;
  out.reserve(items.size());
  if (a.positional.empty()) {
    // map(attribute="x", default=y)
    BoundArgs b("map", a, {"attribute", "default"});
    if (!b.given(0)) throw Error("map() needs a filter name or attribute=");
    for (const Value& item : items) {
      Value v = attribute_or_self(item, b[0]);
      if (v.is_undefined() && b.given(1)) v = b[1];
      out.push_back(std::move(v));
    }
    return generator(std::move(out));
  }
  if (!a.positional[0].is_string()) throw Error("map(): filter name must be a string");
  FilterFn fn = find_filter(a.positional[0].as_string());
  if (!fn) throw Error("no filter named '" + a.positional[0].as_string() + "'");
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.named = a.named;
  for (const Value& item : items) {
    charge_steps(1);
    out.push_back(fn(r, item, rest));
  }
  return generator(std::move(out));
}

// Shared by select/reject(/attr): keeps items whose test result == keep.
Value select_items(Renderer& r, const Value& in, const CallArgs& a, bool keep, bool by_attribute,
                   std::string_view filter) {
  if (!truthy(in)) return generator({});  // as map
  std::vector<Value> items = items_of(in, filter);
  size_t next_arg = 0;
  std::string attribute;
  if (by_attribute) {
    if (a.positional.empty() || !a.positional[0].is_string()) {
      throw Error(std::string(filter) + "() needs an attribute name");
    }
    attribute = a.positional[0].as_string();
    next_arg = 1;
  }
  TestFn test = nullptr;
  CallArgs test_args;
  if (next_arg < a.positional.size()) {
    if (!a.positional[next_arg].is_string()) throw Error(std::string(filter) + "(): test name must be a string");
    test = find_test(a.positional[next_arg].as_string());
    if (!test) throw Error("no test named '" + a.positional[next_arg].as_string() + "'");
    test_args.positional.assign(a.positional.begin() + static_cast<long>(next_arg) + 1, a.positional.end());
  }
  test_args.named = a.named;
  std::vector<Value> out;
  for (const Value& item : items) {
    charge_steps(1);
    Value subject = by_attribute ? lookup_path(item, attribute) : item;
    bool passed = test ? test(r, subject, test_args) : truthy(subject);
    if (passed == keep) out.push_back(item);
  }
  return generator(std::move(out));
}
Value f_select(Renderer& r, const Value& in, const CallArgs& a) { return select_items(r, in, a, true, false, "select"); }
Value f_reject(Renderer& r, const Value& in, const CallArgs& a) { return select_items(r, in, a, false, false, "reject"); }
Value f_selectattr(Renderer& r, const Value& in, const CallArgs& a) {
  return select_items(r, in, a, true, true, "selectattr");
}
Value f_rejectattr(Renderer& r, const Value& in, const CallArgs& a) {
  return select_items(r, in, a, false, true, "rejectattr");
}

// ---------------------------------------------------------------- rendering

// HF's override, with its parameters in its order (positional arguments
// too): tojson(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False) = json.dumps with the same. Integer indents above 64 are
// taken as 64 (a bound on output size).
Value f_tojson(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonStyle style;
  style.ensure_ascii = b.bool_or(0, false);
  if (b.given(1) && !b[1].is_none()) {
    if (b[1].is_string()) {
      if (b[1].as_string().size() > 64) throw Error("tojson: an indent string is at most 64 bytes");
      style.indent_text = b[1].as_string();
    } else {
      style.indent = static_cast<int>(std::clamp<int64_t>(b.int_or(1, 0), 0, 64));
    }
  }
  if (b.given(2) && !b[2].is_none()) {
    if (!b[2].is_list() || b[2].as_list().items.size() != 2) throw Error("tojson: separators must be a pair");
    style.item_separator = to_str(b[2].as_list().items[0]);
    style.key_separator = to_str(b[2].as_list().items[1]);
  }
  style.sort_keys = b.bool_or(3, false);
  std::string out = to_json(in, style);
  return Value::string(std::move(out));
}
Value f_pprint(Renderer&, const Value& in, const CallArgs& a) {
  BoundArgs b("pprint", a, {});
  return Value::string(repr(in));
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  static const std::unordered_map<std::string_view, FilterFn> filters = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"batch", f_batch},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"format", f_format},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"keys", f_keys},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"pprint", f_pprint},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"truncate", f_truncate},
      {"unique", f_unique},
      {"upper", f_upper},
      {"values", f_values},
      {"wordcount", f_wordcount},
  };
  auto it = filters.find(name);
  return it == filters.end() ? nullptr : it->second;
}

}  // namespace reprise::jinja
