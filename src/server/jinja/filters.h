// Jinja2 filters (`value | name(args)`), including HF's tojson override.
#pragma once
#include <string_view>

#include "server/jinja/value.h"

namespace reprise::jinja {

using FilterFn = Value (*)(Renderer& renderer, const Value& input, const CallArgs& args);

// The filter called `name`, or nullptr if there is none.
FilterFn find_filter(std::string_view name);

}  // namespace reprise::jinja
