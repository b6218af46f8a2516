// The one exception type reprise throws for bad input or unsupported features.
// Callers at process or request boundaries catch it and report what() verbatim.
#pragma once
#include <stdexcept>
#include <string>

namespace reprise {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace reprise
