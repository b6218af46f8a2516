#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "grammar/string_formats.h"
#include "util/error.h"

namespace reprise {

using nlohmann::json;

namespace {

// Keywords that only describe: ignored (JSON Schema 2020-12 treats `format`
// as an annotation unless a validator opts in).
const std::set<std::string, std::less<>> kAnnotations = {
    "$schema", "$id", "$comment", "$anchor", "title", "description", "default", "examples", "format",
    "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "strict", "discriminator"};
const std::set<std::string, std::less<>> kEnforced = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "nullable"};
constexpr size_t kMaxProperties = 64;   // SchemaNode::required is a 64-bit set
constexpr size_t kMaxNodes = 4096;
constexpr size_t kMaxLiterals = 4096;
constexpr int kMaxDepth = 128;

// The double a JSON parser reads from grid value `g`'s decimal text.
double grid_double(__int128 g) {
  const bool negative = g < 0;
  const __int128 m = negative ? -g : g;
  char text[64];
  std::snprintf(text, sizeof text, "%s%llu.%016llu", negative ? "-" : "",
                static_cast<unsigned long long>(m / SchemaNode::kGridUnit),
                static_cast<unsigned long long>(m % SchemaNode::kGridUnit));
  return std::strtod(text, nullptr);
}

// The first grid value in [lo, hi] where `holds` (monotone: false, then
// true) holds, or hi + 1.
template <typename Pred>
__int128 first_where(__int128 lo, __int128 hi, Pred holds) {
  while (lo <= hi) {
    const __int128 mid = lo + (hi - lo) / 2;
    if (holds(mid)) hi = mid - 1;
    else lo = mid + 1;
  }
  return lo;
}

void compute_number_grid(SchemaNode& n) {
  if (!(n.types & kJsonNumber) || !n.has_bounds()) return;
  const __int128 limit = SchemaNode::kGridLimit;
  auto above_min = [&](__int128 g) {
    const double d = grid_double(g);
    return n.exclusive_minimum ? d > n.minimum : d >= n.minimum;
  };
  auto above_max = [&](__int128 g) {
    const double d = grid_double(g);
    return n.exclusive_maximum ? d >= n.maximum : d > n.maximum;
  };
  n.grid_min = std::isfinite(n.minimum) ? first_where(-limit, limit, above_min) : -limit;
  n.grid_max = std::isfinite(n.maximum) ? first_where(-limit, limit, above_max) - 1 : limit;
}

std::string where(const std::string& pointer) { return pointer.empty() ? "the root" : "'" + pointer + "'"; }

// Code points of valid UTF-8 (nlohmann's parser has validated it).
int64_t code_points(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Property names are matched byte for byte while the model writes them, and
// keys are written without escapes, so a name that needs one cannot be written.
bool needs_escape(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char c) {
    return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20;
  });
}

class Compiler {
 public:
  Compiler(const json& document, JsonSchema& out) : document_(document), out_(out) {}

  int32_t compile(const json& schema, const std::string& pointer) {
    if (out_.node_count() > kMaxNodes) throw Error("the schema is too large (over 4096 nodes)");
    // References can chain without nesting in the text: bound the recursion.
    if (depth_ >= kMaxDepth) throw Error("the schema nests or chains references too deeply (over 128 levels)");
    ++depth_;
    struct Leave {
      int& depth;
      ~Leave() { --depth; }
    } leave{depth_};
    if (schema.is_boolean()) {
      SchemaNode node;
      if (schema.get<bool>()) node.types = kJsonAnyType, node.items = -2, node.additional = -2;
      return finish_any(out_.add_node(std::move(node)));
    }
    if (!schema.is_object()) throw Error("the schema at " + where(pointer) + " must be an object or a boolean");
    for (const auto& [key, value] : schema.items()) {
      if (kAnnotations.count(key) || kEnforced.count(key)) continue;
      throw Error("JSON Schema keyword '" + key + "' (at " + where(pointer) +
                  ") is not supported for structured output: reprise enforces type, enum, const, properties, "
                  "required, additionalProperties, items, prefixItems, minItems, maxItems, minLength, maxLength, "
                  "pattern, format (date, time, date-time, uuid, email, hostname, ipv4, uri), minimum, maximum, "
                  "exclusiveMinimum, exclusiveMaximum, anyOf, oneOf, allOf (one schema) and $ref");
    }
    if (schema.contains("$ref")) return compile_ref(schema, pointer);
    for (const char* key : {"anyOf", "oneOf", "allOf"})
      if (schema.contains(key)) return compile_union(schema, key, pointer);
    if (schema.contains("enum") || schema.contains("const")) return compile_literals(schema, pointer);
    return compile_plain(schema, pointer);
  }

