#include "server/jinja/globals.h"

#include <ctime>
#include <unordered_map>

#include "server/jinja/args.h"
#include "server/jinja/budget.h"
#include "server/jinja/raise.h"
#include "server/jinja/renderer.h"
#include "util/error.h"

namespace reprise::jinja {

namespace {

using GlobalFn = Value (*)(Renderer&, CallArgs&);

class FunctionCallable : public Callable {
 public:
  FunctionCallable(std::string name, GlobalFn fn) : name_(std::move(name)), fn_(fn) {}
  Value call(Renderer& renderer, CallArgs& args) override { return fn_(renderer, args); }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  GlobalFn fn_;
};

Value range(Renderer& renderer, CallArgs& args) {
  if (!args.named.empty()) throw Error("range() takes no keyword arguments");
  auto as_int = [](const Value& v) {
    if (!v.is_int() && !v.is_bool()) {
      throw Error("'" + std::string(type_name(v)) + "' object cannot be interpreted as an integer");
    }
    return v.as_int();
  };
  int64_t start = 0, stop = 0, step = 1;
  switch (args.positional.size()) {
    case 1: stop = as_int(args.positional[0]); break;
    case 2: start = as_int(args.positional[0]); stop = as_int(args.positional[1]); break;
    case 3:
      start = as_int(args.positional[0]);
      stop = as_int(args.positional[1]);
      step = as_int(args.positional[2]);
      break;
    default: throw Error("range expected 1 to 3 arguments, got " + std::to_string(args.positional.size()));
  }
  if (step == 0) throw Error("range() arg 3 must not be zero");
  // Count in 128-bit arithmetic so extreme bounds cannot overflow.
  __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
  __int128 magnitude = step > 0 ? step : -static_cast<__int128>(step);
  __int128 count = span <= 0 ? 0 : (span + magnitude - 1) / magnitude;
  constexpr __int128 kMaxRange = 10'000'000;
  if (count > kMaxRange) throw Error("range() too large (more than 10000000 items)");
  renderer.budget().charge_steps(static_cast<uint64_t>(count));
  std::vector<Value> items;
  items.reserve(static_cast<size_t>(count));
  for (__int128 i = 0; i < count; ++i) items.push_back(Value::integer(static_cast<int64_t>(start + i * step)));
  return Value::list(std::move(items));
}

// dict(mapping_or_pairs, **kwargs) and namespace(...) share the filling rules.
Value fill_mapping(Value target, CallArgs& args, std::string_view callee) {
  if (args.positional.size() > 1) throw Error(std::string(callee) + "() takes at most 1 positional argument");
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      for (const auto& [key, value] : source.as_dict().entries()) target.as_dict().set(key, value);
    } else if (source.is_list()) {
      for (const Value& pair : source.as_list().items) {
        if (!pair.is_list() || pair.as_list().items.size() != 2) {
          throw Error(std::string(callee) + "(): sequence elements must be pairs");
        }
        const Value& key = pair.as_list().items[0];
        if (key.is_list() || key.is_dict()) throw Error("unhashable type: '" + std::string(type_name(key)) + "'");
        target.as_dict().set(to_str(key), pair.as_list().items[1]);
      }
    } else if (!source.is_undefined() && !source.is_none()) {
      throw Error(std::string(callee) + "(): cannot build from '" + std::string(type_name(source)) + "'");
    }
  }
  for (auto& [name, value] : args.named) target.as_dict().set(name, value);
  return target;
}

Value make_dict(Renderer&, CallArgs& args) { return fill_mapping(Value::dict(), args, "dict"); }

Value make_namespace(Renderer&, CallArgs& args) {
  return fill_mapping(Value::dict(DictData::Flavor::Namespace), args, "namespace");
}

Value raise_exception(Renderer&, CallArgs& args) {
  std::string message = args.positional.empty() ? std::string("raise_exception() called")
                                                : to_str(args.positional[0]);
  throw TemplateRaised(message);
}

Value strftime_now(Renderer& renderer, CallArgs& args) {
  BoundArgs a("strftime_now", args, {"format"});
  std::string format = a.string_or(0, "%Y-%m-%d");
  if (format.size() > 256) throw Error("strftime_now(): format too long");
  std::time_t now = renderer.now();
  std::tm local{};
  localtime_r(&now, &local);
  if (format.empty()) return Value::string("");
  // strftime returns 0 both on overflow and for an empty result; the
  // sentinel character tells them apart.
  std::string pattern = format + "\x01";
  std::string out(256 + format.size() * 32, '\0');
  size_t n = std::strftime(out.data(), out.size(), pattern.c_str(), &local);
  if (n == 0) throw Error("strftime_now(): result too long");
  out.resize(n - 1);
  return Value::string(std::move(out));
}

// joiner(sep): returns "" on its first call and sep afterwards.
class JoinerCallable : public Callable {
 public:
  explicit JoinerCallable(std::string sep) : sep_(std::move(sep)) {}
  Value call(Renderer&, CallArgs&) override {
    if (first_) {
      first_ = false;
      return Value::string("");
    }
    return Value::string(sep_);
  }
  std::string name() const override { return "joiner"; }

 private:
  std::string sep_;
  bool first_ = true;
};

Value make_joiner(Renderer&, CallArgs& args) {
  BoundArgs a("joiner", args, {"sep"});
  return Value::callable(std::make_shared<JoinerCallable>(a.string_or(0, ", ")));
}

const std::unordered_map<std::string_view, Value>& table() {
  static const std::unordered_map<std::string_view, Value> globals = [] {
    std::unordered_map<std::string_view, Value> map;
    auto add = [&](std::string_view name, GlobalFn fn) {
      map.emplace(name, Value::callable(std::make_shared<FunctionCallable>(std::string(name), fn)));
    };
    add("range", range);
    add("dict", make_dict);
    add("namespace", make_namespace);
    add("raise_exception", raise_exception);
    add("strftime_now", strftime_now);
    add("joiner", make_joiner);
    return map;
  }();
  return globals;
}

}  // namespace

const Value* find_global(std::string_view name) {
  const auto& globals = table();
  auto it = globals.find(name);
  return it == globals.end() ? nullptr : &it->second;
}

}  // namespace reprise::jinja
