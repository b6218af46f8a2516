// Reading and writing one position's key in a SequenceMemory, whatever its
// key group (tensor/key_layout.h), for tests that compare or copy K/V state.
#pragma once
#include <cstdint>
#include <vector>

#include "model/sequence_memory.h"
#include "tensor/key_layout.h"

namespace reprise::test {

inline std::vector<uint16_t> stored_key(SequenceMemory& m, int layer, int64_t pos, int64_t head, int64_t d) {
  const int64_t group = m.key_group(layer);
  const uint16_t* start = m.key(layer, pos - pos % group) + head * m.kv_head_stride(layer);
  std::vector<uint16_t> key(d);
  for (int64_t i = 0; i < d; ++i) key[i] = start[key_element_offset(group, pos, i)];
  return key;
}

inline void set_stored_key(SequenceMemory& m, int layer, int64_t pos, int64_t head, const std::vector<uint16_t>& key) {
  const int64_t group = m.key_group(layer);
  uint16_t* start = m.key(layer, pos - pos % group) + head * m.kv_head_stride(layer);
  for (int64_t i = 0; i < static_cast<int64_t>(key.size()); ++i) start[key_element_offset(group, pos, i)] = key[i];
}

}  // namespace reprise::test
