// Embeddings from a generative model's hidden states (POST /v1/embeddings):
// how a model pools its positions into one vector, and the vector's
// normalisation and encodings.
//
// A GGUF may declare its pooling (`<arch>.pooling_type`, as llama.cpp's
// converters write it for embedding models such as Qwen3-Embedding: 1 mean,
// 3 last). A model that declares none is pooled by its last position (the
// state that has read the whole input, as decoder embedding models use),
// unless the server is told otherwise. Last pooling reads the last
// position only, so a cached prefix serves it (all of the input but its
// last token can come from the cache); mean pooling reads every position's
// state, which the cache does not keep, so it computes the whole input.
// cls pooling (2) is refused: every architecture reprise runs is causal, so
// the first position's state is the same for every input that starts with
// BOS.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/openai_request.h"

namespace reprise {

namespace gguf { class File; }
class Tokenizer;

enum class Pooling { Mean, Last };

// "mean", "last"; nullopt for another name.
std::optional<Pooling> pooling_from_name(const std::string& name);
// The pooling `file` declares for architecture `arch`, `fallback` when it
// declares none (or "none"); an error for kinds a causal model cannot give
// (cls), that pool into no vector (rank), or that reprise does not know.
Parsed<Pooling> model_pooling(const gguf::File& file, const std::string& arch, Pooling fallback);

// An input's tokens: text tokenized as an embedding model expects it (BOS
// and EOS where the tokenizer's metadata adds them), token ids as given
// (checked against the vocabulary). An input longer than the context (it
// may fill it: nothing is generated) is an error naming `param`.
Parsed<std::vector<int32_t>> embedding_input(const Tokenizer& tokenizer, const CompletionPrompt& input, int64_t n_vocab,
                                             int64_t n_ctx, const std::string& param);

// One embedding from hidden states (n_embd floats per row) given a batch of
// rows at a time: the last row, or the average of all (summed as they come,
// so no row is kept). The result is cut to its first `dimensions` values
// when given, then scaled to unit length (a zero vector stays zero).
class EmbeddingPooler {
 public:
  EmbeddingPooler(int64_t n_embd, Pooling pooling) : width_(static_cast<size_t>(n_embd)), pooling_(pooling), sum_(width_) {}
  void add(std::span<const float> rows);
  std::vector<float> result(std::optional<int64_t> dimensions) const;

 private:
  size_t width_;
  Pooling pooling_;
  std::vector<double> sum_;  // mean: the rows' sum; last: the last row
  int64_t rows_ = 0;
};

// The values as little-endian float32 bytes, base64-encoded (OpenAI's
// encoding_format "base64").
std::string base64_floats(std::span<const float> values);

}  // namespace reprise