  // `pointer` is a JSON pointer into the document ("" is the root).
  int32_t compile_pointer(const std::string& pointer) {
    // A schema reached while checking enum values has other defaults.
    const std::string key = validation_defaults_ ? pointer + "\n(validation)" : pointer;
    if (auto it = by_pointer_.find(key); it != by_pointer_.end()) return it->second;
    const json* target = &document_;
    if (!pointer.empty()) {
      try {
        target = &document_.at(json::json_pointer(pointer));
      } catch (const json::exception&) {
        throw Error("$ref '#" + pointer + "' does not point into the schema");
      }
    }
    // Reserve the id first, so a schema that refers to itself (a tree) ends
    // in a cycle of nodes rather than endless compiling.
    const int32_t id = out_.add_node({});
    by_pointer_[key] = id;
    const int32_t body = compile(*target, pointer);
    out_.mutable_node(id).any_of = {body};
    return id;
  }

 private:
  const json& document_;
  JsonSchema& out_;
  std::map<std::string, int32_t> by_pointer_;
  // Patterns: by source (pattern, NUL, format) and maxLength; the work and
  // automaton states all of them may take.
  std::map<std::pair<std::string, int64_t>, int32_t> pattern_ids_;
  uint64_t pattern_work_ = 60'000'000;
  size_t pattern_states_ = 0;
  static constexpr size_t kMaxPatternStates = 16384;
  static constexpr int64_t kMaxPatternLength = 16384;
  int depth_ = 0;
  bool validation_defaults_ = false;  // absent additionalProperties allows any keys
  int32_t any_value_ = -1;

  // The node of "any JSON value", made once: every array without `items`
  // (and, while checking enum values, every object) shares it.
  int32_t any_value() {
    if (any_value_ < 0) any_value_ = compile(json(true), "");
    return any_value_;
  }

  // The "any value" node refers to itself for items and other keys.
  int32_t finish_any(int32_t id) {
    SchemaNode& n = out_.mutable_node(id);
    if (n.items == -2) n.items = id;
    if (n.additional == -2) n.additional = id;
    return id;
  }

