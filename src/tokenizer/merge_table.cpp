#include "tokenizer/merge_table.h"

#include <algorithm>
#include <bit>

namespace reprise::tok {

void MergeTable::reserve(size_t rules) {
  // At most half full: short probe sequences.
  const size_t capacity = std::bit_ceil(std::max<size_t>(16, 2 * rules));
  if (capacity <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  size_ = 0;
  for (const Slot& s : old)
    if (s.key != kEmpty) insert(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key), s.merge);
}

void MergeTable::grow() { reserve(slots_.empty() ? 8 : slots_.size()); }

size_t MergeTable::slot_of(uint64_t key) const {
  // A multiplicative hash spreads the ids' low bits over the table.
  const size_t mask = slots_.size() - 1;
  size_t i = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
  while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask;
  return i;
}

void MergeTable::insert(int32_t left, int32_t right, Merge merge) {
  if (2 * (size_ + 1) > slots_.size()) grow();
  const uint64_t key = key_of(left, right);
  Slot& slot = slots_[slot_of(key)];
  if (slot.key == key) return;
  slot.key = key;
  slot.merge = merge;
  ++size_;
}

std::optional<MergeTable::Merge> MergeTable::find(int32_t left, int32_t right) const {
  if (slots_.empty()) return std::nullopt;
  const uint64_t key = key_of(left, right);
  const Slot& slot = slots_[slot_of(key)];
  if (slot.key != key) return std::nullopt;
  return slot.merge;
}

}  // namespace reprise::tok
