// Reading untrusted request bodies (OpenAI's APIs and Anthropic's): typed
// field access that names the field in its errors, the body parse with its
// nesting limit, the guard that turns any failure into an ApiError, and the
// pieces the parsers of other APIs' requests (responses_request.cpp,
// messages_request.cpp) share with the chat parser. Nothing outside the
// request parsers should need it.
#pragma once
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <string_view>

#include "server/api_error.h"
#include "server/openai_request.h"

namespace reprise::request_fields {

using ordered_json = nlohmann::ordered_json;

// The fields a request in another API's shape (Responses, Messages) passes
// to the chat completion it is read as: those that mean the same there
// (OpenAI's sampling fields) and reprise's chat extensions.
inline constexpr const char* kChatPassThroughFields[] = {
    "model",          "stream",         "temperature",       "top_p",            "top_k",
    "min_p",          "seed",           "repeat_penalty",    "repeat_last_n",    "frequency_penalty",
    "presence_penalty", "logit_bias",   "cache_salt",        "ignore_eos",       "draft_max",
    "reasoning_format", "chat_template_kwargs", "lora"};

// Thrown by the parsers only; guarded() turns it into a Parsed.
struct RequestError {
  ApiError error;
};

[[noreturn]] inline void fail(std::string message, std::string param, std::string code = {}) {
  throw RequestError{ApiError::invalid(std::move(message), std::move(param), std::move(code))};
}

inline const char* type_name(const ordered_json& v) {
  switch (v.type()) {
    case ordered_json::value_t::null: return "null";
    case ordered_json::value_t::boolean: return "a boolean";
    case ordered_json::value_t::string: return "a string";
    case ordered_json::value_t::array: return "an array";
    case ordered_json::value_t::object: return "an object";
    default: return "a number";
  }
}

// Typed access to the fields of one JSON object, naming the field in errors.
class Fields {
 public:
  Fields(const ordered_json& object, std::string prefix = {}) : object_(object), prefix_(std::move(prefix)) {}

  // The field, or nullptr when absent or null.
  const ordered_json* get(const char* name) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::string param(const char* name) const { return prefix_ + name; }

  std::optional<bool> boolean(const char* name) const {
    const ordered_json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) fail(param(name) + " must be a boolean, not " + type_name(*v), param(name));
    return v->get<bool>();
  }

  std::optional<std::string> string(const char* name) const {
    const ordered_json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_string()) fail(param(name) + " must be a string, not " + type_name(*v), param(name));
    return v->get<std::string>();
  }

  std::optional<double> number(const char* name, double lo, double hi) const {
    const ordered_json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) fail(param(name) + " must be a number, not " + type_name(*v), param(name));
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi)
      fail(param(name) + " must be between " + format(lo) + " and " + format(hi), param(name));
    return d;
  }

  // Integers may be written as 3 or 3.0 (Python clients sometimes send floats).
  std::optional<int64_t> integer(const char* name, int64_t lo, int64_t hi) const {
    const ordered_json* v = get(name);
    if (!v) return std::nullopt;
    return integer_value(*v, param(name), lo, hi);
  }

  static int64_t integer_value(const ordered_json& v, const std::string& param, int64_t lo, int64_t hi) {
    int64_t out = 0;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) out_of_range(param, lo, hi);
      out = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      out = v.get<int64_t>();
    } else if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d)) fail(param + " must be an integer", param);
      if (d < -9.2e18 || d > 9.2e18) out_of_range(param, lo, hi);
      out = static_cast<int64_t>(d);
    } else {
      fail(param + " must be an integer, not " + type_name(v), param);
    }
    if (out < lo || out > hi) out_of_range(param, lo, hi);
    return out;
  }

 private:
  [[noreturn]] static void out_of_range(const std::string& param, int64_t lo, int64_t hi) {
    if (hi == std::numeric_limits<int64_t>::max()) fail(param + " must be an integer >= " + std::to_string(lo), param);
    fail(param + " must be an integer between " + std::to_string(lo) + " and " + std::to_string(hi), param);
  }
  static std::string format(double d) {
    std::string s = std::to_string(d);
    while (s.size() > 1 && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }

  const ordered_json& object_;
  std::string prefix_;
};

// The body as a JSON object, refused (RequestError) when it nests deeper
// than the limits allow, is not JSON, or is not an object.
ordered_json parse_body(std::string_view body, const RequestLimits& limits);

// A chat completion read from a parsed body (parse_chat_completion_request
// without the text parse): another API's request, rewritten in chat form,
// goes through the same checks. Throws RequestError.
ChatCompletionRequest read_chat_completion(const ordered_json& doc, const RequestLimits& limits);

// cache_salt: a tenant's namespace in the caches ("" when absent).
inline std::string read_cache_salt(const Fields& f, const RequestLimits& limits) {
  std::string salt = f.string("cache_salt").value_or("");
  if (salt.size() > limits.max_cache_salt_bytes)
    fail("cache_salt must be at most " + std::to_string(limits.max_cache_salt_bytes) + " bytes", "cache_salt");
  return salt;
}

// Copies each of `names` that `f` holds (and is not null) into `out`.
template <typename Names>
void copy_fields(const Fields& f, const Names& names, ordered_json& out) {
  for (const char* name : names)
    if (const ordered_json* v = f.get(name)) out[name] = *v;
}

// An error's field `from` (a prefix of its param; anywhere in its message)
// named `to`: a chat parser's finding told in another API's terms.
inline void rename_error_field(ApiError& error, const std::string& from, const std::string& to) {
  if (error.param.rfind(from, 0) == 0) error.param = to + error.param.substr(from.size());
  for (size_t at = 0; (at = error.message.find(from, at)) != std::string::npos; at += to.size())
    error.message.replace(at, from.size(), to);
}

// fn()'s Parsed, or the error anything it threw stands for. Never throws.
template <class T, class Fn>
Parsed<T> guarded(Fn&& fn) {
  try {
    return fn();
  } catch (const RequestError& e) {
    return e.error;
  } catch (const std::bad_alloc&) {
    return ApiError{413, "request is too large to process", "invalid_request_error", {}, {}};
  } catch (const std::exception& e) {
    return ApiError::invalid(std::string("invalid request: ") + e.what());
  } catch (...) {
    return ApiError::invalid("invalid request");
  }
}

}  // namespace reprise::request_fields
