// Shape- and type-checked access to a GGUF's tensors for model loaders.
#pragma once
#include <array>
#include <cstdint>
#include <future>
#include <string>
#include <unordered_set>
#include <vector>

#include "gguf/gguf_file.h"
#include "tensor/kernels.h"
#include "tensor/matrix.h"

namespace reprise {

// Every tensor a loader reads through it is recorded, so that a loader can
// refuse a file holding tensors it does not know (refuse_unknown_tensors):
// llama.cpp refuses such files too, and running without a tensor the file's
// author meant to be used (Llama 3.1's rope_freqs, a bias) gives wrong
// output with no error.
class WeightLoader {
 public:
  explicit WeightLoader(const gguf::File& file) : file_(file) {}

  // A [n_in, n_out] matrix in a supported dtype, used in place.
  MatrixView matrix(const std::string& name, int64_t n_in, int64_t n_out) const;
  bool has(const std::string& name) const { return file_.tensor(name) != nullptr; }
  // A 1-D tensor of n elements converted to f32 (norm weights, biases).
  std::vector<float> vector(const std::string& name, int64_t n) const;
  // Like vector() but empty when the tensor is absent.
  std::vector<float> optional_vector(const std::string& name, int64_t n) const;
  // Any tensor converted to f32 with its shape checked (ggml order).
  std::vector<float> dense(const std::string& name, const std::vector<int64_t>& shape) const;
  // A tensor the loader checks and reads itself (throws when absent).
  const gguf::TensorInfo& tensor(const std::string& name) const;

  // Throws (gguf::File::fail) naming the file's tensors that no call above
  // has read, if any. Call once a model is loaded.
  void refuse_unknown_tensors() const;

  const gguf::File& file() const { return file_; }

 private:
  const gguf::TensorInfo& checked(const std::string& name, const std::vector<int64_t>& shape) const;
  const gguf::File& file_;
  mutable std::unordered_set<std::string> read_;  // one loader per model load, on one thread
};

// Reads the token embedding (used in place, for row lookups), the output
// projection (output.weight, or the embedding when the two are tied),
// packed, and the final norm's weights, as every architecture keeps them;
// returns the vocabulary size.
int64_t load_embedding_and_head(const WeightLoader& w, int64_t n_embd, MatrixView& token_embd, PackedMatrix& output,
                                std::vector<float>& output_norm);

// Hash of the file's architecture metadata and all tensor bytes: the model's
// execution identity for cache namespaces.
std::array<uint64_t, 2> fingerprint_weights(const gguf::File& file, const std::string& layout_tag);
// The same hash on a thread of its own: a loader starts it before packing its
// weights and takes it at the end, so hashing every byte overlaps the
// packing (a load's time, docs/performance.md, Session 42). `file` must
// outlive the future.
std::future<std::array<uint64_t, 2>> fingerprint_weights_async(const gguf::File& file, std::string layout_tag);

}  // namespace reprise
