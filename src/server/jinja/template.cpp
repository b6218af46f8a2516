#include "server/jinja/template.h"

#include "server/jinja/parser.h"
#include "server/jinja/renderer.h"
#include "util/error.h"

namespace reprise::jinja {

Template::Template(std::shared_ptr<const ast::Program> program) : program_(std::move(program)) {}

Template Template::parse(std::string_view source, const ParseOptions& options) {
  try {
    return Template(parse_program(source, options));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(std::string("template could not be parsed: ") + e.what());
  }
}

namespace {

template <typename Json>
std::string render_json(const ast::Program& program, const Json& context, const RenderOptions& options) {
  Value root;
  try {
    root = Value::from_json(context);
  } catch (const Error& e) {
    throw Error(std::string("template context could not be converted: ") + e.what());
  }
  if (!root.is_dict() && !context.is_null()) throw Error("template context must be a JSON object");
  return Renderer(program, options).render(root);
}

}  // namespace

std::string Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  return render_json(*program_, context, options);
}

std::string Template::render_plain(const nlohmann::json& context, const RenderOptions& options) const {
  return render_json(*program_, context, options);
}

const std::string& Template::source() const { return program_->source; }

}  // namespace reprise::jinja
