// What per-sequence state an architecture needs, declared by the model and
// provided by the cache/engine. Models never decide how state is stored,
// shared or evicted; they only say what exists.
#pragma once
#include <cstdint>
#include <vector>

namespace reprise {

enum class LayerStateKind { Attention, Recurrent, None };

struct LayerStateSpec {
  LayerStateKind kind = LayerStateKind::None;
  // Attention: one key row and one value row per position.
  int n_kv_heads = 0;
  int head_dim_k = 0;
  int head_dim_v = 0;
  int window = 0;  // sliding window in positions; 0 = attends to all earlier positions
  // Recurrent: a fixed-size state that summarises all earlier positions.
  int64_t conv_state_floats = 0;
  int64_t ssm_state_floats = 0;

  int64_t key_floats() const { return int64_t(n_kv_heads) * head_dim_k; }
  int64_t value_floats() const { return int64_t(n_kv_heads) * head_dim_v; }
};

struct StateSpec {
  std::vector<LayerStateSpec> layers;

  bool has_attention() const;
  bool has_recurrent() const;
  // Floats of attention K+V per token, summed over attention layers.
  int64_t kv_floats_per_token() const;
  int64_t recurrent_floats() const;
};

}  // namespace reprise
