// Syntax tree of a parsed template. Plain data owned through unique_ptr; the
// renderer walks it. Nodes keep their source offset so runtime errors can
// name a line and column. Filters and tests are resolved to function
// pointers at parse time, so an unknown name fails when the template is
// loaded, as in Jinja2.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/jinja/filters.h"
#include "server/jinja/tests.h"
#include "server/jinja/value.h"

namespace reprise::jinja::ast {

// ----------------------------------------------------------------- expressions

enum class ExprKind : uint8_t {
  Literal, Name, List, Dict, Attribute, Subscript, Slice, Call, Filter, Test, Unary, Binary,
  Compare, Conditional,
};

struct Expr {
  Expr(ExprKind k, size_t off) : kind(k), offset(off) {}
  virtual ~Expr() = default;
  ExprKind kind;
  size_t offset;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Literal : Expr {
  Literal(size_t off, Value v) : Expr(ExprKind::Literal, off), value(std::move(v)) {}
  Value value;  // scalars and strings only: containers are built fresh per evaluation
};

struct Name : Expr {
  Name(size_t off, std::string n) : Expr(ExprKind::Name, off), name(std::move(n)) {}
  std::string name;
};

struct ListLiteral : Expr {  // [a, b] or (a, b)
  ListLiteral(size_t off, bool t) : Expr(ExprKind::List, off), tuple(t) {}
  std::vector<ExprPtr> items;
  bool tuple;
};

struct DictLiteral : Expr {
  explicit DictLiteral(size_t off) : Expr(ExprKind::Dict, off) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> entries;
};

struct Attribute : Expr {  // obj.name
  Attribute(size_t off, ExprPtr o, std::string n)
      : Expr(ExprKind::Attribute, off), object(std::move(o)), name(std::move(n)) {}
  ExprPtr object;
  std::string name;
};

struct Subscript : Expr {  // obj[index]
  Subscript(size_t off, ExprPtr o, ExprPtr i)
      : Expr(ExprKind::Subscript, off), object(std::move(o)), index(std::move(i)) {}
  ExprPtr object, index;
};

struct Slice : Expr {  // obj[start:stop:step]; omitted parts are null
  Slice(size_t off, ExprPtr o) : Expr(ExprKind::Slice, off), object(std::move(o)) {}
  ExprPtr object, start, stop, step;
};

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> named;
};

struct Call : Expr {
  Call(size_t off, ExprPtr c) : Expr(ExprKind::Call, off), callee(std::move(c)) {}
  ExprPtr callee;
  Arguments args;
};

struct Filter : Expr {  // input | name(args); input is null inside filter blocks
  Filter(size_t off, ExprPtr in, std::string n, FilterFn f)
      : Expr(ExprKind::Filter, off), input(std::move(in)), name(std::move(n)), fn(f) {}
  ExprPtr input;
  std::string name;
  FilterFn fn;  // null: no such filter (an error if evaluated)
  Arguments args;
};

struct Test : Expr {  // input is [not] name(args)
  Test(size_t off, ExprPtr in, std::string n, TestFn f, bool neg)
      : Expr(ExprKind::Test, off), input(std::move(in)), name(std::move(n)), fn(f), negated(neg) {}
  ExprPtr input;
  std::string name;
  TestFn fn;  // null: no such test (an error if evaluated)
  bool negated;
  Arguments args;
};

enum class UnaryOp : uint8_t { Not, Negate, Plus };
struct Unary : Expr {
  Unary(size_t off, UnaryOp o, ExprPtr e) : Expr(ExprKind::Unary, off), op(o), operand(std::move(e)) {}
  UnaryOp op;
  ExprPtr operand;
};

enum class BinaryOp : uint8_t { Add, Subtract, Multiply, Divide, FloorDivide, Modulo, Power, Concat, And, Or };
struct Binary : Expr {
  Binary(size_t off, BinaryOp o, ExprPtr l, ExprPtr r)
      : Expr(ExprKind::Binary, off), op(o), left(std::move(l)), right(std::move(r)) {}
  BinaryOp op;
  ExprPtr left, right;
};

// a < b <= c chains like Python: each pair compared, short-circuiting.
enum class CompareOp : uint8_t { Equal, NotEqual, Less, LessEqual, Greater, GreaterEqual, In, NotIn };
struct Compare : Expr {
  Compare(size_t off, ExprPtr f) : Expr(ExprKind::Compare, off), first(std::move(f)) {}
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
};

struct Conditional : Expr {  // then_value if condition else else_value
  Conditional(size_t off, ExprPtr c, ExprPtr t, ExprPtr e)
      : Expr(ExprKind::Conditional, off), condition(std::move(c)), then_value(std::move(t)),
        else_value(std::move(e)) {}
  ExprPtr condition, then_value, else_value;  // else_value may be null (undefined)
};

// ------------------------------------------------------------------ statements

enum class StmtKind : uint8_t {
  Text, Output, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, Break, Continue, Do, Generation,
};

struct Stmt {
  Stmt(StmtKind k, size_t off) : kind(k), offset(off) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  size_t offset;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// Where a for loop or set stores values: one name, a tuple of names
// (unpacking), or namespace.attribute.
struct Target {
  std::vector<std::string> names;
  bool unpack = false;
  std::string attribute;  // non-empty: names[0].attribute
};

struct TextStmt : Stmt {
  TextStmt(size_t off, std::string t) : Stmt(StmtKind::Text, off), text(std::move(t)) {}
  std::string text;
};

struct OutputStmt : Stmt {
  OutputStmt(size_t off, ExprPtr v) : Stmt(StmtKind::Output, off), value(std::move(v)) {}
  ExprPtr value;
};

struct IfStmt : Stmt {
  explicit IfStmt(size_t off) : Stmt(StmtKind::If, off) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if + elifs
  Body otherwise;
};

struct ForStmt : Stmt {
  explicit ForStmt(size_t off) : Stmt(StmtKind::For, off) {}
  Target target;
  ExprPtr iterable;
  ExprPtr condition;  // `for x in xs if cond`; may be null
  Body body;
  Body otherwise;     // runs when nothing was iterated
};

struct SetStmt : Stmt {
  explicit SetStmt(size_t off) : Stmt(StmtKind::Set, off) {}
  Target target;
  ExprPtr value;
};

struct SetBlockStmt : Stmt {  // {% set x | filters %}body{% endset %}
  explicit SetBlockStmt(size_t off) : Stmt(StmtKind::SetBlock, off) {}
  Target target;
  std::vector<std::unique_ptr<Filter>> filters;
  Body body;
};

struct Parameter {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct MacroStmt : Stmt {
  explicit MacroStmt(size_t off) : Stmt(StmtKind::Macro, off) {}
  std::string name;
  std::vector<Parameter> params;
  Body body;
};

struct CallBlockStmt : Stmt {  // {% call(params) macro(args) %}body{% endcall %}
  explicit CallBlockStmt(size_t off) : Stmt(StmtKind::CallBlock, off) {}
  std::vector<Parameter> params;
  std::unique_ptr<Call> call;
  Body body;
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(size_t off) : Stmt(StmtKind::FilterBlock, off) {}
  std::vector<std::unique_ptr<Filter>> filters;
  Body body;
};

struct LoopControlStmt : Stmt {  // break / continue
  LoopControlStmt(StmtKind k, size_t off) : Stmt(k, off) {}
};

struct DoStmt : Stmt {
  DoStmt(size_t off, ExprPtr e) : Stmt(StmtKind::Do, off), expr(std::move(e)) {}
  ExprPtr expr;
};

// HF's {% generation %} marker (assistant-mask tracking): renders its body.
struct GenerationStmt : Stmt {
  explicit GenerationStmt(size_t off) : Stmt(StmtKind::Generation, off) {}
  Body body;
};

struct Program {
  std::string source;  // normalized; offsets index into it
  Body body;
};

}  // namespace reprise::jinja::ast
