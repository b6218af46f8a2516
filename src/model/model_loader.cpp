#include "gguf/gguf_file.h"
#include "model/jamba.h"
#include "model/mamba.h"
#include "model/model.h"
#include "model/transformer.h"
#include "util/error.h"

namespace reprise {

std::unique_ptr<Model> load_model(const gguf::File& file) {
  const std::string arch = file.require_string("general.architecture");
  if (is_transformer_arch(arch)) return load_transformer(file);
  if (is_mamba_arch(arch)) return load_mamba(file);
  if (is_jamba_arch(arch)) return load_jamba(file);
  file.fail("unsupported architecture '" + arch +
            "' (supported: llama, qwen2, qwen3, gemma3, mamba, mamba2, jamba)");
}

}  // namespace reprise
