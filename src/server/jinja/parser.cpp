#include "server/jinja/parser.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "server/jinja/lexer.h"
#include "util/error.h"

namespace reprise::jinja {

namespace {

using namespace ast;

constexpr int kMaxParseDepth = 150;       // nested statements / parenthesized expressions
constexpr int kMaxNodesPerTag = 2000;     // bounds tree depth of long operator chains

std::string describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::Text: return "template text";
    case TokenKind::VariableBegin: return "'{{'";
    case TokenKind::VariableEnd: return "end of print statement '}}'";
    case TokenKind::BlockBegin: return "'{%'";
    case TokenKind::BlockEnd: return "end of statement block '%}'";
    case TokenKind::Name: return "'" + t.value + "'";
    case TokenKind::String: return "string literal";
    case TokenKind::Integer: case TokenKind::Float: return "number " + t.value;
    case TokenKind::Operator: return "'" + t.value + "'";
    case TokenKind::EndOfInput: return "end of template";
  }
  return "token";
}

class Parser {
 public:
  Parser(std::string_view source, std::vector<Token> tokens) : source_(source), tokens_(std::move(tokens)) {}

  Body parse_template() {
    Body body;
    parse_body(body, {});
    return body;
  }

 private:
  // ---------------------------------------------------------------- tokens

