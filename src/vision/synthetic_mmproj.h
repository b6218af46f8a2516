// Deterministic synthetic vision projectors (mmproj GGUF, `clip`
// architecture, gemma3 projector) so vision tests and benchmarks run without
// the ../shared fixtures. Same names, shapes and metadata keys as llama.cpp's
// converter writes (checked against mmproj-tinygemma3.gguf); weights are
// seeded pseudo-random values scaled to keep activations well-conditioned.
#pragma once
#include <cstdint>
#include <string>

#include "tensor/dtype.h"

namespace reprise {

struct SyntheticMmprojSpec {
  int64_t image_size = 32;
  int64_t patch_size = 2;
  int64_t n_embd = 128;      // ViT width
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t n_ff = 256;
  int64_t pool = 1;          // clip.vision.projector.scale_factor
  int64_t n_embd_out = 128;  // the text model's width
  DType dtype = DType::Q8_0; // ViT block matrices (the rest F32, projection F16)
  uint64_t seed = 1;
};

// Writes the projector to out_path. Throws reprise::Error for an inconsistent spec.
void make_synthetic_mmproj(const SyntheticMmprojSpec& spec, const std::string& out_path);

}  // namespace reprise
