// Attribute, item and slice access plus the Python methods of str, list and
// dict, following Jinja2's rules: `obj.name` tries a Python attribute (so
// `d.items` is the method) and then the item; `obj[key]` tries the item and
// then the attribute. Anything missing is Undefined, never an error.
#pragma once
#include <string_view>

#include "server/jinja/value.h"

namespace reprise::jinja {

Value get_attribute(const Value& object, std::string_view name);
Value get_item(const Value& object, const Value& key);
// Python slicing of lists, tuples and strings; null parts are None/Undefined.
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// If `object` has a method `name`, calls it and returns true.
bool call_method(Renderer& renderer, const Value& object, std::string_view name, const CallArgs& args,
                 Value& result);

}  // namespace reprise::jinja