  const Token& peek(size_t ahead = 0) const {
    size_t i = std::min(pos_ + ahead, tokens_.size() - 1);
    return tokens_[i];
  }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool at_operator(std::string_view op, size_t ahead = 0) const {
    const Token& t = peek(ahead);
    return t.kind == TokenKind::Operator && t.value == op;
  }
  bool at_name(std::string_view name, size_t ahead = 0) const {
    const Token& t = peek(ahead);
    return t.kind == TokenKind::Name && t.value == name;
  }
  bool skip_operator(std::string_view op) {
    if (!at_operator(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(const Token& at, const std::string& problem) const {
    throw_syntax_error(source_, at.offset, problem);
  }
  void expect_operator(std::string_view op) {
    if (!skip_operator(op)) fail(peek(), "expected '" + std::string(op) + "', got " + describe(peek()));
  }
  std::string expect_name(std::string_view what) {
    if (peek().kind != TokenKind::Name) fail(peek(), "expected " + std::string(what) + ", got " + describe(peek()));
    return next().value;
  }
  void expect_block_end() {
    if (peek().kind != TokenKind::BlockEnd) {
      fail(peek(), "expected end of statement block '%}', got " + describe(peek()));
    }
    next();
  }

  // Caps recursion so deeply nested input fails cleanly instead of
  // overflowing the stack.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxParseDepth) fail_deep();
    }
    ~DepthGuard() { --p_.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    void fail_deep() {
      --p_.depth_;
      p_.fail(p_.peek(), "template nested too deeply");
    }
    Parser& p_;
  };

  template <typename T, typename... Args>
  std::unique_ptr<T> make(Args&&... args) {
    if (++tag_nodes_ > kMaxNodesPerTag) fail(peek(), "expression too large");
    return std::make_unique<T>(std::forward<Args>(args)...);
  }

  // ------------------------------------------------------------ statements

  // Parses until a block tag whose keyword is in `terminators` (consumed,
  // along with `{%`) and returns that keyword; "" at the end of the template.
  std::string parse_body(Body& body, std::initializer_list<std::string_view> terminators) {
    DepthGuard guard(*this);
    while (true) {
      const Token& t = peek();
      switch (t.kind) {
        case TokenKind::Text:
          body.push_back(std::make_unique<TextStmt>(t.offset, t.value));
          next();
          break;
        case TokenKind::VariableBegin: {
          next();
          tag_nodes_ = 0;
          ExprPtr value = parse_tuple(/*with_condexpr=*/true, {}, /*explicit_parens=*/false);
          if (peek().kind != TokenKind::VariableEnd) {
            fail(peek(), "expected end of print statement '}}', got " + describe(peek()));
          }
          next();
          body.push_back(std::make_unique<OutputStmt>(t.offset, std::move(value)));
          break;
        }
        case TokenKind::BlockBegin: {
          size_t offset = t.offset;
          next();
          tag_nodes_ = 0;
          std::string keyword = expect_name("statement name");
          if (std::find(terminators.begin(), terminators.end(), keyword) != terminators.end()) return keyword;
          body.push_back(parse_statement(keyword, offset, terminators));
          break;
        }
        case TokenKind::EndOfInput:
          if (terminators.size() != 0) {
            std::string expected;
            for (std::string_view term : terminators) {
              if (!expected.empty()) expected += " or ";
              expected += "'" + std::string(term) + "'";
            }
            fail(t, "unexpected end of template; expected " + expected);
          }
          return "";
        default:
          fail(t, "unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement(const std::string& keyword, size_t offset,
                          std::initializer_list<std::string_view> open_terminators) {
    if (keyword == "if") return parse_if(offset);
    if (keyword == "for") return parse_for(offset);
    if (keyword == "set") return parse_set(offset);
    if (keyword == "macro") return parse_macro(offset);
    if (keyword == "call") return parse_call_block(offset);
    if (keyword == "filter") return parse_filter_block(offset);
    if (keyword == "break" || keyword == "continue") {
      if (loop_depth_ == 0) fail(tokens_[pos_ - 1], "'" + keyword + "' outside of a loop");
      expect_block_end();
      return std::make_unique<LoopControlStmt>(keyword == "break" ? StmtKind::Break : StmtKind::Continue, offset);
    }
    if (keyword == "do") {
      ExprPtr e = parse_tuple(true, {}, false);
      expect_block_end();
      return std::make_unique<DoStmt>(offset, std::move(e));
    }
    if (keyword == "generation") {
      expect_block_end();
      auto node = std::make_unique<GenerationStmt>(offset);
      parse_body(node->body, {"endgeneration"});
      expect_block_end();
      return node;
    }
    static constexpr std::string_view kUnsupported[] = {"include", "extends", "block", "import", "from",
                                                        "with", "autoescape", "trans"};
    for (std::string_view u : kUnsupported) {
      if (keyword == u) fail(tokens_[pos_ - 1], "'{% " + keyword + " %}' is not supported in chat templates");
    }
    if (keyword.rfind("end", 0) == 0 || keyword == "else" || keyword == "elif") {
      std::string problem = "unexpected '" + keyword + "'";
      if (open_terminators.size() != 0) {
        problem += "; expected ";
        bool first = true;
        for (std::string_view term : open_terminators) {
          problem += (first ? "'" : " or '") + std::string(term) + "'";
          first = false;
        }
      }
      fail(tokens_[pos_ - 1], problem);
    }
    fail(tokens_[pos_ - 1], "unknown tag '" + keyword + "'");
  }

  StmtPtr parse_if(size_t offset) {
    auto node = std::make_unique<IfStmt>(offset);
    ExprPtr condition = parse_tuple(false, {}, false);
    expect_block_end();
    while (true) {
      Body body;
      std::string keyword = parse_body(body, {"elif", "else", "endif"});
      node->branches.emplace_back(std::move(condition), std::move(body));
      if (keyword == "elif") {
        tag_nodes_ = 0;
        condition = parse_tuple(false, {}, false);
        expect_block_end();
        continue;
      }
      expect_block_end();
      if (keyword == "else") {
        parse_body(node->otherwise, {"endif"});
        expect_block_end();
      }
      return node;
    }
  }

  StmtPtr parse_for(size_t offset) {
    auto node = std::make_unique<ForStmt>(offset);
    node->target = parse_assign_target(/*allow_namespace=*/false, {"in"});
    if (!skip_name("in")) fail(peek(), "expected 'in', got " + describe(peek()));
    node->iterable = parse_tuple(false, {"recursive"}, false);
    if (at_name("recursive")) fail(peek(), "recursive loops are not supported");
    if (skip_name("if")) node->condition = parse_expression(true);
    expect_block_end();
    ++loop_depth_;
    std::string keyword = parse_body(node->body, {"endfor", "else"});
    --loop_depth_;
    expect_block_end();
    if (keyword == "else") {
      parse_body(node->otherwise, {"endfor"});
      expect_block_end();
    }
    return node;
  }

  StmtPtr parse_set(size_t offset) {
    Target target = parse_assign_target(/*allow_namespace=*/true, {});
    if (skip_operator("=")) {
      auto node = std::make_unique<SetStmt>(offset);
      node->target = std::move(target);
      node->value = parse_tuple(true, {}, false);
      expect_block_end();
      return node;
    }
    auto node = std::make_unique<SetBlockStmt>(offset);
    if (target.unpack) fail(peek(), "a block assignment needs a single target");
    node->target = std::move(target);
    while (skip_operator("|")) node->filters.push_back(parse_filter_call(nullptr));
    expect_block_end();
    parse_body(node->body, {"endset"});
    expect_block_end();
    return node;
  }

  std::vector<Parameter> parse_parameters() {
    std::vector<Parameter> params;
    expect_operator("(");
    while (!at_operator(")")) {
      if (!params.empty()) expect_operator(",");
      if (at_operator(")")) break;
      Parameter p;
      p.name = expect_name("parameter name");
      for (const Parameter& other : params) {
        if (other.name == p.name) fail(peek(), "duplicate parameter '" + p.name + "'");
      }
      if (skip_operator("=")) p.default_value = parse_expression(true);
      else if (!params.empty() && params.back().default_value) fail(peek(), "non-default parameter follows default parameter");
      params.push_back(std::move(p));
    }
    next();
    return params;
  }

  StmtPtr parse_macro(size_t offset) {
    auto node = std::make_unique<MacroStmt>(offset);
    node->name = expect_name("macro name");
    node->params = parse_parameters();
    expect_block_end();
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    parse_body(node->body, {"endmacro"});
    loop_depth_ = saved_loop_depth;
    if (peek().kind == TokenKind::Name) next();  // optional {% endmacro name %}
    expect_block_end();
    return node;
  }

  StmtPtr parse_call_block(size_t offset) {
    auto node = std::make_unique<CallBlockStmt>(offset);
    if (at_operator("(")) node->params = parse_parameters();
    ExprPtr call = parse_expression(true);
    if (call->kind != ExprKind::Call) fail(peek(), "expected a call after '{% call'");
    node->call.reset(static_cast<Call*>(call.release()));
    expect_block_end();
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    parse_body(node->body, {"endcall"});
    loop_depth_ = saved_loop_depth;
    expect_block_end();
    return node;
  }

  StmtPtr parse_filter_block(size_t offset) {
    auto node = std::make_unique<FilterBlockStmt>(offset);
    node->filters.push_back(parse_filter_call(nullptr));
    while (skip_operator("|")) node->filters.push_back(parse_filter_call(nullptr));
    expect_block_end();
    parse_body(node->body, {"endfilter"});
    expect_block_end();
    return node;
  }

  Target parse_assign_target(bool allow_namespace, std::initializer_list<std::string_view> end_names) {
    Target target;
    auto checked_name = [&]() {
      const Token& t = peek();
      std::string name = expect_name("assignment target");
      if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" ||
          name == "None") {
        fail(t, "cannot assign to '" + name + "'");
      }
      return name;
    };
    if (allow_namespace && peek().kind == TokenKind::Name && at_operator(".", 1)) {
      target.names.push_back(checked_name());
      next();
      target.attribute = expect_name("attribute name");
      return target;
    }
    bool parenthesized = skip_operator("(");
    while (true) {
      target.names.push_back(checked_name());
      if (!skip_operator(",")) break;
      target.unpack = true;
      bool at_end = at_operator(")") || at_operator("=") || peek().kind == TokenKind::BlockEnd;
      for (std::string_view n : end_names) at_end = at_end || at_name(n);
      if (at_end) break;
    }
    if (parenthesized) {
      target.unpack = true;
      expect_operator(")");
    }
    return target;
  }

  // ----------------------------------------------------------- expressions

  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
    const Token& t = peek();
    if (t.kind == TokenKind::VariableEnd || t.kind == TokenKind::BlockEnd || t.kind == TokenKind::EndOfInput) return true;
    if (at_operator(")")) return true;
    for (std::string_view name : extra_end) {
      if (at_name(name)) return true;
    }
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<std::string_view> extra_end, bool explicit_parens) {
    size_t offset = peek().offset;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_operator(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (at_operator(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail(peek(), "expected an expression, got " + describe(peek()));
    }
    auto tuple = make<ListLiteral>(offset, true);
    tuple->items = std::move(items);
    return tuple;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr expr = parse_or();
    while (at_name("if")) {
      size_t offset = next().offset;
      ExprPtr condition = parse_or();
      ExprPtr otherwise;
      if (skip_name("else")) {
        DepthGuard guard(*this);
        otherwise = parse_condexpr();
      }
      expr = make<Conditional>(offset, std::move(condition), std::move(expr), std::move(otherwise));
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      size_t offset = next().offset;
      left = make<Binary>(offset, BinaryOp::Or, std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      size_t offset = next().offset;
      left = make<Binary>(offset, BinaryOp::And, std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      DepthGuard guard(*this);
      size_t offset = next().offset;
      return make<Unary>(offset, UnaryOp::Not, parse_not());
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    std::unique_ptr<Compare> compare;
    while (true) {
      const Token& t = peek();
      CompareOp op;
      if (t.kind == TokenKind::Operator && t.value == "==") op = CompareOp::Equal;
      else if (t.kind == TokenKind::Operator && t.value == "!=") op = CompareOp::NotEqual;
      else if (t.kind == TokenKind::Operator && t.value == "<") op = CompareOp::Less;
      else if (t.kind == TokenKind::Operator && t.value == "<=") op = CompareOp::LessEqual;
      else if (t.kind == TokenKind::Operator && t.value == ">") op = CompareOp::Greater;
      else if (t.kind == TokenKind::Operator && t.value == ">=") op = CompareOp::GreaterEqual;
      else if (at_name("in")) op = CompareOp::In;
      else if (at_name("not") && at_name("in", 1)) {
        next();
        op = CompareOp::NotIn;
      } else {
        break;
      }
      size_t offset = next().offset;
      if (!compare) compare = make<Compare>(offset, std::move(first));
      compare->rest.emplace_back(op, parse_math1());
    }
    if (compare) return compare;
    return first;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_operator("+") || at_operator("-")) {
      const Token& t = next();
      BinaryOp op = t.value == "+" ? BinaryOp::Add : BinaryOp::Subtract;
      left = make<Binary>(t.offset, op, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (at_operator("~")) {
      size_t offset = next().offset;
      left = make<Binary>(offset, BinaryOp::Concat, std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_operator("*") || at_operator("/") || at_operator("//") || at_operator("%")) {
      const Token& t = next();
      BinaryOp op = t.value == "*" ? BinaryOp::Multiply
                    : t.value == "/" ? BinaryOp::Divide
                    : t.value == "//" ? BinaryOp::FloorDivide
                                      : BinaryOp::Modulo;
      left = make<Binary>(t.offset, op, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (at_operator("**")) {
      size_t offset = next().offset;
      left = make<Binary>(offset, BinaryOp::Power, std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (at_operator("-") || at_operator("+")) {
      const Token& t = next();
      UnaryOp op = t.value == "-" ? UnaryOp::Negate : UnaryOp::Plus;
      node = make<Unary>(t.offset, op, parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_number(const Token& t) {
    if (t.kind == TokenKind::Float) {
      double d = std::strtod(t.value.c_str(), nullptr);
      return make<Literal>(t.offset, Value::number(d));
    }
    int base = 10;
    std::string_view digits = t.value;
    if (digits.size() > 1 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'o' || digits[1] == 'b')) {
      base = digits[1] == 'x' ? 16 : digits[1] == 'o' ? 8 : 2;
      digits.remove_prefix(2);
    }
    int64_t value = 0;
    auto res = std::from_chars(digits.data(), digits.data() + digits.size(), value, base);
    if (res.ec != std::errc() || res.ptr != digits.data() + digits.size()) fail(t, "integer literal too large");
    return make<Literal>(t.offset, Value::integer(value));
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::Name: {
        next();
        if (t.value == "true" || t.value == "True") return make<Literal>(t.offset, Value::boolean(true));
        if (t.value == "false" || t.value == "False") return make<Literal>(t.offset, Value::boolean(false));
        if (t.value == "none" || t.value == "None") return make<Literal>(t.offset, Value::none());
        return make<Name>(t.offset, t.value);
      }
      case TokenKind::String: {
        std::string s;
        size_t offset = t.offset;
        while (peek().kind == TokenKind::String) s += next().value;
        return make<Literal>(offset, Value::string(std::move(s)));
      }
      case TokenKind::Integer:
      case TokenKind::Float:
        next();
        return parse_number(t);
      case TokenKind::Operator:
        if (t.value == "(") {
          next();
          ExprPtr inner = parse_tuple(true, {}, /*explicit_parens=*/true);
          expect_operator(")");
          return inner;
        }
        if (t.value == "[") return parse_list();
        if (t.value == "{") return parse_dict();
        break;
      default:
        break;
    }
    fail(t, "unexpected " + describe(t));
  }

  ExprPtr parse_list() {
    DepthGuard guard(*this);
    auto list = make<ListLiteral>(next().offset, false);
    while (!at_operator("]")) {
      if (!list->items.empty()) expect_operator(",");
      if (at_operator("]")) break;
      list->items.push_back(parse_expression(true));
    }
    next();
    return list;
  }

  ExprPtr parse_dict() {
    DepthGuard guard(*this);
    auto dict = make<DictLiteral>(next().offset);
    while (!at_operator("}")) {
      if (!dict->entries.empty()) expect_operator(",");
      if (at_operator("}")) break;
      ExprPtr key = parse_expression(true);
      expect_operator(":");
      dict->entries.emplace_back(std::move(key), parse_expression(true));
    }
    next();
    return dict;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (at_operator(".")) {
        size_t offset = next().offset;
        const Token& t = peek();
        if (t.kind == TokenKind::Name) {
          next();
          node = make<Attribute>(offset, std::move(node), t.value);
        } else if (t.kind == TokenKind::Integer) {
          next();
          node = make<Subscript>(offset, std::move(node), parse_number(t));
        } else {
          fail(t, "expected attribute name after '.', got " + describe(t));
        }
      } else if (at_operator("[")) {
        node = parse_subscript(std::move(node));
      } else if (at_operator("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {
    DepthGuard guard(*this);
    size_t offset = next().offset;  // '['
    ExprPtr start;
    if (!at_operator(":")) {
      start = parse_expression(true);
      if (skip_operator("]")) return make<Subscript>(offset, std::move(object), std::move(start));
    }
    auto slice = make<Slice>(offset, std::move(object));
    slice->start = std::move(start);
    expect_operator(":");
    if (!at_operator("]") && !at_operator(":")) slice->stop = parse_expression(true);
    if (skip_operator(":")) {
      if (!at_operator("]")) slice->step = parse_expression(true);
    }
    expect_operator("]");
    return slice;
  }

  void parse_arguments(Arguments& args) {
    DepthGuard guard(*this);
    expect_operator("(");
    bool first = true;
    while (!at_operator(")")) {
      if (!first) expect_operator(",");
      first = false;
      if (at_operator(")")) break;
      if (at_operator("*") || at_operator("**")) fail(peek(), "*args and **kwargs in calls are not supported");
      if (peek().kind == TokenKind::Name && at_operator("=", 1)) {
        std::string name = next().value;
        next();
        for (const auto& named : args.named) {
          if (named.first == name) fail(peek(), "keyword argument repeated: " + name);
        }
        args.named.emplace_back(std::move(name), parse_expression(true));
      } else {
        if (!args.named.empty()) fail(peek(), "positional argument follows keyword argument");
        args.positional.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto call = make<Call>(peek().offset, std::move(callee));
    parse_arguments(call->args);
    return call;
  }

  std::string parse_dotted_name(std::string_view what) {
    std::string name = expect_name(what);
    while (at_operator(".") && peek(1).kind == TokenKind::Name) {
      next();
      name += "." + next().value;
    }
    return name;
  }

  std::unique_ptr<Filter> parse_filter_call(ExprPtr input) {
    const Token& t = peek();
    std::string name = parse_dotted_name("filter name");
    // An unknown filter fails when it runs, not here: Jinja2 3 renders a
    // template whose unknown filters and tests sit in branches not taken.
    FilterFn fn = find_filter(name);
    auto filter = make<Filter>(t.offset, std::move(input), std::move(name), fn);
    if (at_operator("(")) parse_arguments(filter->args);
    return filter;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (skip_operator("|")) {
        node = parse_filter_call(std::move(node));
      } else if (at_name("is")) {
        node = parse_test(std::move(node));
      } else if (at_operator("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_test(ExprPtr input) {
    next();  // 'is'
    bool negated = skip_name("not");
    const Token& t = peek();
    std::string name = parse_dotted_name("test name");
    TestFn fn = find_test(name);  // null: fails when it runs, as a filter
    auto test = make<Test>(t.offset, std::move(input), std::move(name), fn, negated);
    if (at_operator("(")) {
      parse_arguments(test->args);
      return test;
    }
    // A single bare argument: `x is divisibleby 3`, `x is sameas none`.
    const Token& a = peek();
    bool starts_argument =
        a.kind == TokenKind::String || a.kind == TokenKind::Integer || a.kind == TokenKind::Float ||
        (a.kind == TokenKind::Operator && (a.value == "[" || a.value == "{")) ||
        (a.kind == TokenKind::Name && a.value != "else" && a.value != "or" && a.value != "and" &&
         a.value != "if" && a.value != "in" && a.value != "not" && a.value != "recursive");
    if (starts_argument) {
      if (at_name("is")) fail(a, "You cannot chain multiple tests with is");
      DepthGuard guard(*this);
      test->args.positional.push_back(parse_postfix(parse_primary()));
    }
    return test;
  }

  std::string_view source_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  int tag_nodes_ = 0;
};

}  // namespace

std::unique_ptr<ast::Program> parse_program(std::string_view source, const ParseOptions& options) {
  auto program = std::make_unique<ast::Program>();
  program->source = normalize_source(source, options);
  std::vector<Token> tokens = tokenize(program->source, options);
  program->body = Parser(program->source, std::move(tokens)).parse_template();
  return program;
}

}  // namespace reprise::jinja
