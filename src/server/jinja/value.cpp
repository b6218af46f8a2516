#include "server/jinja/value.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <unordered_set>

#include "server/jinja/budget.h"
#include "server/jinja/format.h"
#include "server/jinja/text.h"
#include "util/error.h"

namespace reprise::jinja {

std::string wide_to_string(__int128 v) {
  if (v >= INT64_MIN && v <= INT64_MAX) return std::to_string(static_cast<int64_t>(v));
  const bool negative = v < 0;
  unsigned __int128 u = negative ? -static_cast<unsigned __int128>(v) : static_cast<unsigned __int128>(v);
  std::string digits;
  while (u) {
    digits += static_cast<char>('0' + static_cast<int>(u % 10));
    u /= 10;
  }
  if (negative) digits += '-';
  return {digits.rbegin(), digits.rend()};
}

// ---------------------------------------------------------------------------
// Containers. Destroying a deeply nested structure recursively could overflow
// the stack, so past a small depth children are parked in a thread-local list
// and destroyed iteratively by the outermost destructor.

namespace {

thread_local int destroy_depth = 0;
thread_local std::vector<Value>* deferred_values = nullptr;

template <typename Children>
void release_children(Children& children) {
  constexpr int kMaxRecursiveDestroy = 32;
  if (destroy_depth >= kMaxRecursiveDestroy && deferred_values) {
    for (auto& child : children) deferred_values->push_back(std::move(child));
    return;
  }
  ++destroy_depth;
  std::vector<Value> local_deferred;
  bool outermost = deferred_values == nullptr;
  if (outermost) deferred_values = &local_deferred;
  children.clear();
  if (outermost) {
    while (!local_deferred.empty()) {
      Value v = std::move(local_deferred.back());
      local_deferred.pop_back();
      // v is destroyed here; its own children may be deferred again.
    }
    deferred_values = nullptr;
  }
  --destroy_depth;
}

std::atomic<int64_t> live_container_count{0};

}  // namespace

int64_t live_containers() { return live_container_count.load(); }

ListData::ListData() { ++live_container_count; }

ListData::~ListData() {
  clear();
  --live_container_count;
}

void ListData::clear() {
  std::vector<Value> children = std::move(items);
  items.clear();
  release_children(children);
}

DictData::DictData(Flavor f) : flavor(f) { ++live_container_count; }

DictData::~DictData() {
  clear();
  --live_container_count;
}

void DictData::clear() {
  std::vector<Value> values;
  values.reserve(entries_.size());
  for (auto& entry : entries_) values.push_back(std::move(entry.second));
  entries_.clear();
  index_.clear();
  index_valid_ = false;
  release_children(values);
}

const Value* DictData::find(std::string_view key) const {
  constexpr size_t kLinearScanLimit = 12;
  if (entries_.size() <= kLinearScanLimit) {
    for (const auto& [k, v] : entries_) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  if (!index_valid_) {
    index_.clear();
    for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
    index_valid_ = true;
  }
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void DictData::set(std::string key, Value value) {
  if (const Value* existing = find(key)) {
    *const_cast<Value*>(existing) = std::move(value);
    return;
  }
  entries_.emplace_back(std::move(key), std::move(value));
  if (index_valid_) index_.emplace(entries_.back().first, entries_.size() - 1);
}

bool DictData::erase(std::string_view key) {
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const auto& e) { return e.first == key; });
  if (it == entries_.end()) return false;
  entries_.erase(it);
  index_valid_ = false;
  return true;
}

// ---------------------------------------------------------------------------
// Construction and access.

Value Value::undefined(std::string_view hint) {
  Value v;
  if (!hint.empty()) v.data_ = Undefined{std::make_shared<const std::string>(hint)};
  return v;
}
Value Value::none() {
  Value v;
  v.data_ = None{};
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.data_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.data_ = static_cast<__int128>(i);
  return v;
}
Value Value::wide_integer(__int128 i) {
  Value v;
  v.data_ = i;
  return v;
}
Value Value::number(double d) {
  Value v;
  v.data_ = d;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.data_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::list(std::vector<Value> items, bool tuple) {
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  data->is_tuple = tuple;
  Value v;
  v.data_ = std::move(data);
  return v;
}
Value Value::dict(DictData::Flavor flavor) {
  Value v;
  v.data_ = std::make_shared<DictData>(flavor);
  return v;
}
Value Value::callable(std::shared_ptr<Callable> c) {
  Value v;
  v.data_ = std::move(c);
  return v;
}

namespace {

template <typename Json>
Value convert_json(const Json& j) {
  ValueNesting nesting;
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::wide_integer(static_cast<__int128>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value::number(j.template get<double>());
    case nlohmann::json::value_t::string: return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(convert_json(item));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::dict();
      for (auto it = j.begin(); it != j.end(); ++it) d.as_dict().set(it.key(), convert_json(it.value()));
      return d;
    }
    default:
      return Value::none();  // binary / discarded: not representable
  }
}

}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) { return convert_json(j); }
Value Value::from_json(const nlohmann::json& j) { return convert_json(j); }

