// Uncached per-sequence state in plain growable buffers: the "cold path" the
// cache is checked against, and what runs when caching is disabled.
#pragma once
#include <vector>

#include "model/sequence_memory.h"
#include "model/state_spec.h"

namespace reprise {

class FlatMemory final : public SequenceMemory {
 public:
  explicit FlatMemory(const StateSpec& spec);
  void prepare(int64_t first_write, int64_t end) override;
  uint16_t* key(int layer, int64_t pos) override;
  uint16_t* value(int layer, int64_t pos) override;
  void kv_rows(int layer, int64_t first, int64_t end, const uint16_t** keys, const uint16_t** values) override;
  // capacity() positions per head: heads move when prepare() grows the buffers.
  int64_t kv_head_stride(int layer) const override;
  // kKeyGroup: capacity() is a multiple of it.
  int64_t key_group(int layer) const override;
  float* conv_state(int layer) override;
  float* ssm_state(int layer) override;
  int64_t capacity() const { return capacity_; }
  // Forgets everything (recurrent state zeroed).
  void clear();

 private:
  const StateSpec& spec_;
  int64_t capacity_ = 0;
  std::vector<std::vector<uint16_t>> keys_, values_;
  std::vector<std::vector<float>> conv_, ssm_;
};

}  // namespace reprise
