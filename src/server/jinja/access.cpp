#include "server/jinja/access.h"

#include <algorithm>
#include <array>

#include "server/jinja/args.h"
#include "server/jinja/budget.h"
#include "server/jinja/format.h"
#include "server/jinja/text.h"
#include "util/error.h"

namespace reprise::jinja {

namespace {

constexpr std::array<std::string_view, 37> kStringMethods = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "replace",
    "upper", "lower", "title", "capitalize", "swapcase", "format", "find", "rfind", "index", "rindex",
    "count", "join", "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "isnumeric",
    "isdecimal", "ljust", "rjust", "center", "zfill", "removeprefix", "removesuffix", "partition",
    "rpartition"};
constexpr std::array<std::string_view, 11> kListMethods = {
    "append", "extend", "insert", "pop", "remove", "index", "count", "reverse", "sort", "copy", "clear"};
constexpr std::array<std::string_view, 9> kDictMethods = {"get", "items", "keys", "values", "pop", "update",
                                                          "setdefault", "copy", "clear"};

template <size_t N>
bool listed(const std::array<std::string_view, N>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool has_method(const Value& object, std::string_view name) {
  if (object.is_string()) return listed(kStringMethods, name);
  if (object.is_list()) {
    if (object.as_list().is_tuple) return name == "index" || name == "count";
    return listed(kListMethods, name);
  }
  if (object.is_dict()) return object.as_dict().flavor == DictData::Flavor::Dict && listed(kDictMethods, name);
  return false;
}

// `obj.method` used as a value rather than called directly.
class BoundMethod : public Callable {
 public:
  BoundMethod(Value object, std::string name) : object_(std::move(object)), name_(std::move(name)) {}
  Value call(Renderer& renderer, CallArgs& args) override {
    Value result;
    call_method(renderer, object_, name_, args, result);
    return result;
  }
  std::string name() const override { return std::string(type_name(object_)) + "." + name_; }

 private:
  Value object_;
  std::string name_;
};

// Python's slice.indices(): clamps start/stop for a sequence of `length`.
struct SliceBounds {
  int64_t start, stop, step;
};

int64_t slice_int(const Value& v, const char* what) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  throw Error(std::string("slice ") + what + " must be an integer or None, not " + std::string(type_name(v)));
}

SliceBounds adjust_slice(int64_t length, const Value& start_v, const Value& stop_v, const Value& step_v) {
  bool no_start = start_v.is_none() || start_v.is_undefined();
  bool no_stop = stop_v.is_none() || stop_v.is_undefined();
  int64_t step = (step_v.is_none() || step_v.is_undefined()) ? 1 : slice_int(step_v, "step");
  if (step == 0) throw Error("slice step cannot be zero");
  auto clamp = [&](int64_t i, bool negative_step) {
    if (i < 0) {
      i += length;
      if (i < 0) i = negative_step ? -1 : 0;
    } else if (i >= length) {
      i = negative_step ? length - 1 : length;
    }
    return i;
  };
  int64_t start = no_start ? (step < 0 ? length - 1 : 0) : clamp(slice_int(start_v, "start"), step < 0);
  int64_t stop = no_stop ? (step < 0 ? -1 : length) : clamp(slice_int(stop_v, "stop"), step < 0);
  return {start, stop, step};
}

template <typename Emit>
void walk_slice(const SliceBounds& b, Emit emit) {
  if (b.step > 0) {
    for (int64_t i = b.start; i < b.stop; i += b.step) emit(static_cast<size_t>(i));
  } else {
    for (int64_t i = b.start; i > b.stop; i += b.step) emit(static_cast<size_t>(i));
  }
}

int64_t normalize_index(int64_t index, size_t size) {
  if (index < 0) index += static_cast<int64_t>(size);
  return index;
}

std::string expect_string(const Value& v, std::string_view callee, std::string_view what) {
  if (!v.is_string()) {
    throw Error(std::string(callee) + "() " + std::string(what) + " must be str, not " + std::string(type_name(v)));
  }
  return v.as_string();
}

// Code point index of the byte offset `byte` in s.
int64_t codepoint_index(const std::string& s, size_t byte) {
  return static_cast<int64_t>(text::length(std::string_view(s).substr(0, byte)));
}

// Byte range [begin, end) of s selected by optional code point start/end args.
std::pair<size_t, size_t> byte_range(const std::string& s, const Value& start, const Value& end) {
  std::vector<size_t> b = text::boundaries(s);
  int64_t n = static_cast<int64_t>(b.size()) - 1;
  auto pick = [&](const Value& v, int64_t fallback) {
    if (v.is_undefined() || v.is_none()) return fallback;
    int64_t i = slice_int(v, "index");
    if (i < 0) i = std::max<int64_t>(0, i + n);
    return std::min(i, n);
  };
  int64_t first = pick(start, 0), last = pick(end, n);
  if (last < first) last = first;
  return {b[static_cast<size_t>(first)], b[static_cast<size_t>(last)]};
}

Value string_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& p : parts) items.push_back(Value::string(std::move(p)));
  return Value::list(std::move(items));
}