int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  const __int128 w = std::get<__int128>(data_);
  if (w > INT64_MAX || w < INT64_MIN) throw Error("integer overflow (" + wide_to_string(w) + " needs more than 64 bits)");
  return static_cast<int64_t>(w);
}

__int128 Value::as_wide() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  return std::get<__int128>(data_);
}

double Value::as_double() const {
  if (is_float()) return std::get<double>(data_);
  return static_cast<double>(as_wide());
}

std::string_view Value::undefined_hint() const {
  if (auto* u = std::get_if<Undefined>(&data_); u && u->hint) return *u->hint;
  return {};
}

const void* Value::identity() const {
  switch (kind()) {
    case Kind::String: return std::get<StringPtr>(data_).get();
    case Kind::List: return std::get<ListPtr>(data_).get();
    case Kind::Dict: return std::get<DictPtr>(data_).get();
    case Kind::Callable: return std::get<CallablePtr>(data_).get();
    default: return nullptr;
  }
}

// ---------------------------------------------------------------------------
// Python semantics.

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.as_bool();
    case Value::Kind::Int: return v.as_wide() != 0;
    case Value::Kind::Float: return v.as_double() != 0.0;
    case Value::Kind::String: return !v.as_string().empty();
    case Value::Kind::List: return v.as_list().is_generator || !v.as_list().items.empty();
    case Value::Kind::Dict:
      return v.as_dict().flavor != DictData::Flavor::Dict || v.as_dict().size() > 0;
    case Value::Kind::Callable: return true;
  }
  return false;
}

std::string_view type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List: return v.as_list().is_tuple ? "tuple" : "list";
    case Value::Kind::Dict:
      switch (v.as_dict().flavor) {
        case DictData::Flavor::Namespace: return "Namespace";
        case DictData::Flavor::Loop: return "LoopContext";
        default: return "dict";
      }
    case Value::Kind::Callable: return "function";
  }
  return "object";
}

static bool numeric(const Value& v) { return v.is_number() || v.is_bool(); }

bool equals(const Value& a, const Value& b) {
  charge_steps(1);
  if (numeric(a) && numeric(b)) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_wide() == b.as_wide();
  }
  if (a.kind() != b.kind()) return false;
  if (a.identity() && a.identity() == b.identity()) return true;
  switch (a.kind()) {
    case Value::Kind::Undefined: case Value::Kind::None: return true;
    case Value::Kind::String: return a.as_string() == b.as_string();
    case Value::Kind::List: {
      ValueNesting nesting;
      const auto& x = a.as_list().items;
      const auto& y = b.as_list().items;
      if (x.size() != y.size() || a.as_list().is_tuple != b.as_list().is_tuple) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::Dict: {
      ValueNesting nesting;
      const DictData& x = a.as_dict();
      const DictData& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [key, value] : x.entries()) {
        const Value* other = y.find(key);
        if (!other || !equals(value, *other)) return false;
      }
      return true;
    }
    default: return false;  // distinct callables
  }
}

int compare(const Value& a, const Value& b) {
  charge_steps(1);
  if (numeric(a) && numeric(b)) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const __int128 x = a.as_wide(), y = b.as_wide();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order = code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
    ValueNesting nesting;
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  throw Error("'<' not supported between instances of '" + std::string(type_name(a)) + "' and '" +
              std::string(type_name(b)) + "'");
}

namespace {

void append_repr(std::string& out, const Value& v);

void append_str(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return;
    case Value::Kind::None: out += "None"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "True" : "False"; return;
    case Value::Kind::Int: out += wide_to_string(v.as_wide()); return;
    case Value::Kind::Float: out += format::float_repr(v.as_double()); return;
    case Value::Kind::String: out += v.as_string(); return;
    case Value::Kind::Callable: out += "<function " + v.as_callable().name() + ">"; return;
    case Value::Kind::Dict:
      if (v.as_dict().flavor == DictData::Flavor::Namespace) {
        out += "<Namespace ";
        append_repr(out, v);
        out += ">";
        return;
      }
      [[fallthrough]];
    case Value::Kind::List: append_repr(out, v); return;
  }
}

void append_repr(std::string& out, const Value& v) {
  charge_steps(1);
  check_size(out.size());
  switch (v.kind()) {
    case Value::Kind::String: out += format::string_repr(v.as_string()); return;
    case Value::Kind::Undefined: out += "Undefined"; return;
    case Value::Kind::List: {
      ValueNesting nesting;
      const ListData& list = v.as_list();
      out += list.is_tuple ? '(' : '[';
      for (size_t i = 0; i < list.items.size(); ++i) {
        if (i) out += ", ";
        append_repr(out, list.items[i]);
      }
      if (list.is_tuple && list.items.size() == 1) out += ',';
      out += list.is_tuple ? ')' : ']';
      return;
    }
    case Value::Kind::Dict: {
      ValueNesting nesting;
      out += '{';
      bool first = true;
      for (const auto& [key, value] : v.as_dict().entries()) {
        if (!first) out += ", ";
        first = false;
        out += format::string_repr(key);
        out += ": ";
        append_repr(out, value);
      }
      out += '}';
      return;
    }
    default: append_str(out, v); return;
  }
}

