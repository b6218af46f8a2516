#include "engine/flat_memory.h"

#include <algorithm>

#include "tensor/key_layout.h"

namespace reprise {

FlatMemory::FlatMemory(const StateSpec& spec) : spec_(spec) {
  const size_t n = spec.layers.size();
  keys_.resize(n);
  values_.resize(n);
  conv_.resize(n);
  ssm_.resize(n);
  clear();
}

void FlatMemory::clear() {
  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    const auto& s = spec_.layers[l];
    if (s.kind == LayerStateKind::Recurrent) {
      conv_[l].assign(s.conv_state_floats, 0.0f);
      ssm_[l].assign(s.ssm_state_floats, 0.0f);
    }
  }
}

void FlatMemory::prepare(int64_t /*first_write*/, int64_t n_positions) {
  if (n_positions <= capacity_) return;
  // A multiple of the key group, so every group is whole.
  const int64_t grown = (std::max(n_positions, capacity_ * 2) + kKeyGroup - 1) / kKeyGroup * kKeyGroup;
  // Per layer [head][position][head_dim]: each head's rows move to their
  // place in the larger buffer.
  auto regrow = [&](std::vector<uint16_t>& rows, int64_t n_heads, int64_t head_dim) {
    std::vector<uint16_t> wider(static_cast<size_t>(n_heads * grown * head_dim));
    for (int64_t j = 0; j < n_heads && capacity_ > 0; ++j)
      std::copy_n(rows.begin() + j * capacity_ * head_dim, capacity_ * head_dim,
                  wider.begin() + j * grown * head_dim);
    rows.swap(wider);
  };
  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    const auto& s = spec_.layers[l];
    if (s.kind != LayerStateKind::Attention) continue;
    regrow(keys_[l], s.n_kv_heads, s.head_dim_k);
    regrow(values_[l], s.n_kv_heads, s.head_dim_v);
  }
  capacity_ = grown;
}

int64_t FlatMemory::kv_head_stride(int layer) const { return capacity_ * spec_.layers[layer].head_dim_k; }
int64_t FlatMemory::key_group(int /*layer*/) const { return kKeyGroup; }

uint16_t* FlatMemory::key(int layer, int64_t pos) {
  return keys_[layer].data() + pos * spec_.layers[layer].head_dim_k;
}
uint16_t* FlatMemory::value(int layer, int64_t pos) {
  return values_[layer].data() + pos * spec_.layers[layer].head_dim_v;
}
void FlatMemory::kv_rows(int layer, int64_t first, int64_t end, const uint16_t** keys, const uint16_t** values) {
  const int64_t ks = spec_.layers[layer].head_dim_k, vs = spec_.layers[layer].head_dim_v;
  const uint16_t* k = keys_[layer].data() + first * ks;
  const uint16_t* v = values_[layer].data() + first * vs;
  for (int64_t i = 0; i < end - first; ++i) {
    keys[i] = k + i * ks;
    values[i] = v + i * vs;
  }
}
float* FlatMemory::conv_state(int layer) { return conv_[layer].data(); }
float* FlatMemory::ssm_state(int layer) { return ssm_[layer].data(); }

}  // namespace reprise
