// The exception raise_exception() throws inside a render. The renderer turns
// it into a reprise::Error whose message is the template's own text, so the
// client sees e.g. "Conversation roles must alternate user/assistant/...".
#pragma once
#include <string>

#include "util/error.h"

namespace reprise::jinja {

class TemplateRaised : public Error {
 public:
  explicit TemplateRaised(std::string message) : Error(message), message_(std::move(message)) {}
  const std::string& template_message() const { return message_; }

 private:
  std::string message_;
};

}  // namespace reprise::jinja
