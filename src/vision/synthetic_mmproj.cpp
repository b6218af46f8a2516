#include "vision/synthetic_mmproj.h"

#include <cmath>
#include <vector>

#include "gguf/gguf_writer.h"
#include "util/error.h"

namespace reprise {

namespace {

uint64_t mix64(uint64_t z) {  // splitmix64 finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A reproducible stream per tensor: value i of tensor `name` under `seed`.
struct TensorNoise {
  uint64_t base;
  TensorNoise(uint64_t seed, const std::string& name) : base(mix64(seed)) {
    for (char c : name) base = mix64(base ^ static_cast<uint8_t>(c));
  }
  float symmetric(uint64_t i) const {  // uniform on [-1, 1)
    return static_cast<float>(static_cast<double>(mix64(base + i) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  }
};

std::vector<float> values(uint64_t seed, const std::string& name, uint64_t n, float center, float spread) {
  const TensorNoise noise(seed, name);
  std::vector<float> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = center + spread * noise.symmetric(i);
  return v;
}

}  // namespace

void make_synthetic_mmproj(const SyntheticMmprojSpec& s, const std::string& out_path) {
  if (s.image_size <= 0 || s.patch_size <= 0 || s.image_size % s.patch_size != 0)
    throw Error("synthetic mmproj: image_size must be a positive multiple of patch_size");
  const int64_t side = s.image_size / s.patch_size;
  if (s.pool <= 0 || side % s.pool != 0) throw Error("synthetic mmproj: pool must divide the patch grid");
  if (s.n_head <= 0 || s.n_embd % s.n_head != 0) throw Error("synthetic mmproj: n_embd must divide into heads");
  if (s.n_layer <= 0 || s.n_ff <= 0 || s.n_embd_out <= 0) throw Error("synthetic mmproj: empty dimension");
  const uint64_t D = s.n_embd, F = s.n_ff, P = s.patch_size, n_patches = side * side;

  gguf::Writer w;
  w.set_string("general.architecture", "clip");
  w.set_string("general.type", "clip-vision");
  w.set_string("general.name", "synthetic-mmproj");
  w.set_u32("clip.vision.projection_dim", static_cast<uint32_t>(s.n_embd_out));
  w.set_bool("clip.has_vision_encoder", true);
  w.set_u32("clip.vision.image_size", static_cast<uint32_t>(s.image_size));
  w.set_u32("clip.vision.patch_size", static_cast<uint32_t>(s.patch_size));
  w.set_u32("clip.vision.embedding_length", static_cast<uint32_t>(D));
  w.set_u32("clip.vision.feed_forward_length", static_cast<uint32_t>(F));
  w.set_u32("clip.vision.block_count", static_cast<uint32_t>(s.n_layer));
  w.set_u32("clip.vision.attention.head_count", static_cast<uint32_t>(s.n_head));
  const float half[3] = {0.5f, 0.5f, 0.5f};
  w.set("clip.vision.image_mean", gguf::MetaValue::array(std::span<const float>(half)));
  w.set("clip.vision.image_std", gguf::MetaValue::array(std::span<const float>(half)));
  w.set_string("clip.projector_type", "gemma3");
  w.set_f32("clip.vision.attention.layer_norm_epsilon", 1e-6f);
  w.set_bool("clip.use_gelu", true);
  w.set_u32("clip.vision.projector.scale_factor", static_cast<uint32_t>(s.pool));

  auto dense = [&](const std::string& name, std::vector<uint64_t> shape, DType type, float center, float spread) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    w.add_tensor_f32(name, std::move(shape), type, values(s.seed, name, n, center, spread));
  };
  const float proj_scale = 1.0f / std::sqrt(static_cast<float>(D));
  dense("mm.input_projection.weight", {static_cast<uint64_t>(s.n_embd_out), D}, DType::F16, 0.0f, 1.7f * proj_scale);
  dense("mm.soft_emb_norm.weight", {D}, DType::F32, 1.0f, 0.2f);
  dense("v.patch_embd.bias", {D}, DType::F32, 0.0f, 0.1f);
  dense("v.patch_embd.weight", {P, P, 3, D}, DType::F32, 0.0f, 1.7f / std::sqrt(static_cast<float>(3 * P * P)));
  dense("v.position_embd.weight", {D, n_patches}, DType::F32, 0.0f, 0.5f);
  const float in_scale = 1.7f / std::sqrt(static_cast<float>(D)), ff_scale = 1.7f / std::sqrt(static_cast<float>(F));
  for (int64_t il = 0; il < s.n_layer; ++il) {
    const std::string p = "v.blk." + std::to_string(il) + ".";
    dense(p + "ln1.bias", {D}, DType::F32, 0.0f, 0.1f);
    dense(p + "ln1.weight", {D}, DType::F32, 1.0f, 0.2f);
    dense(p + "ln2.bias", {D}, DType::F32, 0.0f, 0.1f);
    dense(p + "ln2.weight", {D}, DType::F32, 1.0f, 0.2f);
    dense(p + "ffn_up.bias", {F}, DType::F32, 0.0f, 0.1f);
    dense(p + "ffn_up.weight", {D, F}, s.dtype, 0.0f, in_scale);
    dense(p + "ffn_down.bias", {D}, DType::F32, 0.0f, 0.1f);
    dense(p + "ffn_down.weight", {F, D}, s.dtype, 0.0f, ff_scale);
    for (const char* t : {"attn_k", "attn_out", "attn_q", "attn_v"}) {
      dense(p + t + ".bias", {D}, DType::F32, 0.0f, 0.1f);
      dense(p + t + ".weight", {D, D}, s.dtype, 0.0f, in_scale);
    }
  }
  dense("v.post_ln.bias", {D}, DType::F32, 0.0f, 0.1f);
  dense("v.post_ln.weight", {D}, DType::F32, 1.0f, 0.2f);
  w.write(out_path);
}

}  // namespace reprise
