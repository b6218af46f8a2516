#include "server/jinja/renderer.h"

#include <chrono>
#include <optional>

#include "server/jinja/access.h"
#include "server/jinja/globals.h"
#include "server/jinja/lexer.h"
#include "server/jinja/operators.h"
#include "server/jinja/raise.h"
#include "util/error.h"

namespace reprise::jinja {

using namespace ast;

const Value* Scope::lookup(std::string_view name) const {
  for (const Scope* s = this; s; s = s->parent_.get()) {
    if (const Value* v = s->vars_->find(name)) return v;
  }
  return nullptr;
}

namespace {

// A macro bound to the scope it was defined in.
class MacroCallable : public Callable {
 public:
  MacroCallable(const MacroStmt& macro, std::shared_ptr<Scope> closure)
      : macro_(macro), closure_(std::move(closure)) {}
  Value call(Renderer& renderer, CallArgs& args) override {
    return renderer.invoke_macro(macro_, closure_, args, Value());
  }
  std::string name() const override { return macro_.name; }
  const MacroStmt& macro() const { return macro_; }
  const std::shared_ptr<Scope>& closure() const { return closure_; }

 private:
  const MacroStmt& macro_;
  std::shared_ptr<Scope> closure_;
};

// `caller` inside a macro invoked from {% call %}: renders the call body.
class CallerCallable : public Callable {
 public:
  CallerCallable(const CallBlockStmt& block, std::shared_ptr<Scope> closure)
      : block_(block), closure_(std::move(closure)) {}
  Value call(Renderer& renderer, CallArgs& args) override {
    return renderer.invoke_caller(block_, closure_, args);
  }
  std::string name() const override { return "caller"; }

 private:
  const CallBlockStmt& block_;
  std::shared_ptr<Scope> closure_;
};

// loop.cycle('odd', 'even'); reads the loop's current position.
class CycleCallable : public Callable {
 public:
  explicit CycleCallable(std::shared_ptr<const size_t> index0) : index0_(std::move(index0)) {}
  Value call(Renderer&, CallArgs& args) override {
    if (args.positional.empty()) throw Error("no items for cycling given");
    return args.positional[*index0_ % args.positional.size()];
  }
  std::string name() const override { return "cycle"; }

 private:
  std::shared_ptr<const size_t> index0_;
};

// loop.changed(*values): true when the values differ from the last call's
// (always on the first call), as Jinja2's LoopContext.changed.
class ChangedCallable : public Callable {
 public:
  Value call(Renderer&, CallArgs& args) override {
    Value now = Value::list(args.positional);
    const bool changed = !last_ || !equals(*last_, now);
    last_ = std::move(now);
    return Value::boolean(changed);
  }
  std::string name() const override { return "changed"; }
  // The values may hold the loop object itself (a reference cycle through
  // this callable): the loop forgets them when it ends.
  void forget() { last_.reset(); }

 private:
  std::optional<Value> last_;
};

// Points the renderer's output at a temporary buffer for the guard's lifetime.
class OutputRedirect {
 public:
  OutputRedirect(std::string*& out, std::string& buffer) : out_(out), saved_(out) { out_ = &buffer; }
  ~OutputRedirect() { out_ = saved_; }
  OutputRedirect(const OutputRedirect&) = delete;
  OutputRedirect& operator=(const OutputRedirect&) = delete;

