// A Jinja2 interpreter for chat templates: the subset of Jinja2 that model
// chat templates (Hugging Face tokenizer_config.json / GGUF
// tokenizer.chat_template) actually use, with Python value semantics.
//
//   auto t = reprise::jinja::Template::parse(source);     // throws reprise::Error
//   std::string s = t.render({{"messages", msgs}});        // throws reprise::Error
//
// A Template is immutable after parsing and may be rendered from several
// threads at once. Rendering is bounded (output size, steps, recursion), so
// a hostile template yields reprise::Error, never a hang or a crash.
#pragma once
#include <nlohmann/json.hpp>

#include <concepts>
#include <memory>
#include <string>
#include <string_view>

#include "server/jinja/options.h"

namespace reprise::jinja {

namespace ast {
struct Program;
}

class Template {
 public:
  // Syntax errors name the line and column. Unknown filters and tests are
  // syntax errors, as in Jinja2.
  static Template parse(std::string_view source, const ParseOptions& options = {});

  // Top-level keys of `context` become template variables. ordered_json keeps
  // dict key order for tojson/items() (Python dicts are ordered); a plain
  // nlohmann::json is read directly (its keys arrive sorted). The second
  // overload is a constrained template so that `render({{"messages", m}})`
  // still picks the first, and so a plain json is not first copied through
  // nlohmann's recursive json -> ordered_json conversion, which can exhaust
  // the stack on hostile nesting.
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;
  template <typename Json>
    requires std::same_as<Json, nlohmann::json>
  std::string render(const Json& context, const RenderOptions& options = {}) const {
    return render_plain(context, options);
  }

  // The source after Jinja's newline normalization.
  const std::string& source() const;

 private:
  explicit Template(std::shared_ptr<const ast::Program> program);
  std::string render_plain(const nlohmann::json& context, const RenderOptions& options) const;
  std::shared_ptr<const ast::Program> program_;
};

}  // namespace reprise::jinja
