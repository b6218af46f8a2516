// A JSON Schema compiled for structured output: the node graph JsonMatcher
// walks while a model writes a document, and a validator for finished ones.
//
// What is enforced (docs/server.md, Structured output): type (one or a list),
// enum, const, properties, required, additionalProperties, items,
// prefixItems, minItems, maxItems, minLength, maxLength, pattern (RegexDfa's
// syntax), minimum, maximum, exclusiveMinimum, exclusiveMaximum, anyOf,
// oneOf (as anyOf), allOf of one schema, $ref into the same document ($defs,
// definitions, any JSON pointer), nullable, and the formats
// string_formats.h lists. Annotations (title, description, default,
// examples, other formats, ...) are ignored. Any other keyword is refused
// with reprise::Error rather than silently not enforced.
//
// Two choices where JSON Schema is looser than a useful generation:
// additionalProperties absent means none (as llama.cpp's grammars do: the
// model writes the declared keys, not invented ones), and a schema without
// `type` that uses object, array or string keywords is that type.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/regex_dfa.h"

namespace reprise {

// Bits of SchemaNode::types.
enum JsonTypeBit : uint8_t {
  kJsonNull = 1,
  kJsonBoolean = 2,
  kJsonInteger = 4,
  kJsonNumber = 8,  // any number (integers too)
  kJsonString = 16,
  kJsonArray = 32,
  kJsonObject = 64,
  kJsonAnyType = 127,
};

struct SchemaNode {
  // Non-empty: the node is the union of these nodes; nothing else is set.
  std::vector<int32_t> any_of;
  // >= 0: the value is one of JsonSchema::literals(literal_set), written
  // exactly so; nothing else is set.
  int32_t literal_set = -1;
  uint8_t types = 0;  // JsonTypeBit

  int64_t min_length = 0, max_length = -1;  // strings, in code points; -1: no limit
  int32_t pattern = -1;  // strings: JsonSchema::pattern(pattern) (pattern, format); -1: none

  // Numbers: minimum and maximum (infinite when absent), each inclusive
  // unless exclusive_*.
  double minimum = -std::numeric_limits<double>::infinity();
  double maximum = std::numeric_limits<double>::infinity();
  bool exclusive_minimum = false, exclusive_maximum = false;
  bool has_bounds() const { return std::isfinite(minimum) || std::isfinite(maximum); }
  bool in_bounds(long double v) const {
    return (exclusive_minimum ? v > minimum : v >= minimum) && (exclusive_maximum ? v < maximum : v <= maximum);
  }
  // Whether some number of the allowed kind (integer only, or any) with at
  // most 16 integer digits lies within the bounds.
  bool numbers_possible() const;
  // Integers only: the least and greatest integers within the bounds
  // (infinite when unbounded).
  std::pair<long double, long double> integer_range() const;
  // Numbers with a fraction, under bounds: the values that can be written
  // (at most 16 integer and 16 fraction digits) as integers in units of
  // 1e-16, and the closed range of them whose double (as a JSON parser
  // reads the text) lies within the bounds: [grid_min, grid_max], empty when
  // grid_min > grid_max. Doubles grow with the text's value, so the range is
  // one interval; JsonSchema::compile finds its ends by bisection.
  static constexpr __int128 kGridUnit = 10000000000000000;  // 1e16 units per 1
  static constexpr __int128 kGridLimit = kGridUnit * kGridUnit - 1;
  __int128 grid_min = -kGridLimit, grid_max = kGridLimit;

  std::vector<int32_t> prefix_items;  // arrays: the first items' nodes
  int32_t items = -1;                 // the rest's node; -1: no more items
  int64_t min_items = 0, max_items = -1;

  // Objects: declared properties sorted by name (bytes), their nodes, the
  // required ones as bits over that order, and the node of other keys (-1:
  // none allowed).
  std::vector<std::string> property_names;
  std::vector<int32_t> property_nodes;
  uint64_t required = 0;
  int32_t additional = -1;

