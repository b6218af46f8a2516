// Python's textual formats, reproduced so templates print exactly what
// transformers/Jinja2 print: float repr, str repr, json.dumps string escaping,
// "%s" % x and "{}".format(x).
#pragma once
#include <string>
#include <string_view>

#include "server/jinja/value.h"

namespace reprise::jinja::format {

// repr(float): shortest round-trip digits, "1.0", "1e+16", "1e-05", "inf", "nan".
std::string float_repr(double d);

// repr(str): single quotes unless the text has ' but no ", escapes as Python.
std::string string_repr(std::string_view s);

// Appends s as a JSON string literal as json.dumps does; ensure_ascii
// escapes everything outside ASCII as \uXXXX (surrogate pairs above BMP).
void append_json_string(std::string& out, std::string_view s, bool ensure_ascii = false);

// The % operator on strings. `args` is a tuple for several values, a dict
// for %(name)s, or any single value.
std::string percent(std::string_view fmt, const Value& args);

// str.format(*positional, **named).
std::string brace(std::string_view fmt, const CallArgs& args);

}  // namespace reprise::jinja::format
