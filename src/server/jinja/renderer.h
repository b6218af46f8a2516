// Walks a parsed template and produces its output.
//
// Scoping follows Jinja2: `for` bodies and macros get their own scope, so a
// `set` inside a loop does not leak out (hence namespace()); `if` does not.
// Scopes are shared_ptr-owned because macros close over the scope they were
// defined in and may outlive it (stored in a namespace, called later).
//
// All work is metered by a Budget, so a template that loops, recurses or
// grows output without bound fails with reprise::Error instead of hanging.
#pragma once
#include <ctime>
#include <memory>
#include <string>
#include <string_view>

#include "server/jinja/ast.h"
#include "server/jinja/budget.h"
#include "server/jinja/options.h"
#include "server/jinja/value.h"

namespace reprise::jinja {

class Scope : public std::enable_shared_from_this<Scope> {
 public:
  explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}
  const Value* lookup(std::string_view name) const;
  void set(std::string name, Value value) { vars_->set(std::move(name), std::move(value)); }
  const std::shared_ptr<DictData>& variables() const { return vars_; }

 private:
  std::shared_ptr<DictData> vars_ = std::make_shared<DictData>();
  std::shared_ptr<Scope> parent_;
};

class Renderer {
 public:
  Renderer(const ast::Program& program, const RenderOptions& options);

  // Renders the whole template with `context` (a dict) as its variables.
  std::string render(const Value& context);

  // ---- services for filters, tests, methods and globals
  Budget& budget() { return budget_; }
  std::time_t now() const;
  // Calls any callable value, counting call depth.
  Value call(const Value& callee, CallArgs& args);

  // Internal: entry points used by the callables the renderer creates.
  Value invoke_macro(const ast::MacroStmt& macro, const std::shared_ptr<Scope>& closure, CallArgs& args,
                     const Value& caller);
  Value invoke_caller(const ast::CallBlockStmt& block, const std::shared_ptr<Scope>& closure, CallArgs& args);

 private:
  enum class Flow { Normal, Break, Continue };

  Flow render_body(const ast::Body& body, Scope& scope);
  Flow render_statement(const ast::Stmt& stmt, Scope& scope);
  Flow render_for(const ast::ForStmt& node, Scope& scope);
  void render_call_block(const ast::CallBlockStmt& node, Scope& scope);
  void assign(const ast::Target& target, const Value& value, Scope& scope);
  std::string capture(const ast::Body& body, Scope& scope);
  Value apply_filters(const std::vector<std::unique_ptr<ast::Filter>>& filters, Value input, Scope& scope);
  void bind_parameters(const std::vector<ast::Parameter>& params, CallArgs& args, Scope& scope,
                       std::string_view callee);

  Value eval(const ast::Expr& expr, Scope& scope);
  Value eval_call(const ast::Call& node, Scope& scope);
  CallArgs eval_arguments(const ast::Arguments& args, Scope& scope);
  Value eval_compare(const ast::Compare& node, Scope& scope);

  void write(std::string_view text);
  void account_result(const Value& v);

  const ast::Program& program_;
  const RenderOptions& options_;
  Budget budget_;
  std::string* out_ = nullptr;
  size_t current_offset_ = 0;  // source offset of the node being evaluated, for errors
};

}  // namespace reprise::jinja
