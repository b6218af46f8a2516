// Binds call arguments to a fixed parameter list the way Python does
// (positional first, then by keyword), so builtins read arguments by index
// and unexpected or surplus arguments raise a clear reprise::Error.
#pragma once
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "server/jinja/value.h"

namespace reprise::jinja {

class BoundArgs {
 public:
  BoundArgs(std::string_view callee, const CallArgs& args, std::initializer_list<std::string_view> params);

  // The argument for parameter i, or Undefined when it was not passed.
  const Value& operator[](size_t i) const { return values_[i]; }
  bool given(size_t i) const { return !values_[i].is_undefined(); }
  // Typed accessors with defaults; they throw naming the callee on a type mismatch.
  std::string string_or(size_t i, std::string_view fallback) const;
  int64_t int_or(size_t i, int64_t fallback) const;
  bool bool_or(size_t i, bool fallback) const;

 private:
  std::string callee_;
  std::vector<std::string_view> names_;
  std::vector<Value> values_;
};

}  // namespace reprise::jinja