bool all_codepoints(const std::string& s, bool (*pred)(char32_t)) {
  if (s.empty()) return false;
  for (size_t pos = 0, len = 0; pos < s.size(); pos += len) {
    if (!pred(text::decode(s, pos, len))) return false;
  }
  return true;
}

Value justify(const std::string& s, const BoundArgs& a, char how, std::string_view callee) {
  int64_t width = a.int_or(0, 0);
  std::string fill = a.string_or(1, " ");
  if (text::length(fill) != 1) throw Error(std::string(callee) + "() fill character must be exactly one character long");
  int64_t len = static_cast<int64_t>(text::length(s));
  if (width <= len) return Value::string(s);
  size_t missing = static_cast<size_t>(width - len);
  check_size(missing * fill.size() + s.size());
  auto repeat = [&](size_t k) {
    std::string r;
    for (size_t i = 0; i < k; ++i) r += fill;
    return r;
  };
  if (how == '<') return Value::string(s + repeat(missing));
  if (how == '>') return Value::string(repeat(missing) + s);
  // CPython's rule for where the odd fill character goes.
  size_t left = missing / 2 + (missing & static_cast<size_t>(width) & 1);
  return Value::string(repeat(left) + s + repeat(missing - left));
}

bool call_string_method(const Value& object, std::string_view name, const CallArgs& args, Value& result) {
  const std::string& s = object.as_string();
  const std::string callee = "str." + std::string(name);
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    BoundArgs a(callee, args, {"chars"});
    std::string chars;
    bool has_chars = a.given(0) && !a[0].is_none();
    if (has_chars) chars = expect_string(a[0], callee, "argument");
    text::Side side = name == "strip" ? text::Side::Both : name == "lstrip" ? text::Side::Left : text::Side::Right;
    result = Value::string(text::strip(s, side, has_chars ? &chars : nullptr));
  } else if (name == "split" || name == "rsplit") {
    BoundArgs a(callee, args, {"sep", "maxsplit"});
    std::string sep;
    bool has_sep = a.given(0) && !a[0].is_none();
    if (has_sep) sep = expect_string(a[0], callee, "separator");
    int64_t maxsplit = a.int_or(1, -1);
    auto parts = name == "split" ? text::split(s, has_sep ? &sep : nullptr, maxsplit)
                                 : text::rsplit(s, has_sep ? &sep : nullptr, maxsplit);
    charge_steps(parts.size());
    result = string_list(std::move(parts));
  } else if (name == "splitlines") {
    BoundArgs a(callee, args, {"keepends"});
    result = string_list(text::splitlines(s, a.bool_or(0, false)));
  } else if (name == "startswith" || name == "endswith") {
    BoundArgs a(callee, args, {"prefix", "start", "end"});
    auto [begin, end] = byte_range(s, a[1], a[2]);
    std::string_view view = std::string_view(s).substr(begin, end - begin);
    auto matches = [&](const Value& candidate) {
      std::string affix = expect_string(candidate, callee, "argument");
      if (affix.size() > view.size()) return false;
      return name == "startswith" ? view.substr(0, affix.size()) == affix
                                  : view.substr(view.size() - affix.size()) == affix;
    };
    bool hit = false;
    if (a[0].is_list()) {
      for (const Value& candidate : a[0].as_list().items) hit = hit || matches(candidate);
    } else {
      hit = matches(a[0]);
    }
    result = Value::boolean(hit);
  } else if (name == "replace") {
    BoundArgs a(callee, args, {"old", "new", "count"});
    std::string from = expect_string(a[0], callee, "argument 1");
    std::string to = expect_string(a[1], callee, "argument 2");
    result = Value::string(text::replace(s, from, to, a.int_or(2, -1)));
  } else if (name == "upper") {
    BoundArgs a(callee, args, {});
    result = Value::string(text::upper(s));
  } else if (name == "lower") {
    BoundArgs a(callee, args, {});
    result = Value::string(text::lower(s));
  } else if (name == "title") {
    BoundArgs a(callee, args, {});
    result = Value::string(text::python_title(s));
  } else if (name == "capitalize") {
    BoundArgs a(callee, args, {});
    result = Value::string(text::capitalize(s));
  } else if (name == "swapcase") {
    BoundArgs a(callee, args, {});
    std::string out;
    for (size_t pos = 0, len = 0; pos < s.size(); pos += len) {
      text::decode(s, pos, len);
      std::string_view ch = std::string_view(s).substr(pos, len);
      std::string up = text::upper(ch);
      out += up != ch ? up : text::lower(ch);
    }
    result = Value::string(std::move(out));
  } else if (name == "format") {
    result = Value::string(format::brace(s, args));
  } else if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    BoundArgs a(callee, args, {"sub", "start", "end"});
    std::string sub = expect_string(a[0], callee, "argument");
    auto [begin, end] = byte_range(s, a[1], a[2]);
    std::string_view view = std::string_view(s).substr(begin, end - begin);
    size_t hit = (name == "find" || name == "index") ? view.find(sub) : view.rfind(sub);
    if (hit == std::string_view::npos) {
      if (name == "index" || name == "rindex") throw Error("substring not found");
      result = Value::integer(-1);
    } else {
      result = Value::integer(codepoint_index(s, begin + hit));
    }
  } else if (name == "count") {
    BoundArgs a(callee, args, {"sub", "start", "end"});
    std::string sub = expect_string(a[0], callee, "argument");
    auto [begin, end] = byte_range(s, a[1], a[2]);
    std::string_view view = std::string_view(s).substr(begin, end - begin);
    int64_t n = 0;
    if (sub.empty()) {
      n = static_cast<int64_t>(text::length(view)) + 1;
    } else {
      for (size_t pos = view.find(sub); pos != std::string_view::npos; pos = view.find(sub, pos + sub.size())) ++n;
    }
    result = Value::integer(n);
  } else if (name == "join") {
    BoundArgs a(callee, args, {"iterable"});
    std::string out;
    size_t i = 0;
    for (const Value& item : iterate(a[0])) {
      if (!item.is_string()) {
        throw Error("sequence item " + std::to_string(i) + ": expected str instance, " +
                    std::string(type_name(item)) + " found");
      }
      if (i++) out += s;
      out += item.as_string();
      check_size(out.size());
    }
    result = Value::string(std::move(out));
  } else if (name == "isdigit" || name == "isnumeric" || name == "isdecimal") {
    BoundArgs a(callee, args, {});
    result = Value::boolean(all_codepoints(s, [](char32_t c) { return c >= '0' && c <= '9'; }));
  } else if (name == "isalpha") {
    BoundArgs a(callee, args, {});
    result = Value::boolean(all_codepoints(s, [](char32_t c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
    }));
  } else if (name == "isalnum") {
    BoundArgs a(callee, args, {});
    result = Value::boolean(all_codepoints(s, [](char32_t c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80;
    }));
  } else if (name == "isspace") {
    BoundArgs a(callee, args, {});
    result = Value::boolean(all_codepoints(s, text::is_space));
  } else if (name == "isupper" || name == "islower") {
    BoundArgs a(callee, args, {});
    std::string upper = text::upper(s), lower = text::lower(s);
    bool cased = upper != lower;
    result = Value::boolean(cased && (name == "isupper" ? s == upper : s == lower));
  } else if (name == "ljust" || name == "rjust" || name == "center") {
    BoundArgs a(callee, args, {"width", "fillchar"});
    result = justify(s, a, name == "ljust" ? '<' : name == "rjust" ? '>' : '^', callee);
  } else if (name == "zfill") {
    BoundArgs a(callee, args, {"width"});
    int64_t width = a.int_or(0, 0);
    int64_t len = static_cast<int64_t>(text::length(s));
    if (width <= len) {
      result = Value::string(s);
    } else {
      check_size(static_cast<size_t>(width));
      size_t sign = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
      result = Value::string(s.substr(0, sign) + std::string(static_cast<size_t>(width - len), '0') + s.substr(sign));
    }
  } else if (name == "removeprefix" || name == "removesuffix") {
    BoundArgs a(callee, args, {"affix"});
    std::string affix = expect_string(a[0], callee, "argument");
    if (name == "removeprefix" && s.compare(0, affix.size(), affix) == 0) result = Value::string(s.substr(affix.size()));
    else if (name == "removesuffix" && s.size() >= affix.size() && s.compare(s.size() - affix.size(), affix.size(), affix) == 0)
      result = Value::string(s.substr(0, s.size() - affix.size()));
    else result = Value::string(s);
  } else if (name == "partition" || name == "rpartition") {
    BoundArgs a(callee, args, {"sep"});
    std::string sep = expect_string(a[0], callee, "argument");
    if (sep.empty()) throw Error("empty separator");
    size_t hit = name == "partition" ? s.find(sep) : s.rfind(sep);
    std::vector<Value> parts;
    if (hit == std::string::npos) {
      if (name == "partition") parts = {Value::string(s), Value::string(""), Value::string("")};
      else parts = {Value::string(""), Value::string(""), Value::string(s)};
    } else {
      parts = {Value::string(s.substr(0, hit)), Value::string(sep), Value::string(s.substr(hit + sep.size()))};
    }
    result = Value::list(std::move(parts), true);
  } else {
    return false;
  }
  return true;
}

