// Python-compatible text helpers for the Jinja interpreter.
//
// Python strings are sequences of code points, so len(), indexing, slicing
// and the str methods count code points, not UTF-8 bytes. Invalid UTF-8
// bytes are treated as one code point each so nothing ever throws here.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace reprise::jinja::text {

// Number of code points in s.
size_t length(std::string_view s);

// Byte offsets of every code point start, plus s.size() at the end.
std::vector<size_t> boundaries(std::string_view s);

// Decodes the code point starting at s[pos]; `consumed` gets its byte length.
char32_t decode(std::string_view s, size_t pos, size_t& consumed);
void append_utf8(std::string& out, char32_t cp);

// str.isspace() for one code point (Unicode whitespace as Python defines it).
bool is_space(char32_t cp);

// str.strip/lstrip/rstrip. chars == nullptr means "whitespace".
enum class Side { Left, Right, Both };
std::string strip(std::string_view s, Side side, const std::string* chars = nullptr);

// Case conversions. upper/lower use Unicode full case mapping (ß -> SS) as
// Python does; title/capitalize map code point by code point.
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);      // str.capitalize()
std::string python_title(std::string_view s);    // str.title()
std::string jinja_title(std::string_view s);     // the `title` filter

// str.split(sep=None, maxsplit=-1) and str.splitlines(keepends).
std::vector<std::string> split(std::string_view s, const std::string* sep, long long maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::string* sep, long long maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);

// Replaces up to `count` (negative = all) occurrences of `from`.
std::string replace(std::string_view s, std::string_view from, std::string_view to, long long count);

}  // namespace reprise::jinja::text
