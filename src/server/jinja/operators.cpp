#include "server/jinja/operators.h"

#include <cmath>

#include "server/jinja/budget.h"
#include "server/jinja/format.h"
#include "util/error.h"

namespace reprise::jinja {

using ast::BinaryOp;
using ast::UnaryOp;

namespace {

bool numeric(const Value& v) { return v.is_number() || v.is_bool(); }

const char* symbol(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "+";
    case BinaryOp::Subtract: return "-";
    case BinaryOp::Multiply: return "*";
    case BinaryOp::Divide: return "/";
    case BinaryOp::FloorDivide: return "//";
    case BinaryOp::Modulo: return "%";
    case BinaryOp::Power: return "**";
    case BinaryOp::Concat: return "~";
    case BinaryOp::And: return "and";
    case BinaryOp::Or: return "or";
  }
  return "?";
}

[[noreturn]] void unsupported(BinaryOp op, const Value& a, const Value& b) {
  if (op == BinaryOp::Add && a.is_string()) {
    throw Error("can only concatenate str (not \"" + std::string(type_name(b)) + "\") to str");
  }
  throw Error(std::string("unsupported operand type(s) for ") + symbol(op) + ": '" + std::string(type_name(a)) +
              "' and '" + std::string(type_name(b)) + "'");
}

[[noreturn]] void overflow() { throw Error("integer result too large"); }

void check_undefined(const Value& v) {
  if (!v.is_undefined()) return;
  std::string_view hint = v.undefined_hint();
  throw Error(hint.empty() ? std::string("value is undefined") : "'" + std::string(hint) + "' is undefined");
}

Value repeat(const Value& sequence, int64_t times) {
  if (times < 0) times = 0;
  if (sequence.is_string()) {
    const std::string& s = sequence.as_string();
    if (s.empty()) return Value::string("");
    if (!s.empty() && static_cast<uint64_t>(times) > (1ull << 40) / s.size()) throw Error("repeated string too large");
    check_size(s.size() * static_cast<size_t>(times));
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(times));
    for (int64_t i = 0; i < times; ++i) out += s;
    return Value::string(std::move(out));
  }
  const ListData& list = sequence.as_list();
  if (list.items.empty()) return Value::list({}, list.is_tuple);
  uint64_t total = list.items.size() * static_cast<uint64_t>(times);
  if (!list.items.empty() && static_cast<uint64_t>(times) > (1ull << 30) / list.items.size()) throw Error("repeated list too large");
  charge_steps(total);
  check_size(total * sizeof(Value));
  std::vector<Value> out;
  out.reserve(total);
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), list.items.begin(), list.items.end());
  return Value::list(std::move(out), list.is_tuple);
}

int64_t floor_div(int64_t a, int64_t b) {
  if (a == INT64_MIN && b == -1) overflow();
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t floor_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// Python's float divmod: the remainder takes the divisor's sign (a zero one
// too), and the quotient is (a - remainder) / b rounded to the nearest
// integer, which floor(a / b) is not when a / b rounds up to one (1 // 0.1
// is 9.0: 0.1 is a little more than a tenth).
double float_mod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0) {
    if ((r < 0) != (b < 0)) r += b;
  } else {
    r = std::copysign(0.0, b);
  }
  return r;
}

double float_floor_div(double a, double b) {
  double r = std::fmod(a, b);
  double q = (a - r) / b;
  if (r != 0 && ((b < 0) != (r < 0))) q -= 1.0;
  if (q == 0) return std::copysign(0.0, a / b);
  double f = std::floor(q);
  if (q - f > 0.5) f += 1.0;
  return f;
}

Value power(const Value& a, const Value& b) {
  if (!a.is_float() && !b.is_float() && b.as_int() >= 0) {
    int64_t base = a.as_int(), exp = b.as_int(), result = 1;
    while (exp > 0) {
      if (exp & 1) {
        if (__builtin_mul_overflow(result, base, &result)) overflow();
      }
      exp >>= 1;
      if (exp > 0 && __builtin_mul_overflow(base, base, &base)) overflow();
    }
    return Value::integer(result);
  }
  double x = a.as_double(), y = b.as_double();
  if (x == 0 && y < 0) throw Error("0.0 cannot be raised to a negative power");
  double r = std::pow(x, y);
  if (std::isnan(r) && !std::isnan(x) && !std::isnan(y)) throw Error("math domain error: complex result");
  return Value::number(r);
}

}  // namespace

