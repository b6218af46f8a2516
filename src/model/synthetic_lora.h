// Deterministic synthetic LoRA adapters for a model file, in llama.cpp's
// adapter GGUF form (model/lora_adapter.h): for tests, benchmarks and trying
// the server's adapters without a fine-tune.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace reprise {

struct SyntheticLoraSpec {
  int64_t rank = 8;
  float alpha = 16.0f;  // adapter.lora.alpha (0 writes none: factor 1)
  DType dtype = DType::F32;
  uint64_t seed = 1;
  // Which of each layer's matrices to adapt (GGUF roles).
  std::vector<std::string> targets = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
  // Layers to adapt; empty: every layer.
  std::vector<int64_t> layers;
  // Size of the delta B A (times alpha / rank) relative to a base matrix's
  // typical 1 / sqrt(n_in) entries.
  float strength = 0.5f;
};

// Writes an adapter for the model at base_path (its architecture, and the
// shapes of the targeted tensors it holds) to out_path. Throws
// reprise::Error when the base lacks a targeted tensor.
void make_synthetic_lora(const std::string& base_path, const SyntheticLoraSpec& spec, const std::string& out_path);

}  // namespace reprise
