#include "gguf/gguf_file.h"
#include "model/jamba.h"
#include "model/mamba.h"
#include "model/model.h"
#include "model/transformer.h"
#include "tensor/kernels.h"
#include "util/error.h"

namespace reprise {

std::unique_ptr<Model> load_model(const gguf::File& file) {
  if (const auto shards = file.get_int("split.count"); shards && *shards > 1)
    file.fail("this is one shard of a GGUF split into " + std::to_string(*shards) +
              " files: merge them into one first (llama-gguf-split --merge FIRST-SHARD OUT.gguf)");
  if (file.get_string("general.type").value_or("") == "adapter")
    file.fail("this is an adapter, not a model: serve it with --lora NAME=PATH beside its base model");
  const std::string arch = file.require_string("general.architecture");
  if (is_transformer_arch(arch)) return load_transformer(file);
  if (is_mamba_arch(arch)) return load_mamba(file);
  if (is_jamba_arch(arch)) return load_jamba(file);
  file.fail("unsupported architecture '" + arch +
            "' (supported: llama, qwen2, qwen3, gemma3, mamba, mamba2, jamba)");
}

uint64_t packing_growth_bytes(const gguf::File& file) {
  uint64_t growth = 0;
  for (const auto& t : file.tensors()) {
    if (t.shape.size() != 2 || !dtype_supported(t.type)) continue;
    const uint64_t packed = packed_matrix_bytes(t.type, static_cast<int64_t>(t.shape[0]), static_cast<int64_t>(t.shape[1]));
    if (packed > t.n_bytes) growth += packed - t.n_bytes;
  }
  return growth;
}

}  // namespace reprise
