// Recursive-descent parser producing the syntax tree. Operator precedence,
// the placement of filters and `is` tests, and what may end a tuple follow
// Jinja2's parser so templates mean exactly what they mean under Jinja2.
// Nesting and expression size are capped so hostile input cannot overflow
// the stack; every problem is a reprise::Error naming line and column.
#pragma once
#include <memory>
#include <string_view>

#include "server/jinja/ast.h"
#include "server/jinja/options.h"

namespace reprise::jinja {

std::unique_ptr<ast::Program> parse_program(std::string_view source, const ParseOptions& options);

}  // namespace reprise::jinja