  static void only(const json& schema, const std::string& pointer, const std::string& keyword,
                   std::initializer_list<const char*> allowed) {
    for (auto it = schema.begin(); it != schema.end(); ++it) {
      const std::string& key = it.key();
      // An enforced format is not an annotation: beside $ref or a union it
      // would go unenforced.
      const bool enforced_format = key == "format" && it.value().is_string() &&
                                   string_format_pattern(it.value().get<std::string>()) != nullptr;
      if ((kAnnotations.count(key) && !enforced_format) || key == keyword || key == "$defs" || key == "definitions")
        continue;
      if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return key == a; }) != allowed.end())
        continue;
      throw Error("'" + keyword + "' beside '" + key + "' (at " + where(pointer) +
                  ") is not supported for structured output: put the other keywords inside its schemas");
    }
  }

  int32_t compile_ref(const json& schema, const std::string& pointer) {
    only(schema, pointer, "$ref", {});
    const json& ref = schema["$ref"];
    if (!ref.is_string()) throw Error("$ref at " + where(pointer) + " must be a string");
    const std::string r = ref.get<std::string>();
    if (r.empty() || r[0] != '#')
      throw Error("$ref '" + r + "' is not supported: only references into the same schema ('#/...') are");
    return compile_pointer(r.substr(1));
  }

  int32_t compile_union(const json& schema, const char* key, const std::string& pointer) {
    only(schema, pointer, key, {"nullable"});
    const json& list = schema[key];
    if (!list.is_array() || list.empty()) throw Error(std::string(key) + " at " + where(pointer) + " must be a non-empty array");
    if (std::string(key) == "allOf" && list.size() != 1)
      throw Error("allOf with more than one schema (at " + where(pointer) + ") is not supported for structured output");
    SchemaNode node;
    for (size_t i = 0; i < list.size(); ++i)
      node.any_of.push_back(compile(list[i], pointer + "/" + key + "/" + std::to_string(i)));
    if (nullable(schema, pointer)) {
      SchemaNode null_node;
      null_node.types = kJsonNull;
      node.any_of.push_back(out_.add_node(std::move(null_node)));
    }
    return out_.add_node(std::move(node));
  }

  int32_t compile_literals(const json& schema, const std::string& pointer) {
    if (schema.contains("enum") && schema.contains("const"))
      throw Error("enum beside const (at " + where(pointer) + ") is not supported");
    std::vector<json> values;
    if (schema.contains("const")) {
      values.push_back(schema["const"]);
    } else {
      const json& e = schema["enum"];
      if (!e.is_array() || e.empty()) throw Error("enum at " + where(pointer) + " must be a non-empty array");
      if (e.size() > kMaxLiterals) throw Error("enum at " + where(pointer) + " has more than 4096 values");
      values.assign(e.begin(), e.end());
    }
    // The other keywords still apply: keep the values they accept.
    json rest = schema;
    rest.erase("enum");
    rest.erase("const");
    // Checked with JSON Schema's own defaults (other keys allowed), not the
    // generation's: an enum value {"a": 1} beside no `properties` is valid.
    const bool saved = validation_defaults_;
    validation_defaults_ = true;
    const int32_t rest_node = compile_plain(rest, pointer, /*untyped_means_any=*/true);
    validation_defaults_ = saved;
    std::vector<std::string> literals;
    for (const json& v : values)
      if (out_.validates(v, rest_node)) literals.push_back(v.dump());
    if (literals.empty())
      throw Error("no value of the enum or const at " + where(pointer) + " satisfies the schema's other keywords");
    SchemaNode node;
    node.literal_set = out_.add_literals(std::move(literals));
    return out_.add_node(std::move(node));
  }

  static bool nullable(const json& schema, const std::string& pointer) {
    if (!schema.contains("nullable")) return false;
    if (!schema["nullable"].is_boolean()) throw Error("nullable at " + where(pointer) + " must be a boolean");
    return schema["nullable"].get<bool>();
  }

  // pattern, and a format string_formats.h enforces: one automaton for both
  // (their intersection), limited to what a generated string can hold. A
  // string type no string can satisfy (the automaton is empty, or nothing
  // fits the lengths) is dropped. Identical patterns share one automaton,
  // and all of a schema's patterns share one budget of work and states, so
  // a request's schema costs bounded time and memory however many it holds.
  void read_pattern(const json& schema, const std::string& pointer, SchemaNode& node) {
    const json* pattern = schema.contains("pattern") ? &schema["pattern"] : nullptr;
    if (pattern && !pattern->is_string()) throw Error("pattern at " + where(pointer) + " must be a string");
    const char* format = schema.contains("format") && schema["format"].is_string()
                             ? string_format_pattern(schema["format"].get<std::string>())
                             : nullptr;
    if (!pattern && !format) return;
    const std::string source = (pattern ? pattern->get<std::string>() : std::string()) + '\0' +
                               (format ? std::string(format) : std::string());
    const int64_t max_length = node.max_length;
    if (auto it = pattern_ids_.find({source, max_length}); it != pattern_ids_.end()) {
      node.pattern = it->second;
    } else {
      std::shared_ptr<const RegexDfa> dfa;
      try {
        if (pattern) dfa = RegexDfa::compile(pattern->get<std::string>(), &pattern_work_);
        if (format) {
          auto f = RegexDfa::compile(format, &pattern_work_);
          dfa = dfa ? RegexDfa::intersect(*dfa, *f, &pattern_work_) : f;
        }
        // Control characters JSON has no short escape for are written as \u
        // escapes, which strings under a pattern do not take.
        static const std::shared_ptr<const RegexDfa> writable =
            RegexDfa::compile("^[^\\x00-\\x07\\x0B\\x0E-\\x1F]*$");
        dfa = RegexDfa::intersect(*dfa, *writable, &pattern_work_);
      } catch (const Error& e) {
        throw Error("pattern at " + where(pointer) + ": " + e.what());
      }
      pattern_states_ += dfa->state_count();
      if (pattern_states_ > kMaxPatternStates)
        throw Error("pattern at " + where(pointer) + ": the schema's patterns together exceed " +
                    std::to_string(kMaxPatternStates) + " automaton states");
      JsonSchema::StringPattern sp;
      if (max_length >= 0 && !dfa->empty()) {
        if (max_length > kMaxPatternLength)
          throw Error("pattern at " + where(pointer) + " with maxLength " + std::to_string(max_length) +
                      ": a pattern is enforced up to maxLength " + std::to_string(kMaxPatternLength));
        const uint64_t cost = static_cast<uint64_t>(max_length + 1) * dfa->state_count() * 2;
        if (cost > pattern_work_)
          throw Error("pattern at " + where(pointer) + ": the schema's patterns together take too long to build");
        pattern_work_ -= cost;
        sp.lengths = dfa->lengths_up_to(static_cast<int32_t>(max_length));
      }
      sp.dfa = std::move(dfa);
      node.pattern = out_.add_pattern(std::move(sp));
      pattern_ids_[{source, max_length}] = node.pattern;
    }
    if (out_.pattern(node.pattern).dfa->empty() || !out_.pattern_can_finish(node, 0, 0)) {
      node.types &= static_cast<uint8_t>(~kJsonString);
      node.pattern = -1;
    }
  }

  // minimum / maximum, and exclusiveMinimum / exclusiveMaximum as numbers
  // (2020-12) or as booleans qualifying minimum / maximum (draft 4).
  static void read_bounds(const json& schema, const std::string& pointer, SchemaNode& node) {
    auto number = [&](const char* key) {
      const json& v = schema[key];
      if (!v.is_number() || !std::isfinite(v.get<double>()))
        throw Error(std::string(key) + " at " + where(pointer) + " must be a finite number");
      return v.get<double>();
    };
    if (schema.contains("minimum")) node.minimum = number("minimum");
    if (schema.contains("maximum")) node.maximum = number("maximum");
    for (const auto& [key, is_min] : {std::pair<const char*, bool>{"exclusiveMinimum", true}, {"exclusiveMaximum", false}}) {
      if (!schema.contains(key)) continue;
      const json& v = schema[key];
      bool& exclusive = is_min ? node.exclusive_minimum : node.exclusive_maximum;
      double& bound = is_min ? node.minimum : node.maximum;
      if (v.is_boolean()) {
        exclusive = v.get<bool>() && std::isfinite(bound);
        continue;
      }
      const double x = number(key);
      // Both given: the tighter one holds.
      if (is_min ? x >= bound : x <= bound) {
        bound = x;
        exclusive = true;
      }
    }
  }

  static int64_t count_of(const json& schema, const char* key, const std::string& pointer) {
    const json& v = schema[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      throw Error(std::string(key) + " at " + where(pointer) + " must be a non-negative integer");
    return v.get<int64_t>();
  }

  int32_t compile_plain(const json& schema, const std::string& pointer, bool untyped_means_any = false) {
    SchemaNode node;
    if (schema.contains("type")) {
      const json& t = schema["type"];
      std::vector<json> names = t.is_array() ? std::vector<json>(t.begin(), t.end()) : std::vector<json>{t};
      if (names.empty()) throw Error("type at " + where(pointer) + " must not be empty");
      for (const json& name : names) {
        const std::string s = name.is_string() ? name.get<std::string>() : "";
        if (s == "null") node.types |= kJsonNull;
        else if (s == "boolean") node.types |= kJsonBoolean;
        else if (s == "integer") node.types |= kJsonInteger;
        else if (s == "number") node.types |= kJsonNumber | kJsonInteger;
        else if (s == "string") node.types |= kJsonString;
        else if (s == "array") node.types |= kJsonArray;
        else if (s == "object") node.types |= kJsonObject;
        else throw Error("type at " + where(pointer) + " must name JSON types (got " + name.dump() + ")");
      }
    } else if (untyped_means_any) {
      node.types = kJsonAnyType;
    } else {
      for (const char* k : {"properties", "required", "additionalProperties"})
        if (schema.contains(k)) node.types |= kJsonObject;
      for (const char* k : {"items", "prefixItems", "minItems", "maxItems"})
        if (schema.contains(k)) node.types |= kJsonArray;
      for (const char* k : {"minLength", "maxLength", "pattern"})
        if (schema.contains(k)) node.types |= kJsonString;
      if (node.types == 0) node.types = kJsonAnyType;
    }
    if (nullable(schema, pointer)) node.types |= kJsonNull;

    read_bounds(schema, pointer, node);
    compute_number_grid(node);
    if (schema.contains("minLength")) node.min_length = count_of(schema, "minLength", pointer);
    if (schema.contains("maxLength")) node.max_length = count_of(schema, "maxLength", pointer);
    read_pattern(schema, pointer, node);
    if (schema.contains("minItems")) node.min_items = count_of(schema, "minItems", pointer);
    if (schema.contains("maxItems")) node.max_items = count_of(schema, "maxItems", pointer);

    const int32_t id = out_.add_node({});
    // Arrays.
    if (schema.contains("prefixItems")) {
      const json& p = schema["prefixItems"];
      if (!p.is_array()) throw Error("prefixItems at " + where(pointer) + " must be an array");
      for (size_t i = 0; i < p.size(); ++i)
        node.prefix_items.push_back(compile(p[i], pointer + "/prefixItems/" + std::to_string(i)));
    }
    if (schema.contains("items")) {
      const json& items = schema["items"];
      if (items.is_array())
        throw Error("items as an array (at " + where(pointer) + ") is not supported: use prefixItems");
      node.items = items.is_boolean() && !items.get<bool>() ? -1 : compile(items, pointer + "/items");
    } else {
      node.items = any_value();
    }
    // Objects.
    std::map<std::string, int32_t> properties;
    if (schema.contains("properties")) {
      const json& props = schema["properties"];
      if (!props.is_object()) throw Error("properties at " + where(pointer) + " must be an object");
      for (const auto& [name, sub] : props.items()) {
        if (needs_escape(name))
          throw Error("property name " + json(name).dump() + " (at " + where(pointer) +
                      ") needs a JSON escape, which structured output does not write");
        properties[name] = compile(sub, pointer + "/properties/" + name);
      }
    }
    if (schema.contains("additionalProperties")) {
      const json& a = schema["additionalProperties"];
      node.additional = a.is_boolean() && !a.get<bool>() ? -1 : compile(a, pointer + "/additionalProperties");
    } else if (validation_defaults_) {
      node.additional = any_value();
    }
    std::vector<std::string> required;
    if (schema.contains("required")) {
      const json& r = schema["required"];
      if (!r.is_array()) throw Error("required at " + where(pointer) + " must be an array");
      for (const json& name : r) {
        if (!name.is_string()) throw Error("required at " + where(pointer) + " must list strings");
        const std::string s = name.get<std::string>();
        if (!properties.count(s)) {
          // A required key the schema does not describe: other keys' schema.
          if (node.additional < 0)
            throw Error("required property '" + s + "' (at " + where(pointer) +
                        ") is not in properties and additionalProperties allows no other keys");
          if (needs_escape(s)) throw Error("required property " + json(s).dump() + " needs a JSON escape");
          properties[s] = node.additional;
        }
        required.push_back(s);
      }
    }
    if (properties.size() > kMaxProperties)
      throw Error("an object schema (at " + where(pointer) + ") with more than 64 properties is not supported");
    for (const auto& [name, sub] : properties) {
      node.property_names.push_back(name);
      node.property_nodes.push_back(sub);
    }
    for (const std::string& name : required) {
      const auto it = std::lower_bound(node.property_names.begin(), node.property_names.end(), name);
      node.required |= uint64_t{1} << (it - node.property_names.begin());
    }
    out_.mutable_node(id) = std::move(node);
    return id;
  }
};