bool call_list_method(const Value& object, std::string_view name, const CallArgs& args, Value& result) {
  ListData& list = object.as_list();
  const std::string callee = std::string(type_name(object)) + "." + std::string(name);
  result = Value::none();
  if (name == "append") {
    BoundArgs a(callee, args, {"object"});
    CycleBreaker::note_store(object, a[0]);
    list.items.push_back(a[0]);
  } else if (name == "extend") {
    BoundArgs a(callee, args, {"iterable"});
    std::vector<Value> extra = iterate(a[0]);
    charge_steps(extra.size());
    for (const Value& v : extra) CycleBreaker::note_store(object, v);
    list.items.insert(list.items.end(), extra.begin(), extra.end());
  } else if (name == "insert") {
    BoundArgs a(callee, args, {"index", "object"});
    int64_t i = normalize_index(a.int_or(0, 0), list.items.size());
    i = std::clamp<int64_t>(i, 0, static_cast<int64_t>(list.items.size()));
    CycleBreaker::note_store(object, a[1]);
    list.items.insert(list.items.begin() + i, a[1]);
  } else if (name == "pop") {
    BoundArgs a(callee, args, {"index"});
    if (list.items.empty()) throw Error("pop from empty list");
    int64_t i = normalize_index(a.int_or(0, -1), list.items.size());
    if (i < 0 || i >= static_cast<int64_t>(list.items.size())) throw Error("pop index out of range");
    result = list.items[static_cast<size_t>(i)];
    list.items.erase(list.items.begin() + i);
  } else if (name == "remove") {
    BoundArgs a(callee, args, {"value"});
    auto it = std::find_if(list.items.begin(), list.items.end(), [&](const Value& v) { return equals(v, a[0]); });
    if (it == list.items.end()) throw Error("list.remove(x): x not in list");
    list.items.erase(it);
  } else if (name == "index") {
    BoundArgs a(callee, args, {"value"});
    auto it = std::find_if(list.items.begin(), list.items.end(), [&](const Value& v) { return equals(v, a[0]); });
    if (it == list.items.end()) throw Error(repr(a[0]) + " is not in list");
    result = Value::integer(it - list.items.begin());
  } else if (name == "count") {
    BoundArgs a(callee, args, {"value"});
    result = Value::integer(std::count_if(list.items.begin(), list.items.end(),
                                          [&](const Value& v) { return equals(v, a[0]); }));
  } else if (name == "reverse") {
    BoundArgs a(callee, args, {});
    std::reverse(list.items.begin(), list.items.end());
  } else if (name == "sort") {
    BoundArgs a(callee, args, {"reverse"});
    bool reverse = a.bool_or(0, false);
    std::stable_sort(list.items.begin(), list.items.end(), [&](const Value& x, const Value& y) {
      return reverse ? compare(y, x) < 0 : compare(x, y) < 0;
    });
  } else if (name == "copy") {
    BoundArgs a(callee, args, {});
    result = Value::list(list.items);
  } else if (name == "clear") {
    BoundArgs a(callee, args, {});
    list.items.clear();
  } else {
    return false;
  }
  return true;
}

