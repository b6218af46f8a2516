#include "tokenizer/token_index.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <stdexcept>

namespace reprise::tok {
namespace {

uint64_t hash_of(std::string_view text) { return XXH3_64bits(text.data(), text.size()); }

}  // namespace

void TokenIndex::reserve(size_t tokens) {
  // At most half full: short probe sequences.
  const size_t capacity = std::bit_ceil(std::max<size_t>(16, 2 * tokens));
  if (capacity > slots_.size()) rehash(capacity);
}

void TokenIndex::rehash(size_t capacity) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  for (const Slot& s : old) {
    if (s.id < 0) continue;
    const std::string_view text(texts_.data() + s.offset, s.length);
    slots_[find_slot(text, hash_of(text))] = s;
  }
}

size_t TokenIndex::find_slot(std::string_view text, uint64_t hash) const {
  const size_t mask = slots_.size() - 1;
  const auto tag = static_cast<uint32_t>(hash >> 32);
  for (size_t i = static_cast<size_t>(hash) & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.id < 0) return i;
    if (s.tag == tag && s.length == text.size() && std::string_view(texts_.data() + s.offset, s.length) == text)
      return i;
  }
}

std::optional<int32_t> TokenIndex::insert(std::string_view text, int32_t id) {
  if (2 * (size_ + 1) > slots_.size()) rehash(std::max<size_t>(16, 2 * slots_.size()));
  const uint64_t hash = hash_of(text);
  Slot& slot = slots_[find_slot(text, hash)];
  if (slot.id >= 0) return slot.id;
  if (texts_.size() + text.size() > kMaxTextBytes) throw std::length_error("TokenIndex: texts exceed 4 GiB");
  slot.tag = static_cast<uint32_t>(hash >> 32);
  slot.id = id;
  slot.offset = static_cast<uint32_t>(texts_.size());
  slot.length = static_cast<uint32_t>(text.size());
  texts_.append(text);
  ++size_;
  return std::nullopt;
}

std::optional<int32_t> TokenIndex::find(std::string_view text) const {
  if (slots_.empty()) return std::nullopt;
  const Slot& slot = slots_[find_slot(text, hash_of(text))];
  if (slot.id < 0) return std::nullopt;
  return slot.id;
}

}  // namespace reprise::tok
