#include "server/jinja/tests.h"

#include <cmath>
#include <unordered_map>

#include "server/jinja/args.h"
#include "server/jinja/filters.h"
#include "server/jinja/operators.h"
#include "server/jinja/text.h"
#include "util/error.h"

namespace reprise::jinja {

namespace {

const Value& only_argument(const CallArgs& args, std::string_view test) {
  if (args.positional.size() != 1 || !args.named.empty()) {
    throw Error("test '" + std::string(test) + "' takes exactly one argument");
  }
  return args.positional[0];
}

void no_arguments(const CallArgs& args, std::string_view test) {
  if (!args.positional.empty() || !args.named.empty()) {
    throw Error("test '" + std::string(test) + "' takes no arguments");
  }
}

double number_for_test(const Value& v, std::string_view test) {
  if (v.is_number() || v.is_bool()) return v.as_double();
  throw Error("test '" + std::string(test) + "' needs a number, not " + std::string(type_name(v)));
}

bool is_defined(Renderer&, const Value& v, const CallArgs& a) { no_arguments(a, "defined"); return !v.is_undefined(); }
bool is_undefined(Renderer&, const Value& v, const CallArgs& a) { no_arguments(a, "undefined"); return v.is_undefined(); }
bool is_none(Renderer&, const Value& v, const CallArgs& a) { no_arguments(a, "none"); return v.is_none(); }
bool is_string(Renderer&, const Value& v, const CallArgs& a) { no_arguments(a, "string"); return v.is_string(); }
bool is_number(Renderer&, const Value& v, const CallArgs& a) {
  no_arguments(a, "number");
  return v.is_number() || v.is_bool();  // Python's bool is a Number
}
bool is_integer(Renderer&, const Value& v, const CallArgs& a) { no_arguments(a, "integer"); return v.is_int(); }
bool is_float(Renderer&, const Value& v, const CallArgs& a) { no_arguments(a, "float"); return v.is_float(); }
bool is_boolean(Renderer&, const Value& v, const CallArgs& a) { no_arguments(a, "boolean"); return v.is_bool(); }
bool is_true(Renderer&, const Value& v, const CallArgs& a) { no_arguments(a, "true"); return v.is_bool() && v.as_bool(); }
bool is_false(Renderer&, const Value& v, const CallArgs& a) { no_arguments(a, "false"); return v.is_bool() && !v.as_bool(); }
bool is_mapping(Renderer&, const Value& v, const CallArgs& a) {
  no_arguments(a, "mapping");
  return v.is_dict() && v.as_dict().flavor == DictData::Flavor::Dict;
}
// Jinja's Undefined is iterable (as empty) and has len(), so it passes both.
bool is_iterable(Renderer&, const Value& v, const CallArgs& a) {
  no_arguments(a, "iterable");
  return v.is_string() || v.is_list() || v.is_undefined() ||
         (v.is_dict() && v.as_dict().flavor == DictData::Flavor::Dict);
}
bool is_sequence(Renderer& r, const Value& v, const CallArgs& a) { return is_iterable(r, v, a); }
bool is_callable(Renderer&, const Value& v, const CallArgs& a) { no_arguments(a, "callable"); return v.is_callable(); }
bool is_odd(Renderer&, const Value& v, const CallArgs& a) {
  no_arguments(a, "odd");
  return std::fmod(std::fabs(number_for_test(v, "odd")), 2.0) == 1.0;
}
bool is_even(Renderer&, const Value& v, const CallArgs& a) {
  no_arguments(a, "even");
  return std::fmod(number_for_test(v, "even"), 2.0) == 0.0;
}
bool is_divisibleby(Renderer&, const Value& v, const CallArgs& a) {
  const Value& divisor = only_argument(a, "divisibleby");
  double d = number_for_test(divisor, "divisibleby");
  if (d == 0) throw Error("integer division or modulo by zero");
  if (v.is_int() && divisor.is_int()) return v.as_int() % divisor.as_int() == 0;
  return std::fmod(number_for_test(v, "divisibleby"), d) == 0.0;
}
bool is_eq(Renderer&, const Value& v, const CallArgs& a) { return equals(v, only_argument(a, "eq")); }
bool is_ne(Renderer&, const Value& v, const CallArgs& a) { return !equals(v, only_argument(a, "ne")); }
bool is_lt(Renderer&, const Value& v, const CallArgs& a) { return compare(v, only_argument(a, "lt")) < 0; }
bool is_le(Renderer&, const Value& v, const CallArgs& a) { return compare(v, only_argument(a, "le")) <= 0; }
bool is_gt(Renderer&, const Value& v, const CallArgs& a) { return compare(v, only_argument(a, "gt")) > 0; }
bool is_ge(Renderer&, const Value& v, const CallArgs& a) { return compare(v, only_argument(a, "ge")) >= 0; }
bool is_in(Renderer&, const Value& v, const CallArgs& a) { return contains(only_argument(a, "in"), v); }
bool is_lower(Renderer&, const Value& v, const CallArgs& a) {
  no_arguments(a, "lower");
  std::string s = to_str(v);
  return s == text::lower(s) && s != text::upper(s);
}
bool is_upper(Renderer&, const Value& v, const CallArgs& a) {
  no_arguments(a, "upper");
  std::string s = to_str(v);
  return s == text::upper(s) && s != text::lower(s);
}
// Python identity, approximated: singletons and small values by value,
// containers by address.
bool is_sameas(Renderer&, const Value& v, const CallArgs& a) {
  const Value& other = only_argument(a, "sameas");
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::Undefined: case Value::Kind::None: return true;
    case Value::Kind::Bool: case Value::Kind::Int: return v.as_int() == other.as_int();
    case Value::Kind::Float: return false;
    default: return v.identity() == other.identity();
  }
}
bool is_escaped(Renderer&, const Value&, const CallArgs& a) { no_arguments(a, "escaped"); return false; }
bool is_filter(Renderer&, const Value& v, const CallArgs& a) {
  no_arguments(a, "filter");
  return v.is_string() && find_filter(v.as_string()) != nullptr;
}
bool is_test(Renderer&, const Value& v, const CallArgs& a) {
  no_arguments(a, "test");
  return v.is_string() && find_test(v.as_string()) != nullptr;
}

}  // namespace

TestFn find_test(std::string_view name) {
  static const std::unordered_map<std::string_view, TestFn> tests = {
      {"defined", is_defined},   {"undefined", is_undefined}, {"none", is_none},
      {"string", is_string},     {"number", is_number},       {"integer", is_integer},
      {"float", is_float},       {"boolean", is_boolean},     {"true", is_true},
      {"false", is_false},       {"mapping", is_mapping},     {"iterable", is_iterable},
      {"sequence", is_sequence}, {"callable", is_callable},   {"odd", is_odd},
      {"even", is_even},         {"divisibleby", is_divisibleby},
      {"eq", is_eq},             {"equalto", is_eq},          {"==", is_eq},
      {"ne", is_ne},             {"!=", is_ne},
      {"lt", is_lt},             {"lessthan", is_lt},         {"<", is_lt},
      {"le", is_le},             {"<=", is_le},
      {"gt", is_gt},             {"greaterthan", is_gt},      {">", is_gt},
      {"ge", is_ge},             {">=", is_ge},
      {"in", is_in},             {"lower", is_lower},         {"upper", is_upper},
      {"sameas", is_sameas},     {"escaped", is_escaped},     {"filter", is_filter},
      {"test", is_test},
  };
  auto it = tests.find(name);
  return it == tests.end() ? nullptr : it->second;
}

}  // namespace reprise::jinja
