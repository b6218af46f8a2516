// Python semantics of Jinja's arithmetic, concatenation and membership
// operators. Type mismatches raise reprise::Error with Python's wording;
// integer overflow (Python has big ints) is an error rather than a wrap.
#pragma once
#include "server/jinja/ast.h"
#include "server/jinja/value.h"

namespace reprise::jinja {

// All binary operators except `and`/`or`, which short-circuit in the renderer.
Value apply_binary(ast::BinaryOp op, const Value& left, const Value& right);
Value apply_unary(ast::UnaryOp op, const Value& operand);
// `item in container`.
bool contains(const Value& container, const Value& item);

}  // namespace reprise::jinja
