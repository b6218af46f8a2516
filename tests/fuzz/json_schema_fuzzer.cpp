// libFuzzer entry point for structured output (docs/fuzzing.md): the input
// is a JSON Schema, a NUL byte, then the bytes of a document. The schema
// must compile or be refused with reprise::Error; a compiled schema's
// matcher is fed the document, and then
//  * a document it accepts whole must parse and satisfy the schema;
//  * from any prefix it accepts, some byte must be allowed, or the prefix
//    must be a whole document (no dead ends).
// Anything else aborts, so libFuzzer keeps the input.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "grammar/json_matcher.h"
#include "grammar/json_schema.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  if (split == std::string_view::npos) return 0;
  const nlohmann::json schema_json = nlohmann::json::parse(input.substr(0, split), nullptr, false);
  if (schema_json.is_discarded()) return 0;
  std::shared_ptr<const reprise::JsonSchema> schema;
  try {
    schema = reprise::JsonSchema::compile(schema_json);
  } catch (const reprise::Error&) {
    return 0;
  }
  reprise::JsonMatcher matcher(schema);
  const std::string_view doc = input.substr(split + 1);
  size_t accepted = 0;
  for (; accepted < doc.size(); ++accepted)
    if (!matcher.advance(doc.substr(accepted, 1))) break;
  if (accepted == doc.size() && matcher.can_end()) {
    const nlohmann::json parsed = nlohmann::json::parse(doc, nullptr, false);
    if (parsed.is_discarded() || !schema->validates(parsed)) {
      std::fprintf(stderr, "accepted an invalid document\n");
      std::abort();
    }
  }
  if (!matcher.can_end()) {
    for (int c = 0; c < 256; ++c) {
      reprise::JsonMatcher probe = matcher;
      if (probe.advance(std::string(1, static_cast<char>(c)))) return 0;
    }
    std::fprintf(stderr, "dead end\n");
    std::abort();
  }
  return 0;
}