  // Computed by compile: how many containers deep a finished value of this
  // node must nest at least (0: a scalar will do; kUnsatisfiable: no finite
  // document matches), and the same for its object and array forms alone.
  // Generation never starts a value it could not finish below the matcher's
  // nesting limit, so no accepted prefix is a dead end.
  static constexpr int32_t kUnsatisfiable = 1 << 30;
  int32_t depth_needed = kUnsatisfiable;
  int32_t object_depth_needed = kUnsatisfiable;
  int32_t array_depth_needed = kUnsatisfiable;
  bool satisfiable = false;  // depth_needed < kUnsatisfiable

  bool has_length_limits() const { return min_length > 0 || max_length >= 0; }
  int32_t item_node(int64_t index) const {
    return index < static_cast<int64_t>(prefix_items.size()) ? prefix_items[index] : items;
  }
};

class JsonSchema {
 public:
  // Throws reprise::Error naming the keyword and where it is for schemas
  // using what is not enforced, for malformed schemas, and for schemas no
  // document satisfies.
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::json& schema);
  // Any JSON object (OpenAI's response_format json_object).
  static std::shared_ptr<const JsonSchema> any_object();

  int32_t root() const { return root_; }
  const SchemaNode& node(int32_t id) const { return nodes_[id]; }
  size_t node_count() const { return nodes_.size(); }
  // Sorted, distinct serialisations.
  const std::vector<std::string>& literals(int32_t set) const { return literal_sets_[set]; }
  // The values of a set, in the same order (for validation: compared as
  // values, so 1.0 matches 1).
  const std::vector<nlohmann::json>& literal_values(int32_t set) const { return literal_values_[set]; }
  // The literal sets of booleans ("false", "true") and of null.
  static constexpr int32_t kBooleanLiterals = 0;
  static constexpr int32_t kNullLiterals = 1;

  // A string node's pattern (its `pattern`, its enforced `format`, or both),
  // as an automaton over the string's decoded UTF-8 (only the characters a
  // generated string can hold: no control characters JSON has no short
  // escape for), and with maxLength, per automaton state the code-point
  // lengths by which it can reach acceptance (RegexDfa::lengths_up_to).
  struct StringPattern {
    std::shared_ptr<const RegexDfa> dfa;
    std::vector<std::vector<uint64_t>> lengths;
  };
  const StringPattern& pattern(int32_t id) const { return patterns_[id]; }
  // Whether a string of node `n` that has `count` code points, its pattern
  // in automaton state `state`, can still be finished within its lengths.
  bool pattern_can_finish(const SchemaNode& n, int32_t state, int64_t count) const;

  // Whether `value` matches the schema as compiled (the choices above included).
  bool validates(const nlohmann::json& value) const { return validates(value, root_); }
  bool validates(const nlohmann::json& value, int32_t node) const;
  // The largest nesting generation may reach (JsonMatcher's limit).
  static constexpr int32_t kMaxNesting = 128;

  // Public for the compiler in json_schema.cpp; use compile().
  JsonSchema();
  int32_t add_node(SchemaNode node);
  int32_t add_literals(std::vector<std::string> literals);
  int32_t add_pattern(StringPattern pattern);
  SchemaNode& mutable_node(int32_t id) { return nodes_[id]; }
  void set_root(int32_t root) { root_ = root; }
  void compute_depths();

 private:
  std::vector<SchemaNode> nodes_;
  std::vector<std::vector<std::string>> literal_sets_;
  std::vector<std::vector<nlohmann::json>> literal_values_;
  std::vector<StringPattern> patterns_;

  // `tried`: union nodes already tried for this value (a union reaching
  // itself, or the same node by two paths, is tried once).
  bool validates(const nlohmann::json& value, int32_t node, std::vector<int32_t>& tried) const;
  int32_t root_ = -1;
};

}  // namespace reprise
