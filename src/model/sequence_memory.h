// The per-sequence state a model reads and writes during a forward pass.
//
// The model addresses attention state by (layer, position) and recurrent state
// by layer; the implementation (a flat buffer, or paged cache blocks shared
// between sequences) is the cache's business. A forward pass over positions
// [p0, p1) may read rows for positions < p1 and writes rows for [p0, p1).
#pragma once
#include <cstdint>

namespace reprise {

class SequenceMemory {
 public:
  virtual ~SequenceMemory() = default;
  // Makes positions [0, n_positions) addressable (allocating as needed).
  // Throws reprise::Error when the budget cannot hold them.
  virtual void reserve(int64_t n_positions) = 0;
  // Attention rows are IEEE half precision (what llama.cpp's default KV cache
  // holds, and half the bytes of f32 for the same cached prefix).
  virtual uint16_t* key(int layer, int64_t pos) = 0;
  virtual uint16_t* value(int layer, int64_t pos) = 0;
  // Recurrent layers: the state after the last processed position.
  virtual float* conv_state(int layer) { return nullptr; }
  virtual float* ssm_state(int layer) { return nullptr; }
};

}  // namespace reprise
