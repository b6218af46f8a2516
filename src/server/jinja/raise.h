// The exception raise_exception() throws inside a render. The renderer
// rethrows it with "template raised an exception: " before the template's own
// text, so the client sees e.g. "... Conversation roles must alternate
// user/assistant/...". It stays a distinct type because it means the template
// rejected the conversation (the server answers 400), while any other render
// failure is the template's own fault (500).
#pragma once
#include <string>

#include "util/error.h"

namespace reprise::jinja {

class TemplateRaised : public Error {
 public:
  explicit TemplateRaised(std::string message) : Error(message), message_(std::move(message)) {}
  TemplateRaised(const std::string& what, std::string message) : Error(what), message_(std::move(message)) {}
  const std::string& template_message() const { return message_; }

 private:
  std::string message_;
};

}  // namespace reprise::jinja