 private:
  std::string*& out_;
  std::string* saved_;
};

[[noreturn]] void undefined_error(const Value& v) {
  std::string_view hint = v.undefined_hint();
  if (!hint.empty()) throw Error("'" + std::string(hint) + "' is undefined");
  throw Error("value is undefined");
}

}  // namespace

Renderer::Renderer(const Program& program, const RenderOptions& options)
    : program_(program), options_(options), budget_([&] {
        BudgetLimits limits;
        limits.max_output_bytes = options.max_output_bytes;
        limits.max_steps = options.max_steps;
        limits.max_call_depth = options.max_recursion_depth;
        limits.max_work_bytes = std::max<uint64_t>(limits.max_work_bytes, 64ull * options.max_output_bytes);
        return limits;
      }()) {}

std::time_t Renderer::now() const {
  if (options_.now) return options_.now();
  return std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
}

std::string Renderer::render(const Value& context) {
  CycleBreaker cycle_breaker;  // declared first: runs after everything else is released
  Budget::Activate active(budget_);
  std::string output;
  OutputRedirect redirect(out_, output);
  auto root = std::make_shared<Scope>(nullptr);
  if (context.is_dict()) {
    for (const auto& [name, value] : context.as_dict().entries()) root->set(name, value);
  }
  try {
    render_body(program_.body, *root);
  } catch (const TemplateRaised& raised) {
    throw TemplateRaised("template raised an exception: " + raised.template_message(), raised.template_message());
  } catch (const std::exception& e) {
    // Includes std::bad_alloc and friends: callers only ever see reprise::Error.
    throw Error("template render error at " + describe_position(program_.source, current_offset_) + ": " +
                e.what());
  }
  return output;
}

void Renderer::write(std::string_view text) {
  budget_.check_size(out_->size() + text.size());
  budget_.charge_bytes(text.size());
  out_->append(text);
}

void Renderer::account_result(const Value& v) {
  if (v.is_string()) {
    budget_.check_size(v.as_string().size());
    budget_.charge_bytes(v.as_string().size());
  } else if (v.is_list()) {
    budget_.charge_steps(v.as_list().items.size() / 16);
  }
}

std::string Renderer::capture(const Body& body, Scope& scope) {
  std::string buffer;
  OutputRedirect redirect(out_, buffer);
  render_body(body, scope);
  return buffer;
}

// ------------------------------------------------------------------ statements

Renderer::Flow Renderer::render_body(const Body& body, Scope& scope) {
  for (const StmtPtr& stmt : body) {
    Flow flow = render_statement(*stmt, scope);
    if (flow != Flow::Normal) return flow;
  }
  return Flow::Normal;
}

Renderer::Flow Renderer::render_statement(const Stmt& stmt, Scope& scope) {
  Budget::Nesting nesting(&budget_);
  current_offset_ = stmt.offset;
  switch (stmt.kind) {
    case StmtKind::Text:
      write(static_cast<const TextStmt&>(stmt).text);
      return Flow::Normal;
    case StmtKind::Output: {
      Value v = eval(*static_cast<const OutputStmt&>(stmt).value, scope);
      if (v.is_string()) write(v.as_string());
      else write(to_str(v));
      return Flow::Normal;
    }
    case StmtKind::If: {
      const auto& node = static_cast<const IfStmt&>(stmt);
      for (const auto& [condition, body] : node.branches) {
        if (truthy(eval(*condition, scope))) return render_body(body, scope);
      }
      return render_body(node.otherwise, scope);
    }
    case StmtKind::For:
      return render_for(static_cast<const ForStmt&>(stmt), scope);
    case StmtKind::Set: {
      const auto& node = static_cast<const SetStmt&>(stmt);
      assign(node.target, eval(*node.value, scope), scope);
      return Flow::Normal;
    }
    case StmtKind::SetBlock: {
      const auto& node = static_cast<const SetBlockStmt&>(stmt);
      Value captured = Value::string(capture(node.body, scope));
      assign(node.target, apply_filters(node.filters, std::move(captured), scope), scope);
      return Flow::Normal;
    }
    case StmtKind::Macro: {
      const auto& node = static_cast<const MacroStmt&>(stmt);
      // The scope now holds a closure over itself: a cycle to break later.
      CycleBreaker::note(scope.variables());
      scope.set(node.name, Value::callable(std::make_shared<MacroCallable>(node, scope.shared_from_this())));
      return Flow::Normal;
    }
    case StmtKind::CallBlock:
      render_call_block(static_cast<const CallBlockStmt&>(stmt), scope);
      return Flow::Normal;
    case StmtKind::FilterBlock: {
      const auto& node = static_cast<const FilterBlockStmt&>(stmt);
      Value captured = Value::string(capture(node.body, scope));
      Value filtered = apply_filters(node.filters, std::move(captured), scope);
      write(to_str(filtered));
      return Flow::Normal;
    }
    case StmtKind::Break:
      return Flow::Break;
    case StmtKind::Continue:
      return Flow::Continue;
    case StmtKind::Do:
      eval(*static_cast<const DoStmt&>(stmt).expr, scope);
      return Flow::Normal;
    case StmtKind::Generation:
      return render_body(static_cast<const GenerationStmt&>(stmt).body, scope);
  }
  return Flow::Normal;
}

Renderer::Flow Renderer::render_for(const ForStmt& node, Scope& scope) {
  Value iterable = eval(*node.iterable, scope);
  if (iterable.is_dict() && iterable.as_dict().flavor != DictData::Flavor::Dict) {
    throw Error("'" + std::string(type_name(iterable)) + "' object is not iterable");
  }
  if (iterable.is_none()) throw Error("'NoneType' object is not iterable");
  std::vector<Value> items = iterate(iterable);
  budget_.charge_steps(items.size() / 16);
  auto loop_scope = std::make_shared<Scope>(scope.shared_from_this());
  if (node.condition) {
    // `for x in xs if cond` filters before looping, so loop.length and
    // loop.last see only the kept items.
    std::vector<Value> kept;
    for (Value& item : items) {
      budget_.charge_steps(1);
      assign(node.target, item, *loop_scope);
      if (truthy(eval(*node.condition, *loop_scope))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  // One loop object per loop, updated in place, like Jinja2's LoopContext.
  const size_t n = items.size();
  const auto count = static_cast<int64_t>(n);
  auto position = std::make_shared<size_t>(0);
  Value loop = Value::dict(DictData::Flavor::Loop);
  DictData& fields = loop.as_dict();
  for (const char* name : {"index0", "index", "revindex0", "revindex", "first", "last", "previtem", "nextitem"}) {
    fields.set(name, Value());
  }
  fields.set("length", Value::integer(count));
  fields.set("depth", Value::integer(1));
  fields.set("depth0", Value::integer(0));
  fields.set("cycle", Value::callable(std::make_shared<CycleCallable>(position)));
  auto changed = std::make_shared<ChangedCallable>();
  fields.set("changed", Value::callable(changed));
  struct ForgetOnExit {
    ChangedCallable& c;
    ~ForgetOnExit() { c.forget(); }
  } forget_changed{*changed};
  Value* index0 = fields.slot("index0");
  Value* index1 = fields.slot("index");
  Value* revindex0 = fields.slot("revindex0");
  Value* revindex1 = fields.slot("revindex");
  Value* first = fields.slot("first");
  Value* last = fields.slot("last");
  Value* previtem = fields.slot("previtem");
  Value* nextitem = fields.slot("nextitem");
  loop_scope->set("loop", loop);
  for (size_t i = 0; i < n; ++i) {
    budget_.charge_steps(1);
    current_offset_ = node.offset;
    assign(node.target, items[i], *loop_scope);
    const auto index = static_cast<int64_t>(i);
    *position = i;
    *index0 = Value::integer(index);
    *index1 = Value::integer(index + 1);
    *revindex0 = Value::integer(count - index - 1);
    *revindex1 = Value::integer(count - index);
    *first = Value::boolean(i == 0);
    *last = Value::boolean(i + 1 == n);
    *previtem = i > 0 ? items[i - 1] : Value::undefined("loop.previtem");
    *nextitem = i + 1 < n ? items[i + 1] : Value::undefined("loop.nextitem");
    if (render_body(node.body, *loop_scope) == Flow::Break) break;
  }
  if (n == 0) return render_body(node.otherwise, scope);
  return Flow::Normal;
}

void Renderer::assign(const Target& target, const Value& value, Scope& scope) {
  if (!target.attribute.empty()) {
    const Value* object = scope.lookup(target.names[0]);
    if (!object || !object->is_dict() || object->as_dict().flavor != DictData::Flavor::Namespace) {
      throw Error("cannot assign attribute on non-namespace object '" + target.names[0] + "'");
    }
    CycleBreaker::note_store(*object, value);
    object->as_dict().set(target.attribute, value);
    return;
  }
  if (!target.unpack) {
    scope.set(target.names[0], value);
    return;
  }
  std::vector<Value> parts;
  if (value.is_list()) parts = value.as_list().items;
  else if (value.is_string()) parts = iterate(value);
  else throw Error("cannot unpack non-iterable " + std::string(type_name(value)) + " object");
  if (parts.size() != target.names.size()) {
    throw Error(parts.size() > target.names.size()
                    ? "too many values to unpack (expected " + std::to_string(target.names.size()) + ")"
                    : "not enough values to unpack (expected " + std::to_string(target.names.size()) +
                          ", got " + std::to_string(parts.size()) + ")");
  }
  for (size_t i = 0; i < parts.size(); ++i) scope.set(target.names[i], std::move(parts[i]));
}

Value Renderer::apply_filters(const std::vector<std::unique_ptr<Filter>>& filters, Value input, Scope& scope) {
  for (const auto& filter : filters) {
    current_offset_ = filter->offset;
    CallArgs args = eval_arguments(filter->args, scope);
    if (!filter->fn) throw Error("no filter named '" + filter->name + "'");
    input = filter->fn(*this, input, args);
    account_result(input);
  }
  return input;
}

void Renderer::bind_parameters(const std::vector<Parameter>& params, CallArgs& args, Scope& scope,
                               std::string_view callee) {
  std::vector<Value> varargs;
  Value kwargs = Value::dict();
  std::vector<bool> bound(params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    if (i < params.size()) {
      scope.set(params[i].name, std::move(args.positional[i]));
      bound[i] = true;
    } else {
      varargs.push_back(std::move(args.positional[i]));
    }
  }
  for (auto& [name, value] : args.named) {
    size_t i = 0;
    while (i < params.size() && params[i].name != name) ++i;
    if (i == params.size()) {
      kwargs.as_dict().set(name, std::move(value));
      continue;
    }
    if (bound[i]) throw Error(std::string(callee) + "() got multiple values for argument '" + name + "'");
    scope.set(params[i].name, std::move(value));
    bound[i] = true;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (bound[i]) continue;
    // Jinja leaves a missing required parameter undefined rather than failing.
    scope.set(params[i].name,
              params[i].default_value ? eval(*params[i].default_value, scope) : Value::undefined(params[i].name));
  }
  scope.set("varargs", Value::list(std::move(varargs), /*tuple=*/true));
  scope.set("kwargs", std::move(kwargs));
}

// Call depth is counted by call() (and render_call_block), not here.
Value Renderer::invoke_macro(const MacroStmt& macro, const std::shared_ptr<Scope>& closure, CallArgs& args,
                             const Value& caller) {
  auto scope = std::make_shared<Scope>(closure);
  bind_parameters(macro.params, args, *scope, macro.name);
  if (!caller.is_undefined()) scope->set("caller", caller);
  size_t saved_offset = current_offset_;
  std::string out = capture(macro.body, *scope);
  current_offset_ = saved_offset;
  return Value::string(std::move(out));
}

Value Renderer::invoke_caller(const CallBlockStmt& block, const std::shared_ptr<Scope>& closure, CallArgs& args) {
  auto scope = std::make_shared<Scope>(closure);
  bind_parameters(block.params, args, *scope, "caller");
  return Value::string(capture(block.body, *scope));
}

void Renderer::render_call_block(const CallBlockStmt& node, Scope& scope) {
  Value callee = eval(*node.call->callee, scope);
  CallArgs args = eval_arguments(node.call->args, scope);
  Value caller = Value::callable(std::make_shared<CallerCallable>(node, scope.shared_from_this()));
  Value result;
  if (callee.is_callable()) {
    if (auto* macro = dynamic_cast<MacroCallable*>(&callee.as_callable())) {
      Budget::CallDepth depth(budget_);
      budget_.charge_steps(1);
      result = invoke_macro(macro->macro(), macro->closure(), args, caller);
    } else {
      args.named.emplace_back("caller", caller);
      result = call(callee, args);
    }
  } else if (callee.is_undefined()) {
    undefined_error(callee);
  } else {
    throw Error("'" + std::string(type_name(callee)) + "' object is not callable");
  }
  write(to_str(result));
}

Value Renderer::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) undefined_error(callee);
  if (!callee.is_callable()) throw Error("'" + std::string(type_name(callee)) + "' object is not callable");
  Budget::CallDepth depth(budget_);
  budget_.charge_steps(1);
  Value result = callee.as_callable().call(*this, args);
  account_result(result);
  return result;
}

// ----------------------------------------------------------------- expressions

CallArgs Renderer::eval_arguments(const Arguments& args, Scope& scope) {
  CallArgs out;
  out.positional.reserve(args.positional.size());
  for (const ExprPtr& e : args.positional) out.positional.push_back(eval(*e, scope));
  for (const auto& [name, e] : args.named) out.named.emplace_back(name, eval(*e, scope));
  return out;
}

Value Renderer::eval_call(const Call& node, Scope& scope) {
  // obj.method(args) dispatches straight to the builtin method, without
  // materializing a bound-method object.
  if (node.callee->kind == ExprKind::Attribute) {
    const auto& attribute = static_cast<const Attribute&>(*node.callee);
    Value object = eval(*attribute.object, scope);
    CallArgs args = eval_arguments(node.args, scope);
    current_offset_ = node.offset;
    Value result;
    if (call_method(*this, object, attribute.name, args, result)) {
      account_result(result);
      return result;
    }
    Value callee = get_attribute(object, attribute.name);
    if (callee.is_undefined()) {
      throw Error("'" + std::string(type_name(object)) + "' object has no attribute '" + attribute.name + "'");
    }
    return call(callee, args);
  }
  Value callee = eval(*node.callee, scope);
  CallArgs args = eval_arguments(node.args, scope);
  current_offset_ = node.offset;
  return call(callee, args);
}

Value Renderer::eval_compare(const Compare& node, Scope& scope) {
  Value left = eval(*node.first, scope);
  for (const auto& [op, operand] : node.rest) {
    Value right = eval(*operand, scope);
    current_offset_ = node.offset;
    bool ok = false;
    switch (op) {
      case CompareOp::Equal: ok = equals(left, right); break;
      case CompareOp::NotEqual: ok = !equals(left, right); break;
      case CompareOp::Less: ok = compare(left, right) < 0; break;
      case CompareOp::LessEqual: ok = compare(left, right) <= 0; break;
      case CompareOp::Greater: ok = compare(left, right) > 0; break;
      case CompareOp::GreaterEqual: ok = compare(left, right) >= 0; break;
      case CompareOp::In: ok = contains(right, left); break;
      case CompareOp::NotIn: ok = !contains(right, left); break;
    }
    if (!ok) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Renderer::eval(const Expr& expr, Scope& scope) {
  Budget::Nesting nesting(&budget_);
  current_offset_ = expr.offset;
  switch (expr.kind) {
    case ExprKind::Literal:
      return static_cast<const Literal&>(expr).value;
    case ExprKind::Name: {
      const auto& name = static_cast<const Name&>(expr).name;
      if (const Value* v = scope.lookup(name)) return *v;
      if (const Value* g = find_global(name)) return *g;
      return Value::undefined(name);
    }
    case ExprKind::List: {
      const auto& node = static_cast<const ListLiteral&>(expr);
      std::vector<Value> items;
      items.reserve(node.items.size());
      for (const ExprPtr& item : node.items) items.push_back(eval(*item, scope));
      return Value::list(std::move(items), node.tuple);
    }
    case ExprKind::Dict: {
      const auto& node = static_cast<const DictLiteral&>(expr);
      Value dict = Value::dict();
      for (const auto& [key_expr, value_expr] : node.entries) {
        Value key = eval(*key_expr, scope);
        Value value = eval(*value_expr, scope);
        if (key.is_list() || key.is_dict()) throw Error("unhashable type: '" + std::string(type_name(key)) + "'");
        dict.as_dict().set(to_str(key), std::move(value));
      }
      return dict;
    }
    case ExprKind::Attribute: {
      const auto& node = static_cast<const Attribute&>(expr);
      return get_attribute(eval(*node.object, scope), node.name);
    }
    case ExprKind::Subscript: {
      const auto& node = static_cast<const Subscript&>(expr);
      Value object = eval(*node.object, scope);
      return get_item(object, eval(*node.index, scope));
    }
    case ExprKind::Slice: {
      const auto& node = static_cast<const Slice&>(expr);
      Value object = eval(*node.object, scope);
      Value start = node.start ? eval(*node.start, scope) : Value::none();
      Value stop = node.stop ? eval(*node.stop, scope) : Value::none();
      Value step = node.step ? eval(*node.step, scope) : Value::none();
      current_offset_ = node.offset;
      Value result = get_slice(object, start, stop, step);
      account_result(result);
      return result;
    }
    case ExprKind::Call:
      return eval_call(static_cast<const Call&>(expr), scope);
    case ExprKind::Filter: {
      const auto& node = static_cast<const Filter&>(expr);
      Value input = node.input ? eval(*node.input, scope) : Value();
      CallArgs args = eval_arguments(node.args, scope);
      current_offset_ = node.offset;
      if (!node.fn) throw Error("no filter named '" + node.name + "'");
      Value result = node.fn(*this, input, args);
      account_result(result);
      return result;
    }
    case ExprKind::Test: {
      const auto& node = static_cast<const Test&>(expr);
      Value input = eval(*node.input, scope);
      CallArgs args = eval_arguments(node.args, scope);
      current_offset_ = node.offset;
      if (!node.fn) throw Error("no test named '" + node.name + "'");
      return Value::boolean(node.fn(*this, input, args) != node.negated);
    }
    case ExprKind::Unary: {
      const auto& node = static_cast<const Unary&>(expr);
      Value operand = eval(*node.operand, scope);
      current_offset_ = node.offset;
      if (node.op == UnaryOp::Not) return Value::boolean(!truthy(operand));
      return apply_unary(node.op, operand);
    }
    case ExprKind::Binary: {
      const auto& node = static_cast<const Binary&>(expr);
      Value left = eval(*node.left, scope);
      if (node.op == BinaryOp::And) return truthy(left) ? eval(*node.right, scope) : left;
      if (node.op == BinaryOp::Or) return truthy(left) ? left : eval(*node.right, scope);
      Value right = eval(*node.right, scope);
      current_offset_ = node.offset;
      Value result = apply_binary(node.op, left, right);
      account_result(result);
      return result;
    }
    case ExprKind::Compare:
      return eval_compare(static_cast<const Compare&>(expr), scope);
    case ExprKind::Conditional: {
      const auto& node = static_cast<const Conditional&>(expr);
      if (truthy(eval(*node.condition, scope))) return eval(*node.then_value, scope);
      if (node.else_value) return eval(*node.else_value, scope);
      return Value::undefined();
    }
  }
  return Value::undefined();
}

}  // namespace reprise::jinja
