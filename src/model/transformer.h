// Dense decoder-only transformers: llama, qwen2, qwen3, gemma3 (text).
//
// They share one forward pass; the differences are data (ArchTraits): RoPE
// style, q/k/v biases, per-head q/k norms, gemma's embedding scale, post-norms,
// GELU gating and sliding-window layers.
#pragma once
#include <memory>

#include "model/model.h"

namespace reprise {

bool is_transformer_arch(const std::string& arch);
std::unique_ptr<Model> load_transformer(const gguf::File& file);

}  // namespace reprise