// The nesting a node's values need, from the current estimates of the
// nodes it refers to (iterated to the least fixed point by compute_depths).
struct Depths {
  int32_t any, object, array;
};

Depths depths_now(const JsonSchema& s, const SchemaNode& n) {
  constexpr int32_t kNo = SchemaNode::kUnsatisfiable;
  auto need = [&](int32_t id) { return id < 0 ? kNo : s.node(id).depth_needed; };
  Depths d{kNo, kNo, kNo};
  if (!n.any_of.empty()) {
    for (int32_t alt : n.any_of) {
      const SchemaNode& a = s.node(alt);
      d.any = std::min(d.any, a.depth_needed);
      d.object = std::min(d.object, a.object_depth_needed);
      d.array = std::min(d.array, a.array_depth_needed);
    }
    return d;
  }
  if (n.literal_set >= 0) {  // written as one literal, whatever its content
    if (!s.literals(n.literal_set).empty()) d.any = 0;
    return d;
  }
  if ((n.types & (kJsonNull | kJsonBoolean)) || ((n.types & (kJsonInteger | kJsonNumber)) && n.numbers_possible()) ||
      ((n.types & kJsonString) && (n.max_length < 0 || n.min_length <= n.max_length)))
    d.any = 0;
  if ((n.types & kJsonArray) && (n.max_items < 0 || n.min_items <= n.max_items)) {
    int32_t deepest = 0;
    const int64_t count = std::min<int64_t>(n.min_items, static_cast<int64_t>(n.prefix_items.size()) + 1);
    for (int64_t i = 0; i < count; ++i) deepest = std::max(deepest, need(n.item_node(i)));
    if (deepest < kNo) d.array = deepest + 1;
  }
  if (n.types & kJsonObject) {
    int32_t deepest = 0;
    for (size_t i = 0; i < n.property_names.size(); ++i)
      if (n.required >> i & 1) deepest = std::max(deepest, need(n.property_nodes[i]));
    if (deepest < kNo) d.object = deepest + 1;
  }
  d.any = std::min({d.any, d.object, d.array});
  return d;
}


}  // namespace

