// JSON Schema string formats that structured output enforces, as patterns
// (RegexDfa syntax). Each pattern allows a subset of the format's valid
// strings, chosen so that what a model writes also parses in the common
// client libraries (Python 3.11's datetime and uuid, Pydantic, ajv-formats):
//   date        YYYY-MM-DD, years 1000-9999, days within their month
//               (February to the 28th)
//   time        hh:mm:ss, up to 6 fraction digits, then Z or +hh:mm/-hh:mm
//   date-time   date, 'T', time
//   uuid        8-4-4-4-12 lowercase hex digits
//   email       up to 3 dot-separated runs of up to 20 letters, digits,
//               _ + -, '@', 1-4 labels and a top-level name of 2-12 letters
//               (within email's 64 and 254 character limits)
//   hostname    up to 7 dot-separated labels of up to 32 letters, digits
//               and inner hyphens, the last starting with a letter
//   ipv4        four decimal bytes without leading zeros
//   uri         http or https, a host name, an optional port, path and query
//               of unreserved characters
// Other formats are annotations, as JSON Schema makes them by default.
#pragma once
#include <string_view>

namespace reprise {

// The pattern enforcing `format`, or null when the format is not enforced.
const char* string_format_pattern(std::string_view format);

}  // namespace reprise
