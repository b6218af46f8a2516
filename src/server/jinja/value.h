// The interpreter's runtime value: Python's object model reduced to what chat
// templates use.
//
// Lists and dicts are shared and mutable (Python reference semantics), so
// `ns.items.append(x)` and namespace attribute assignment are visible through
// every alias. Strings are shared immutably so copying a Value is cheap.
// Dicts keep insertion order, as Python dicts do; tojson and items() depend
// on it. Undefined is distinct from None: it prints as nothing, is falsy,
// iterates as empty, and remembers the name that produced it for messages.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace reprise::jinja {

class Value;
class Renderer;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};

// Anything a template can call: globals, macros, bound methods, loop.cycle.
class Callable {
 public:
  virtual ~Callable() = default;
  virtual Value call(Renderer& renderer, CallArgs& args) = 0;
  virtual std::string name() const = 0;
};

struct ListData {
  ListData();
  ListData(const ListData&) = delete;
  ListData& operator=(const ListData&) = delete;
  std::vector<Value> items;
  bool is_tuple = false;  // tuples print as (a, b) and refuse mutation
  // Result of a filter that yields a Python generator in Jinja2 (map,
  // select, selectattr, ...). Generators are always truthy, even when empty,
  // and templates that test `{% if xs|select(...) %}` depend on it.
  bool is_generator = false;
  ~ListData();
  void clear();  // releases children without deep recursion
};

struct DictData {
  // Plain dicts have methods (items, get...); namespaces and loop objects
  // only have attributes, and only namespaces accept `set ns.attr = ...`.
  enum class Flavor : uint8_t { Dict, Namespace, Loop };

  explicit DictData(Flavor f = Flavor::Dict);
  DictData(const DictData&) = delete;
  DictData& operator=(const DictData&) = delete;
  ~DictData();
  void clear();  // releases children without deep recursion

  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
  // Mutable slot for an existing key; stays valid until a key is added or
  // erased. Lets the renderer update a loop object in place each iteration.
  Value* slot(std::string_view key) { return const_cast<Value*>(find(key)); }
  bool erase(std::string_view key);
  size_t size() const { return entries_.size(); }
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }

  Flavor flavor;

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::vector<std::pair<std::string, Value>> entries_;
  mutable std::unordered_map<std::string, size_t, Hash, std::equal_to<>> index_;
  mutable bool index_valid_ = false;
};

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };

  Value() = default;  // Undefined
  static Value undefined(std::string_view hint = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  // An integer of the input context beyond 64 bits (a JSON number up to
  // 2^64 - 1, a uint64 field's maximum in a tool schema): printed and
  // serialised exactly, compared exactly; arithmetic on it is an overflow
  // error, as 64-bit arithmetic is (Python's would be exact).
  static Value wide_integer(__int128 i);
  static Value number(double d);
  static Value string(std::string s);
  static Value list(std::vector<Value> items = {}, bool tuple = false);
  static Value dict(DictData::Flavor flavor = DictData::Flavor::Dict);
  static Value callable(std::shared_ptr<Callable> c);
  // Input context conversion; ordered_json keeps key order as Python does.
  // Nesting deeper than the value limit is a reprise::Error.
  static Value from_json(const nlohmann::ordered_json& j);
  static Value from_json(const nlohmann::json& j);

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_float() const { return kind() == Kind::Float; }
  bool is_number() const { return is_int() || is_float(); }  // bool excluded
  bool is_string() const { return kind() == Kind::String; }
  bool is_list() const { return kind() == Kind::List; }
  bool is_dict() const { return kind() == Kind::Dict; }
  bool is_callable() const { return kind() == Kind::Callable; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const;    // Int or Bool; throws for a wide integer
  __int128 as_wide() const;  // Int or Bool, exactly
  double as_double() const;  // Int, Float or Bool
  const std::string& as_string() const { return *std::get<StringPtr>(data_); }
  ListData& as_list() const { return *std::get<ListPtr>(data_); }
  DictData& as_dict() const { return *std::get<DictPtr>(data_); }
  Callable& as_callable() const { return *std::get<CallablePtr>(data_); }
  // Name of the variable or attribute that was missing, when known.
  std::string_view undefined_hint() const;
  // Address of the shared container or callable (nullptr for scalars).
  const void* identity() const;

  friend class CycleBreaker;

 private:
  struct Undefined {
    std::shared_ptr<const std::string> hint;
  };
  struct None {};
  using StringPtr = std::shared_ptr<const std::string>;
  using ListPtr = std::shared_ptr<ListData>;
  using DictPtr = std::shared_ptr<DictData>;
  using CallablePtr = std::shared_ptr<Callable>;
  std::variant<Undefined, None, bool, __int128, double, StringPtr, ListPtr, DictPtr, CallablePtr> data_;
};

// Decimal digits of an integer (wide ones included).
std::string wide_to_string(__int128 v);
// Python truthiness.
bool truthy(const Value& v);
// Python type name for messages: 'str', 'int', 'list', 'NoneType'...
std::string_view type_name(const Value& v);
// Python ==, recursive; 1 == 1.0 == True.
bool equals(const Value& a, const Value& b);
// Python ordering (<0, 0, >0); throws reprise::Error for unorderable types.
int compare(const Value& a, const Value& b);
// str(v) as Jinja prints it ({{ none }} is "None", undefined is "").
std::string to_str(const Value& v);
// repr(v): strings quoted, used inside containers.
std::string repr(const Value& v);
// json.dumps options. The defaults are HF's tojson filter: ensure_ascii off,
// Python's default separators (", " and ": "; "," when indenting).
struct JsonStyle {
  int indent = -1;  // < 0: single line
  std::optional<std::string> indent_text;  // a string indent (json.dumps's indent="\t"): this per level
  bool sort_keys = false;
  bool ensure_ascii = false;
  std::optional<std::string> item_separator;  // default: ", " or "," when indenting
  std::string key_separator = ": ";
};
std::string to_json(const Value& v, const JsonStyle& style = {});
// Iteration as a for loop sees it: list items, dict keys, string characters;
// undefined is empty. Throws for non-iterables.
std::vector<Value> iterate(const Value& v);
// Reference cycles (l.append(l), a macro stored in the scope it closes over)
// would leak their shared_ptrs. Each mutation that could close a cycle
// registers the mutated container with the render's CycleBreaker; when the
// render ends, the breaker empties the registered containers that are still
// alive, which breaks every cycle. That is safe because nothing created
// during a render outlives it: the result is a string. Printing a cyclic
// value during the render fails on the nesting limit instead of looping.
class CycleBreaker {
 public:
  CycleBreaker();   // becomes this thread's active breaker
  ~CycleBreaker();  // empties surviving registered containers
  CycleBreaker(const CycleBreaker&) = delete;
  CycleBreaker& operator=(const CycleBreaker&) = delete;

  // Registers `container` if storing `item` in it could close a cycle.
  static void note_store(const Value& container, const Value& item);
  // Registers a dict unconditionally (scopes that hold closures over themselves).
  static void note(const std::shared_ptr<DictData>& dict);

 private:
  std::vector<std::weak_ptr<ListData>> lists_;
  std::vector<std::weak_ptr<DictData>> dicts_;
  std::unordered_map<const void*, bool> seen_;
  CycleBreaker* previous_;
};

// Number of ListData/DictData objects alive in the process (leak tests).
int64_t live_containers();

}  // namespace reprise::jinja
