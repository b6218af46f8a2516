#include "grammar/string_formats.h"

namespace reprise {

namespace {

#define REPRISE_DATE                                                                        \
  "[1-9]\\d{3}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|" \
  "02-(?:0[1-9]|1\\d|2[0-8]))"
#define REPRISE_TIME "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,6})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)"
#define REPRISE_LABEL "[A-Za-z0-9](?:[A-Za-z0-9-]{0,30}[A-Za-z0-9])?"
// The last label starts with a letter: URL parsers read an all-digit last
// label as an IPv4 address (and refuse it).
#define REPRISE_LAST_LABEL "[A-Za-z](?:[A-Za-z0-9-]{0,30}[A-Za-z0-9])?"
#define REPRISE_HOST "(?:" REPRISE_LABEL "\\.){0,6}" REPRISE_LAST_LABEL
#define REPRISE_BYTE "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"

struct Format {
  std::string_view name;
  const char* pattern;
};

constexpr Format kFormats[] = {
    {"date", "^" REPRISE_DATE "$"},
    {"time", "^" REPRISE_TIME "$"},
    {"date-time", "^" REPRISE_DATE "T" REPRISE_TIME "$"},
    {"uuid", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
    // A local part of at most 62 characters and 207 in all (the limits are 64 and 254).
    {"email", "^[A-Za-z0-9_+-]{1,20}(?:\\.[A-Za-z0-9_+-]{1,20}){0,2}@" REPRISE_LABEL "(?:\\." REPRISE_LABEL
              "){0,3}\\.[A-Za-z]{2,12}$"},
    {"hostname", "^" REPRISE_HOST "$"},
    {"ipv4", "^" REPRISE_BYTE "(?:\\." REPRISE_BYTE "){3}$"},
    {"uri", "^https?://" REPRISE_HOST "(?::[1-9]\\d{0,3})?(?:/[A-Za-z0-9._~!$&'()*+,;=:@-]*)*"
            "(?:\\?[A-Za-z0-9._~!$&'()*+,;=:@/?-]*)?$"},
};

#undef REPRISE_DATE
#undef REPRISE_TIME
#undef REPRISE_LABEL
#undef REPRISE_LAST_LABEL
#undef REPRISE_HOST
#undef REPRISE_BYTE

}  // namespace

const char* string_format_pattern(std::string_view format) {
  for (const Format& f : kFormats)
    if (f.name == format) return f.pattern;
  return nullptr;
}

}  // namespace reprise
