// Embeddings from a generative model's hidden states (POST /v1/embeddings):
// how a model pools its positions into one vector, and the vector's
// normalisation and encodings.
//
// A GGUF may declare its pooling (`<arch>.pooling_type`, as llama.cpp's
// converters write it for embedding models such as Qwen3-Embedding: 1 mean,
// 2 cls, 3 last). A model that declares none is pooled by its last position
// (the state that has read the whole input, as decoder embedding models
// use), unless the server is told otherwise. Last pooling reads the last
// position only, so a cached prefix serves it (all of the input but its
// last token can come from the cache); mean and cls pooling read states the
// cache does not keep (every position's, the first's), so they compute the
// whole input.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "server/api_error.h"

namespace reprise {

namespace gguf { class File; }
class Tokenizer;

enum class Pooling { Mean, Cls, Last };

// "mean", "cls", "last"; nullopt for another name.
std::optional<Pooling> pooling_from_name(const std::string& name);
const char* pooling_name(Pooling pooling);
// The pooling `file` declares for architecture `arch`, `fallback` when it
// declares none (or "none"); an error for kinds that pool into no vector
// (rank) or that reprise does not know.
Parsed<Pooling> model_pooling(const gguf::File& file, const std::string& arch, Pooling fallback);

// The input's tokens as an embedding model expects them: BOS and EOS (or
// SEP) where the tokenizer's metadata adds them.
std::vector<int32_t> embedding_tokens(const Tokenizer& tokenizer, std::vector<int32_t> tokens);

// One embedding from `rows` hidden states of n_embd floats (cls: the first
// row; last: the last; mean: their average), cut to its first `dimensions`
// values when given, then scaled to unit length (a zero vector stays zero).
std::vector<float> pool_embedding(std::span<const float> rows, int64_t n_embd, Pooling pooling,
                                  std::optional<int64_t> dimensions);

// The values as little-endian float32 bytes, base64-encoded (OpenAI's
// encoding_format "base64").
std::string base64_floats(std::span<const float> values);

}  // namespace reprise
