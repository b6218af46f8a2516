// libFuzzer entry point for the GGUF reader (built only with -DREPRISE_FUZZ=ON
// and clang; see docs/fuzzing.md). Every input must either parse or raise
// reprise::Error; anything else (a crash, a sanitizer report, another
// exception type) is a bug. Parsed files are walked so that sanitizers see
// every view the reader hands out.
#include <cstddef>
#include <cstdint>
#include <span>

#include "gguf/gguf_file.h"
#include "util/error.h"

namespace {

uint64_t touch(const reprise::gguf::Value& v, std::string_view key) {
  uint64_t sum = v.str.size();
  for (std::string_view s : v.strings) sum += s.empty() ? 0 : static_cast<uint8_t>(s.back());
  for (const auto& inner : v.nested) sum += touch(inner, key);
  if (v.type == reprise::gguf::ValueType::ARRAY && v.elems) {
    try {
      for (float x : v.float_array(key)) sum += x != 0;
    } catch (const reprise::Error&) {
    }
  }
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<reprise::gguf::File> file;
  try {
    file = reprise::gguf::File::from_bytes(std::span<const uint8_t>(data, size), "fuzz-input");
  } catch (const reprise::Error&) {
    return 0;
  }
  uint64_t sum = 0;
  for (const auto& [key, value] : file->metadata()) sum += touch(value, key);
  for (const auto& t : file->tensors()) sum += t.data[0] + t.data[t.n_bytes - 1];
  volatile uint64_t keep = sum;
  (void)keep;
  return 0;
}