std::pair<long double, long double> SchemaNode::integer_range() const {
  const long double lo = exclusive_minimum ? std::floor(static_cast<long double>(minimum)) + 1
                                           : std::ceil(static_cast<long double>(minimum));
  const long double hi = exclusive_maximum ? std::ceil(static_cast<long double>(maximum)) - 1
                                           : std::floor(static_cast<long double>(maximum));
  return {lo, hi};
}

bool SchemaNode::numbers_possible() const {
  constexpr long double kLargest = 1e16L;  // 16 integer digits, as the matcher writes
  if (!(types & kJsonNumber)) {  // integers only: some integer within the bounds
    const auto [lo, hi] = integer_range();
    return std::max(lo, -kLargest + 1) <= std::min(hi, kLargest - 1);
  }
  return grid_min <= grid_max;
}

JsonSchema::JsonSchema() {
  add_literals({"false", "true"});
  add_literals({"null"});
}

int32_t JsonSchema::add_node(SchemaNode node) {
  nodes_.push_back(std::move(node));
  return static_cast<int32_t>(nodes_.size() - 1);
}

int32_t JsonSchema::add_pattern(StringPattern pattern) {
  patterns_.push_back(std::move(pattern));
  return static_cast<int32_t>(patterns_.size() - 1);
}

