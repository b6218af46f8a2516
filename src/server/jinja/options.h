// Knobs for parsing and rendering a template. Defaults are what Hugging Face
// transformers (and llama.cpp) use for chat templates.
#pragma once
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <functional>

namespace reprise::jinja {

struct ParseOptions {
  // HF's apply_chat_template sets trim_blocks and lstrip_blocks; plain Jinja2
  // defaults both to false. keep_trailing_newline=false drops one final
  // newline of the source, as Jinja2 does.
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

struct RenderOptions {
  // Clock for strftime_now(); empty means the system clock. Tests fix it.
  std::function<std::time_t()> now;
  // Limits that turn a hostile or buggy template into reprise::Error instead
  // of a hang or memory exhaustion.
  size_t max_output_bytes = 16u << 20;
  // Evaluated statements/expressions + loop iterations + calls + values
  // traversed. Real chat templates need well under 1% of this; at the limit
  // a render has spent on the order of a second.
  uint64_t max_steps = 5'000'000;
  int max_recursion_depth = 200;   // nested macro calls
};

}  // namespace reprise::jinja
