#include "server/jinja/args.h"

#include "util/error.h"

namespace reprise::jinja {

BoundArgs::BoundArgs(std::string_view callee, const CallArgs& args,
                     std::initializer_list<std::string_view> params)
    : callee_(callee), names_(params), values_(params.size()) {
  if (args.positional.size() > params.size()) {
    throw Error(callee_ + "() takes at most " + std::to_string(params.size()) + " argument(s) (" +
                std::to_string(args.positional.size()) + " given)");
  }
  for (size_t i = 0; i < args.positional.size(); ++i) values_[i] = args.positional[i];
  for (const auto& [name, value] : args.named) {
    size_t i = 0;
    while (i < names_.size() && names_[i] != name) ++i;
    if (i == names_.size()) throw Error(callee_ + "() got an unexpected keyword argument '" + name + "'");
    if (i < args.positional.size()) throw Error(callee_ + "() got multiple values for argument '" + name + "'");
    values_[i] = value;
  }
}

std::string BoundArgs::string_or(size_t i, std::string_view fallback) const {
  if (!given(i)) return std::string(fallback);
  if (!values_[i].is_string()) {
    throw Error(callee_ + "(): argument '" + std::string(names_[i]) + "' must be a string, not " +
                std::string(type_name(values_[i])));
  }
  return values_[i].as_string();
}

int64_t BoundArgs::int_or(size_t i, int64_t fallback) const {
  if (!given(i) || values_[i].is_none()) return fallback;
  if (!values_[i].is_int() && !values_[i].is_bool()) {
    throw Error(callee_ + "(): argument '" + std::string(names_[i]) + "' must be an integer, not " +
                std::string(type_name(values_[i])));
  }
  return values_[i].as_int();
}

bool BoundArgs::bool_or(size_t i, bool fallback) const {
  if (!given(i)) return fallback;
  return truthy(values_[i]);
}

}  // namespace reprise::jinja
