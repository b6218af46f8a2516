#include "model/state_spec.h"

namespace reprise {

bool StateSpec::has_attention() const {
  for (const auto& l : layers)
    if (l.kind == LayerStateKind::Attention) return true;
  return false;
}

bool StateSpec::has_recurrent() const {
  for (const auto& l : layers)
    if (l.kind == LayerStateKind::Recurrent) return true;
  return false;
}

int64_t StateSpec::kv_floats_per_token() const {
  int64_t n = 0;
  for (const auto& l : layers)
    if (l.kind == LayerStateKind::Attention) n += l.key_floats() + l.value_floats();
  return n;
}

int64_t StateSpec::recurrent_floats() const {
  int64_t n = 0;
  for (const auto& l : layers)
    if (l.kind == LayerStateKind::Recurrent) n += l.conv_state_floats + l.ssm_state_floats;
  return n;
}

}  // namespace reprise
