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
  // Called before a forward pass over positions [first_write, end): makes
  // [0, end) readable and [first_write, end) writable (allocating, or copying
  // shared storage on write, as the implementation needs).
  virtual void prepare(int64_t first_write, int64_t end) = 0;
  // Attention state is IEEE half precision (what llama.cpp's default KV
  // cache holds, and half the bytes of f32 for the same cached prefix).
  // Values are rows: KV head j's value of position pos starts at
  // value(layer, pos) + j * kv_head_stride(layer). Keys are stored
  // transposed in groups of key_group(layer) positions (tensor/key_layout.h):
  // KV head j's group of positions g .. g + key_group - 1 (g a multiple of
  // key_group) starts at key(layer, g) + j * kv_head_stride(layer). One
  // head's state of consecutive positions is adjacent, so decode attention,
  // which reads one head at a time, streams it.
  virtual uint16_t* key(int layer, int64_t pos) = 0;
  virtual uint16_t* value(int layer, int64_t pos) = 0;
  // Valid until the next prepare(); the same for keys and values.
  virtual int64_t kv_head_stride(int layer) const = 0;
  // A power of two, at most kKeyGroup.
  virtual int64_t key_group(int layer) const = 0;
  // Bulk form for attention: keys[i] = key(layer, first + i) and values[i] =
  // value(layer, first + i) for positions [first, end). Implementations
  // override it to avoid a virtual call per position.
  virtual void kv_rows(int layer, int64_t first, int64_t end, const uint16_t** keys, const uint16_t** values) {
    for (int64_t p = first; p < end; ++p) {
      keys[p - first] = key(layer, p);
      values[p - first] = value(layer, p);
    }
  }
  // Recurrent layers: the state after the last processed position.
  virtual float* conv_state(int layer) { return nullptr; }
  virtual float* ssm_state(int layer) { return nullptr; }
};

}  // namespace reprise
