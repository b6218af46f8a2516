#include "server/embeddings.h"

#include <cmath>
#include <cstring>

#include "gguf/gguf_file.h"
#include "tokenizer/tokenizer.h"

namespace reprise {

std::optional<Pooling> pooling_from_name(const std::string& name) {
  if (name == "mean") return Pooling::Mean;
  if (name == "cls") return Pooling::Cls;
  if (name == "last") return Pooling::Last;
  return std::nullopt;
}

const char* pooling_name(Pooling pooling) {
  switch (pooling) {
    case Pooling::Mean: return "mean";
    case Pooling::Cls: return "cls";
    case Pooling::Last: return "last";
  }
  return "last";
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
    case 2: return Pooling::Cls;
    case 3: return Pooling::Last;
    default:
      return ApiError::invalid("this model's pooling (" + std::to_string(*declared) +
                                   ", e.g. a reranker's) gives no embedding",
                               "model", "unsupported_model");
  }
}

std::vector<int32_t> embedding_tokens(const Tokenizer& tokenizer, std::vector<int32_t> tokens) {
  const int32_t bos = tokenizer.bos_id(), eos = tokenizer.eos_id();
  if (tokenizer.add_bos() && bos >= 0 && (tokens.empty() || tokens.front() != bos)) tokens.insert(tokens.begin(), bos);
  if (tokenizer.add_eos() && eos >= 0 && (tokens.empty() || tokens.back() != eos)) tokens.push_back(eos);
  return tokens;
}

std::vector<float> pool_embedding(std::span<const float> rows, int64_t n_embd, Pooling pooling,
                                  std::optional<int64_t> dimensions) {
  const size_t width = static_cast<size_t>(n_embd);
  const size_t n_rows = rows.size() / width;
  std::vector<double> sum(width, 0.0);
  if (n_rows > 0) {
    if (pooling == Pooling::Mean) {
      for (size_t r = 0; r < n_rows; ++r)
        for (size_t i = 0; i < width; ++i) sum[i] += rows[r * width + i];
      for (double& v : sum) v /= static_cast<double>(n_rows);
    } else {
      const size_t row = pooling == Pooling::Cls ? 0 : n_rows - 1;
      for (size_t i = 0; i < width; ++i) sum[i] = rows[row * width + i];
    }
  }
  if (dimensions && static_cast<size_t>(*dimensions) < width) sum.resize(static_cast<size_t>(*dimensions));
  double norm = 0;
  for (double v : sum) norm += v * v;
  norm = std::sqrt(norm);
  std::vector<float> out(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) out[i] = static_cast<float>(norm > 0 ? sum[i] / norm : 0.0);
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
