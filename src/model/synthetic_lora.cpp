#include "model/synthetic_lora.h"

#include <cmath>
#include <random>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "util/error.h"

namespace reprise {

void make_synthetic_lora(const std::string& base_path, const SyntheticLoraSpec& spec, const std::string& out_path) {
  if (spec.rank <= 0 || spec.rank > 4096) throw Error("LoRA rank must be in 1..4096");
  if (!std::isfinite(spec.alpha) || !std::isfinite(spec.strength)) throw Error("alpha and strength must be finite");
  const auto base = gguf::File::open(base_path);
  const std::string arch = base->require_string("general.architecture");
  const int64_t n_layer = base->require_int(arch + ".block_count");
  std::vector<int64_t> layers = spec.layers;
  if (layers.empty())
    for (int64_t il = 0; il < n_layer; ++il) layers.push_back(il);

  gguf::Writer w;
  w.set_string("general.architecture", arch);
  w.set_string("general.type", "adapter");
  w.set_string("general.name", "synthetic-lora");
  w.set_string("adapter.type", "lora");
  if (spec.alpha != 0.0f) w.set_f32("adapter.lora.alpha", spec.alpha);
  const float factor = spec.alpha != 0.0f ? spec.alpha / static_cast<float>(spec.rank) : 1.0f;
  std::mt19937_64 rng(spec.seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int64_t il : layers) {
    if (il < 0 || il >= n_layer) throw Error("layer " + std::to_string(il) + " is not in the model");
    for (const std::string& role : spec.targets) {
      const std::string name = "blk." + std::to_string(il) + "." + role + ".weight";
      const gguf::TensorInfo* t = base->tensor(name);
      if (!t || t->shape.size() != 2) throw Error(base_path + " has no matrix '" + name + "'");
      const auto n_in = static_cast<int64_t>(t->shape[0]), n_out = static_cast<int64_t>(t->shape[1]);
      // Standard deviations: A's entries 1 / sqrt(n_in), B's chosen so that
      // factor * B A has entries of strength / sqrt(n_in) (uniform values
      // times sqrt(3) have unit deviation).
      const float sigma_a = 1.0f / std::sqrt(static_cast<float>(n_in));
      const float sigma_b = spec.strength / (factor * std::sqrt(static_cast<float>(spec.rank)));
      std::vector<float> a(static_cast<size_t>(n_in * spec.rank)), b(static_cast<size_t>(spec.rank * n_out));
      for (float& v : a) v = unit(rng) * std::sqrt(3.0f) * sigma_a;
      for (float& v : b) v = unit(rng) * std::sqrt(3.0f) * sigma_b;
      w.add_tensor_f32(name + ".lora_a", {static_cast<uint64_t>(n_in), static_cast<uint64_t>(spec.rank)}, spec.dtype,
                       std::move(a));
      w.add_tensor_f32(name + ".lora_b", {static_cast<uint64_t>(spec.rank), static_cast<uint64_t>(n_out)},
                       spec.dtype, std::move(b));
    }
  }
  w.write(out_path);
}

}  // namespace reprise