void append_json(std::string& out, const Value& v, const JsonStyle& style, int level) {
  charge_steps(1);
  check_size(out.size());
  const bool indented = style.indent >= 0 || style.indent_text;
  const std::string item_separator = style.item_separator.value_or(indented ? "," : ", ");
  auto newline = [&](int lvl) {
    out += '\n';
    if (style.indent_text) {
      for (int i = 0; i < lvl; ++i) out += *style.indent_text;
    } else {
      out.append(static_cast<size_t>(style.indent) * static_cast<size_t>(lvl), ' ');
    }
  };
  switch (v.kind()) {
    case Value::Kind::Undefined:
      throw Error("Object of type Undefined is not JSON serializable");
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += wide_to_string(v.as_wide()); return;
    case Value::Kind::Float: {
      double d = v.as_double();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
      else out += format::float_repr(d);
      return;
    }
    case Value::Kind::String: format::append_json_string(out, v.as_string(), style.ensure_ascii); return;
    case Value::Kind::Callable:
      throw Error("Object of type function is not JSON serializable");
    case Value::Kind::List: {
      ValueNesting nesting;
      const auto& items = v.as_list().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_separator;
        if (indented) newline(level + 1);
        append_json(out, items[i], style, level + 1);
      }
      if (indented) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::Dict: {
      ValueNesting nesting;
      const DictData& dict = v.as_dict();
      if (dict.flavor != DictData::Flavor::Dict) {
        throw Error("Object of type " + std::string(type_name(v)) + " is not JSON serializable");
      }
      if (dict.size() == 0) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : dict.entries()) entries.push_back(&e);
      if (style.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](auto* x, auto* y) { return x->first < y->first; });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_separator;
        if (indented) newline(level + 1);
        format::append_json_string(out, entries[i]->first, style.ensure_ascii);
        out += style.key_separator;
        append_json(out, entries[i]->second, style, level + 1);
      }
      if (indented) newline(level);
      out += '}';
      return;
    }
  }
}

}  // namespace

std::string to_str(const Value& v) {
  if (v.is_string()) return v.as_string();
  std::string out;
  append_str(out, v);
  return out;
}

std::string repr(const Value& v) {
  std::string out;
  append_repr(out, v);
  return out;
}

std::string to_json(const Value& v, const JsonStyle& style) {
  std::string out;
  append_json(out, v, style, 0);
  return out;
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return v.as_list().items;
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      if (v.as_dict().flavor != DictData::Flavor::Dict) break;
      keys.reserve(v.as_dict().size());
      for (const auto& entry : v.as_dict().entries()) keys.push_back(Value::string(entry.first));
      return keys;
    }
    case Value::Kind::String: {
      const std::string& s = v.as_string();
      std::vector<size_t> b = text::boundaries(s);
      std::vector<Value> chars;
      chars.reserve(b.size() - 1);
      for (size_t i = 0; i + 1 < b.size(); ++i) chars.push_back(Value::string(s.substr(b[i], b[i + 1] - b[i])));
      return chars;
    }
    default: break;
  }
  throw Error("'" + std::string(type_name(v)) + "' object is not iterable");
}

namespace {
thread_local CycleBreaker* active_breaker = nullptr;
}  // namespace

CycleBreaker::CycleBreaker() : previous_(active_breaker) { active_breaker = this; }

CycleBreaker::~CycleBreaker() {
  active_breaker = previous_;
  for (auto& weak : lists_) {
    if (auto list = weak.lock()) list->clear();
  }
  for (auto& weak : dicts_) {
    if (auto dict = weak.lock()) dict->clear();
  }
}

void CycleBreaker::note_store(const Value& container, const Value& item) {
  if (!active_breaker) return;
  // Scalars and strings cannot reach back to the container.
  if (!item.is_list() && !item.is_dict() && !item.is_callable()) return;
  if (!active_breaker->seen_.emplace(container.identity(), true).second) return;
  if (container.is_list()) active_breaker->lists_.push_back(std::get<Value::ListPtr>(container.data_));
  else if (container.is_dict()) active_breaker->dicts_.push_back(std::get<Value::DictPtr>(container.data_));
}

void CycleBreaker::note(const std::shared_ptr<DictData>& dict) {
  if (!active_breaker || !active_breaker->seen_.emplace(dict.get(), true).second) return;
  active_breaker->dicts_.push_back(dict);
}

}  // namespace reprise::jinja
