#include "server/embeddings.h"

#include <cmath>
#include <cstring>

#include "gguf/gguf_file.h"
#include "server/prompt_builder.h"
#include "tokenizer/tokenizer.h"

namespace reprise {

std::optional<Pooling> pooling_from_name(const std::string& name) {
  if (name == "mean") return Pooling::Mean;
  if (name == "last") return Pooling::Last;
  return std::nullopt;
}


Parsed<Pooling> model_pooling(const gguf::File& file, const std::string& arch, Pooling fallback) {
  std::optional<int64_t> declared;
  try {
    declared = file.get_int(arch + ".pooling_type");
  } catch (const std::exception& e) {
    return ApiError::server(std::string("the model's pooling_type is malformed: ") + e.what(), "unsupported_model");
  }
  // llama.cpp's values: -1 unspecified, 0 none, 1 mean, 2 cls, 3 last, 4 rank.
  if (!declared || *declared == -1 || *declared == 0) return fallback;
  switch (*declared) {
    case 1: return Pooling::Mean;
    case 3: return Pooling::Last;
    case 2:
      return ApiError::invalid("this model declares cls pooling, which needs a bidirectional encoder; '" + arch +
                                   "' is causal (its first position's state does not depend on the input)",
                               "model", "unsupported_model");
    default:
      return ApiError::invalid("this model's pooling (" + std::to_string(*declared) +
                                   ", e.g. a reranker's) gives no embedding",
                               "model", "unsupported_model");
  }
}

Parsed<std::vector<int32_t>> embedding_input(const Tokenizer& tokenizer, const CompletionPrompt& input, int64_t n_vocab,
                                             int64_t n_ctx, const std::string& param) {
  std::vector<int32_t> tokens = input.tokens;
  if (input.is_tokens) {
    for (int32_t id : tokens)
      if (id < 0 || id >= n_vocab)
        return ApiError::invalid(param + " holds token id " + std::to_string(id) + ", outside the vocabulary of " +
                                     std::to_string(n_vocab) + " tokens",
                                 param);
  } else {
    try {
      tokens = tokenize_prompt(tokenizer, input.text);
    } catch (const std::exception& e) {
      return ApiError::invalid(std::string("cannot tokenize the input: ") + e.what(), param);
    }
    const int32_t eos = tokenizer.eos_id();
    if (tokenizer.add_eos() && eos >= 0 && (tokens.empty() || tokens.back() != eos)) tokens.push_back(eos);
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return ApiError::invalid(param + " is empty after tokenization", param);
  if (n > n_ctx)
    return ApiError::invalid("This model's maximum context length is " + std::to_string(n_ctx) +
                                 " tokens. However, " + param + " has " + std::to_string(n) + " tokens.",
                             param, "context_length_exceeded");
  return tokens;
}

void EmbeddingPooler::add(std::span<const float> rows) {
  const size_t n = rows.size() / width_;
  if (n == 0) return;
  if (pooling_ == Pooling::Last) {
    for (size_t i = 0; i < width_; ++i) sum_[i] = rows[(n - 1) * width_ + i];
  } else {
    for (size_t r = 0; r < n; ++r)
      for (size_t i = 0; i < width_; ++i) sum_[i] += rows[r * width_ + i];
  }
  rows_ += static_cast<int64_t>(n);
}

std::vector<float> EmbeddingPooler::result(std::optional<int64_t> dimensions) const {
  std::vector<double> v = sum_;
  if (pooling_ == Pooling::Mean && rows_ > 0)
    for (double& x : v) x /= static_cast<double>(rows_);
  if (dimensions && static_cast<size_t>(*dimensions) < width_) v.resize(static_cast<size_t>(*dimensions));
  double norm = 0;
  for (double x : v) norm += x * x;
  norm = std::sqrt(norm);
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(norm > 0 ? v[i] / norm : 0.0);
  return out;
}

std::string base64_floats(std::span<const float> values) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<uint8_t> bytes(values.size() * 4);
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits = 0;
    static_assert(sizeof(float) == sizeof(uint32_t));
    std::memcpy(&bits, &values[i], 4);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + b] = static_cast<uint8_t>(bits >> (8 * b));  // little-endian
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (bytes[i] << 16) | (bytes[i + 1] << 8) | bytes[i + 2];
    for (int k = 18; k >= 0; k -= 6) out += kAlphabet[(v >> k) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = bytes[i] << 16;
    if (i + 1 < bytes.size()) v |= bytes[i + 1] << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

}  // namespace reprise