bool call_dict_method(const Value& object, std::string_view name, const CallArgs& args, Value& result) {
  DictData& dict = object.as_dict();
  const std::string callee = "dict." + std::string(name);
  result = Value::none();
  auto key_of = [&](const Value& key) -> std::string {
    if (key.is_string()) return key.as_string();
    if (key.is_list() || key.is_dict()) throw Error("unhashable type: '" + std::string(type_name(key)) + "'");
    return to_str(key);
  };
  if (name == "get") {
    BoundArgs a(callee, args, {"key", "default"});
    const Value* found = a[0].is_string() ? dict.find(a[0].as_string()) : nullptr;
    result = found ? *found : (a.given(1) ? a[1] : Value::none());
  } else if (name == "items") {
    BoundArgs a(callee, args, {});
    std::vector<Value> pairs;
    pairs.reserve(dict.size());
    charge_steps(dict.size());
    for (const auto& [key, value] : dict.entries()) pairs.push_back(Value::list({Value::string(key), value}, true));
    result = Value::list(std::move(pairs));
  } else if (name == "keys") {
    BoundArgs a(callee, args, {});
    result = Value::list(iterate(object));
  } else if (name == "values") {
    BoundArgs a(callee, args, {});
    std::vector<Value> values;
    for (const auto& entry : dict.entries()) values.push_back(entry.second);
    result = Value::list(std::move(values));
  } else if (name == "pop") {
    BoundArgs a(callee, args, {"key", "default"});
    std::string key = key_of(a[0]);
    if (const Value* found = dict.find(key)) {
      result = *found;
      dict.erase(key);
    } else if (a.given(1)) {
      result = a[1];
    } else {
      throw Error("KeyError: " + format::string_repr(key));
    }
  } else if (name == "setdefault") {
    BoundArgs a(callee, args, {"key", "default"});
    std::string key = key_of(a[0]);
    if (const Value* found = dict.find(key)) {
      result = *found;
    } else {
      Value fallback = a.given(1) ? a[1] : Value::none();
      CycleBreaker::note_store(object, fallback);
      dict.set(key, fallback);
      result = fallback;
    }
  } else if (name == "update") {
    if (args.positional.size() > 1) throw Error("update expected at most 1 argument");
    if (!args.positional.empty()) {
      const Value& other = args.positional[0];
      if (!other.is_dict()) throw Error("dict.update() needs a mapping");
      for (const auto& [key, value] : other.as_dict().entries()) {
        CycleBreaker::note_store(object, value);
        dict.set(key, value);
      }
    }
    for (const auto& [key, value] : args.named) {
      CycleBreaker::note_store(object, value);
      dict.set(key, value);
    }
  } else if (name == "copy") {
    BoundArgs a(callee, args, {});
    result = Value::dict();
    for (const auto& [key, value] : dict.entries()) result.as_dict().set(key, value);
  } else if (name == "clear") {
    BoundArgs a(callee, args, {});
    std::vector<std::string> keys;
    for (const auto& entry : dict.entries()) keys.push_back(entry.first);
    for (const auto& key : keys) dict.erase(key);
  } else {
    return false;
  }
  return true;
}

}  // namespace

