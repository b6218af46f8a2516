// The error every endpoint reports, in OpenAI's shape:
//   {"error": {"message", "type", "param", "code"}} with an HTTP status.
// Request handling returns these instead of throwing, so a bad request can
// never take the server down.
#pragma once
#include <optional>
#include <string>
#include <utility>

namespace reprise {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" serialises as null
  std::string code;   // "" serialises as null

  static ApiError invalid(std::string message, std::string param = {}, std::string code = {}) {
    return {400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
  }
  static ApiError server(std::string message, std::string code = {}) {
    return {500, std::move(message), "server_error", {}, std::move(code)};
  }
};

// A value or the ApiError that prevented it.
template <class T>
class Parsed {
 public:
  Parsed(T value) : value_(std::move(value)) {}
  Parsed(ApiError error) : error_(std::move(error)) {}

  bool ok() const { return value_.has_value(); }
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  const ApiError& error() const { return error_; }

 private:
  std::optional<T> value_;
  ApiError error_;
};

}  // namespace reprise