Value apply_binary(BinaryOp op, const Value& a, const Value& b) {
  if (op == BinaryOp::Concat) {
    std::string out = to_str(a);
    std::string right = to_str(b);
    check_size(out.size() + right.size());
    out += right;
    return Value::string(std::move(out));
  }
  check_undefined(a);
  check_undefined(b);
  const bool both_numeric = numeric(a) && numeric(b);
  const bool any_float = a.is_float() || b.is_float();
  switch (op) {
    case BinaryOp::Add:
      if (both_numeric) {
        if (any_float) return Value::number(a.as_double() + b.as_double());
        int64_t r;
        if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) overflow();
        return Value::integer(r);
      }
      if (a.is_string() && b.is_string()) {
        check_size(a.as_string().size() + b.as_string().size());
        return Value::string(a.as_string() + b.as_string());
      }
      if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
        std::vector<Value> items = a.as_list().items;
        charge_steps(items.size() + b.as_list().items.size());
        items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
        return Value::list(std::move(items), a.as_list().is_tuple);
      }
      unsupported(op, a, b);
    case BinaryOp::Subtract:
      if (!both_numeric) unsupported(op, a, b);
      if (any_float) return Value::number(a.as_double() - b.as_double());
      {
        int64_t r;
        if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) overflow();
        return Value::integer(r);
      }
    case BinaryOp::Multiply:
      if (both_numeric) {
        if (any_float) return Value::number(a.as_double() * b.as_double());
        int64_t r;
        if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) overflow();
        return Value::integer(r);
      }
      if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
      if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
      unsupported(op, a, b);
    case BinaryOp::Divide:
      if (!both_numeric) unsupported(op, a, b);
      if (b.as_double() == 0) throw Error("division by zero");
      return Value::number(a.as_double() / b.as_double());
    case BinaryOp::FloorDivide:
      if (!both_numeric) unsupported(op, a, b);
      if (b.as_double() == 0) throw Error("integer division or modulo by zero");
      if (any_float) return Value::number(float_floor_div(a.as_double(), b.as_double()));
      return Value::integer(floor_div(a.as_int(), b.as_int()));
    case BinaryOp::Modulo:
      if (a.is_string()) return Value::string(format::percent(a.as_string(), b));
      if (!both_numeric) unsupported(op, a, b);
      if (b.as_double() == 0) throw Error("integer division or modulo by zero");
      if (any_float) return Value::number(float_mod(a.as_double(), b.as_double()));
      return Value::integer(floor_mod(a.as_int(), b.as_int()));
    case BinaryOp::Power:
      if (!both_numeric) unsupported(op, a, b);
      return power(a, b);
    default:
      unsupported(op, a, b);
  }
}

Value apply_unary(UnaryOp op, const Value& v) {
  check_undefined(v);
  if (!numeric(v)) {
    throw Error(std::string("bad operand type for unary ") + (op == UnaryOp::Negate ? "-" : "+") + ": '" +
                std::string(type_name(v)) + "'");
  }
  if (op == UnaryOp::Plus) return v.is_bool() ? Value::integer(v.as_int()) : v;
  if (v.is_float()) return Value::number(-v.as_double());
  if (v.as_int() == INT64_MIN) overflow();
  return Value::integer(-v.as_int());
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::Undefined:
      return false;
    case Value::Kind::String:
      if (!item.is_string()) {
        throw Error("'in <string>' requires string as left operand, not " + std::string(type_name(item)));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::List:
      for (const Value& element : container.as_list().items) {
        if (equals(element, item)) return true;
      }
      return false;
    case Value::Kind::Dict:
      if (container.as_dict().flavor == DictData::Flavor::Dict) {
        return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
      }
      break;
    default:
      break;
  }
  throw Error("argument of type '" + std::string(type_name(container)) + "' is not iterable");
}

}  // namespace reprise::jinja
