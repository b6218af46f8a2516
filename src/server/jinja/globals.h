// Global functions every template sees: range, dict, namespace, joiner,
// raise_exception (HF) and strftime_now (HF; uses the renderer's clock).
#pragma once
#include <string_view>

#include "server/jinja/value.h"

namespace reprise::jinja {

// The global called `name`, or nullptr.
const Value* find_global(std::string_view name);

}  // namespace reprise::jinja
