// A LoRA adapter in llama.cpp's GGUF form (general.type "adapter",
// adapter.type "lora"): for a base matrix W (GGUF name "blk.N.attn_q.weight"),
// the tensors "<name>.lora_a" (ggml shape [n_in, rank]) and "<name>.lora_b"
// ([rank, n_out]). A product with the adapter at a request's `scale` is
//   y = W x + scale * alpha / rank * B (A x)
// (alpha from adapter.lora.alpha; without it, or 0, the factor is `scale`
// alone), as llama.cpp computes it. The adapter's matrices are packed for the
// kernels in their file's dtype, so its products follow the kernels'
// determinism contract: a row's delta never depends on the batch.
//
// The adapter knows nothing of architectures: a model checks that it can
// apply an adapter (Model::check_adapter) and applies the pairs it finds by
// its own tensors' names.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensor/kernels.h"

namespace reprise {

namespace gguf { class File; }

// One adapted matrix: A maps n_in to rank, B maps rank to n_out.
struct LoraPair {
  PackedMatrix a;
  PackedMatrix b;
  float factor = 1.0f;  // alpha / rank, or 1 without alpha
  int64_t rank() const { return a.n_out(); }
};

class LoraAdapter {
 public:
  // Opens, validates and packs the adapter at `path`; throws reprise::Error
  // naming the file and the problem (not an adapter, unknown tensors, a pair
  // whose shapes do not chain, an unsupported dtype).
  static std::shared_ptr<const LoraAdapter> load(const std::string& path);
  // The same from an opened file (tests, fuzzing); the adapter keeps it.
  static std::shared_ptr<const LoraAdapter> from_file(std::unique_ptr<gguf::File> file);

  // Made by load()/from_file() only (the key is theirs).
  class Key {
    friend class LoraAdapter;
    Key() = default;
  };
  explicit LoraAdapter(Key);
  ~LoraAdapter();

  // The pair adapting the base tensor `name` ("blk.0.attn_q.weight"), or null.
  const LoraPair* find(const std::string& name) const;
  const std::map<std::string, LoraPair>& pairs() const { return pairs_; }
  const std::string& architecture() const { return arch_; }
  float alpha() const { return alpha_; }
  const std::string& path() const { return path_; }
  uint64_t file_bytes() const { return file_bytes_; }
  // The memory its packed matrices take (at least a few tens of KB a
  // matrix, however small its file: what a memory budget counts).
  uint64_t packed_bytes() const { return packed_bytes_; }
  // Hash of alpha's bits and every tensor's name, shape, type and bytes: the
  // adapter's identity in cache namespaces (32 hex digits).
  const std::string& fingerprint_hex() const { return fingerprint_hex_; }

 private:
  std::unique_ptr<gguf::File> file_;  // the packed pairs' views point into it
  std::string path_, arch_, fingerprint_hex_;
  float alpha_ = 0;
  uint64_t file_bytes_ = 0, packed_bytes_ = 0;
  std::map<std::string, LoraPair> pairs_;
};

// The largest scale requests may give an adapter (either sign).
constexpr float kLoraScaleLimit = 100.0f;

// An adapter a sequence runs with, at the request's scale.
struct LoraUse {
  std::shared_ptr<const LoraAdapter> adapter;
  float scale = 1.0f;
};

// The cache namespace component of a sequence's adapters: their
// fingerprints and exact scales, in order ("" without adapters), so that
// state computed under other adapters or scales never matches.
std::string lora_identity(const std::vector<LoraUse>& loras);

}  // namespace reprise
