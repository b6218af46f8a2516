// Jinja2 tests (`value is name(args)`).
#pragma once
#include <string_view>

#include "server/jinja/value.h"

namespace reprise::jinja {

using TestFn = bool (*)(Renderer& renderer, const Value& input, const CallArgs& args);

// The test called `name`, or nullptr if there is none.
TestFn find_test(std::string_view name);

}  // namespace reprise::jinja