bool JsonSchema::pattern_can_finish(const SchemaNode& n, int32_t state, int64_t count) const {
  const StringPattern& p = patterns_[n.pattern];
  const int64_t at_least = std::max<int64_t>(0, n.min_length - count);
  if (n.max_length < 0) {
    const int32_t most = p.dfa->max_chars(state);
    return most == RegexDfa::kUnbounded || most >= at_least;
  }
  const int64_t at_most = n.max_length - count;
  if (at_least > at_most) return false;
  // Any set bit in [at_least, at_most], a word at a time.
  const std::vector<uint64_t>& bits = p.lengths[state];
  const size_t first = static_cast<size_t>(at_least / 64), last = static_cast<size_t>(at_most / 64);
  for (size_t w = first; w <= last; ++w) {
    uint64_t word = bits[w];
    if (w == first) word &= ~uint64_t{0} << (at_least % 64);
    if (w == last && at_most % 64 != 63) word &= (uint64_t{1} << (at_most % 64 + 1)) - 1;
    if (word) return true;
  }
  return false;
}

int32_t JsonSchema::add_literals(std::vector<std::string> literals) {
  std::sort(literals.begin(), literals.end());
  literals.erase(std::unique(literals.begin(), literals.end()), literals.end());
  std::vector<json> values;
  for (const std::string& l : literals) values.push_back(json::parse(l));
  literal_sets_.push_back(std::move(literals));
  literal_values_.push_back(std::move(values));
  return static_cast<int32_t>(literal_sets_.size() - 1);
}