Value get_attribute(const Value& object, std::string_view name) {
  if (has_method(object, name)) return Value::callable(std::make_shared<BoundMethod>(object, std::string(name)));
  if (object.is_dict()) {
    if (const Value* v = object.as_dict().find(name)) return *v;
  }
  return Value::undefined(name);
}

Value get_item(const Value& object, const Value& key) {
  switch (object.kind()) {
    case Value::Kind::Dict:
      if (key.is_string()) {
        if (const Value* v = object.as_dict().find(key.as_string())) return *v;
        return get_attribute(object, key.as_string());
      }
      if (key.is_int() || key.is_bool() || key.is_float()) {
        if (const Value* v = object.as_dict().find(to_str(key))) return *v;
      }
      return Value::undefined();
    case Value::Kind::List: {
      if (key.is_int() || key.is_bool()) {
        const auto& items = object.as_list().items;
        int64_t i = normalize_index(key.as_int(), items.size());
        if (i < 0 || i >= static_cast<int64_t>(items.size())) return Value::undefined();
        return items[static_cast<size_t>(i)];
      }
      if (key.is_string()) return get_attribute(object, key.as_string());
      return Value::undefined();
    }
    case Value::Kind::String: {
      if (key.is_int() || key.is_bool()) {
        const std::string& s = object.as_string();
        std::vector<size_t> b = text::boundaries(s);
        int64_t i = normalize_index(key.as_int(), b.size() - 1);
        if (i < 0 || i >= static_cast<int64_t>(b.size() - 1)) return Value::undefined();
        size_t k = static_cast<size_t>(i);
        return Value::string(s.substr(b[k], b[k + 1] - b[k]));
      }
      if (key.is_string()) return get_attribute(object, key.as_string());
      return Value::undefined();
    }
    default:
      return key.is_string() ? Value::undefined(key.as_string()) : Value::undefined();
  }
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_list()) {
    const auto& items = object.as_list().items;
    SliceBounds b = adjust_slice(static_cast<int64_t>(items.size()), start, stop, step);
    std::vector<Value> out;
    walk_slice(b, [&](size_t i) { out.push_back(items[i]); });
    return Value::list(std::move(out), object.as_list().is_tuple);
  }
  if (object.is_string()) {
    const std::string& s = object.as_string();
    std::vector<size_t> bounds = text::boundaries(s);
    SliceBounds b = adjust_slice(static_cast<int64_t>(bounds.size() - 1), start, stop, step);
    std::string out;
    if (b.step == 1) {
      if (b.stop > b.start) out = s.substr(bounds[static_cast<size_t>(b.start)], bounds[static_cast<size_t>(b.stop)] - bounds[static_cast<size_t>(b.start)]);
    } else {
      walk_slice(b, [&](size_t i) { out.append(s, bounds[i], bounds[i + 1] - bounds[i]); });
    }
    return Value::string(std::move(out));
  }
  if (object.is_undefined()) return Value::undefined();
  throw Error("'" + std::string(type_name(object)) + "' object is not subscriptable");
}

bool call_method(Renderer&, const Value& object, std::string_view name, const CallArgs& args, Value& result) {
  if (!has_method(object, name)) return false;
  if (object.is_string()) return call_string_method(object, name, args, result);
  if (object.is_list()) return call_list_method(object, name, args, result);
  return call_dict_method(object, name, args, result);
}

}  // namespace reprise::jinja