void JsonSchema::compute_depths() {
  // Estimates only fall, from "unsatisfiable", until nothing changes.
  for (bool changed = true; changed;) {
    changed = false;
    for (auto& n : nodes_) {
      const Depths d = depths_now(*this, n);
      if (d.any < n.depth_needed || d.object < n.object_depth_needed || d.array < n.array_depth_needed) {
        n.depth_needed = std::min(n.depth_needed, d.any);
        n.object_depth_needed = std::min(n.object_depth_needed, d.object);
        n.array_depth_needed = std::min(n.array_depth_needed, d.array);
        changed = true;
      }
    }
  }
  for (auto& n : nodes_) n.satisfiable = n.depth_needed < SchemaNode::kUnsatisfiable;
}

std::shared_ptr<const JsonSchema> JsonSchema::compile(const json& schema) {
  auto out = std::make_shared<JsonSchema>();
  Compiler compiler(schema, *out);
  try {
    out->set_root(compiler.compile_pointer(""));
  } catch (const json::exception& e) {
    throw Error(std::string("malformed schema: ") + e.what());
  }
  out->compute_depths();
  const SchemaNode& root = out->node(out->root());
  if (!root.satisfiable) throw Error("no JSON document satisfies the schema");
  if (root.depth_needed >= kMaxNesting)
    throw Error("every document the schema allows nests deeper than 127 levels");
  return out;
}

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  return compile(json{{"type", "object"}, {"additionalProperties", true}});
}

bool JsonSchema::validates(const json& v, int32_t id) const {
  std::vector<int32_t> tried;
  return validates(v, id, tried);
}

bool JsonSchema::validates(const json& v, int32_t id, std::vector<int32_t>& tried) const {
  if (id < 0) return false;
  const SchemaNode& n = nodes_[id];
  if (!n.any_of.empty()) {
    if (std::find(tried.begin(), tried.end(), id) != tried.end()) return false;  // tried, or being tried
    tried.push_back(id);
    return std::any_of(n.any_of.begin(), n.any_of.end(), [&](int32_t alt) { return validates(v, alt, tried); });
  }
  if (n.literal_set >= 0) {
    const auto& values = literal_values_[n.literal_set];
    return std::find(values.begin(), values.end(), v) != values.end();  // numbers compare by value
  }
  switch (v.type()) {
    case json::value_t::null: return n.types & kJsonNull;
    case json::value_t::boolean: return n.types & kJsonBoolean;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return (n.types & (kJsonInteger | kJsonNumber)) && n.in_bounds(v.get<long double>());
    case json::value_t::number_float: {
      const double d = v.get<double>();
      const bool kind = (n.types & kJsonNumber) || ((n.types & kJsonInteger) && std::isfinite(d) && std::floor(d) == d);
      return kind && n.in_bounds(d);
    }
    case json::value_t::string: {
      if (!(n.types & kJsonString)) return false;
      const std::string& text = v.get_ref<const std::string&>();
      const int64_t len = code_points(text);
      return len >= n.min_length && (n.max_length < 0 || len <= n.max_length) &&
             (n.pattern < 0 || patterns_[n.pattern].dfa->matches(text));
    }
    case json::value_t::array: {
      if (!(n.types & kJsonArray)) return false;
      const auto size = static_cast<int64_t>(v.size());
      if (size < n.min_items || (n.max_items >= 0 && size > n.max_items)) return false;
      for (int64_t i = 0; i < size; ++i)
        if (!validates(v[i], n.item_node(i))) return false;
      return true;
    }
    case json::value_t::object: {
      if (!(n.types & kJsonObject)) return false;
      uint64_t seen = 0;
      for (const auto& [key, value] : v.items()) {
        const auto it = std::lower_bound(n.property_names.begin(), n.property_names.end(), key);
        if (it != n.property_names.end() && *it == key) {
          const auto i = it - n.property_names.begin();
          seen |= uint64_t{1} << i;
          if (!validates(value, n.property_nodes[i])) return false;
        } else if (!validates(value, n.additional)) {
          return false;
        }
      }
      return (seen & n.required) == n.required;
    }
    default: return false;
  }
}

}  // namespace reprise
