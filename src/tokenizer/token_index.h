// Token text -> id: a flat, open-addressed table over a copy of the texts in
// one buffer. The merging tokenizers look a candidate text up for every
// adjacent pair they consider, and a node-based map spent much of their time
// chasing pointers.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace reprise::tok {

class TokenIndex {
 public:
  // The texts' total bytes an index can hold (offsets are 32-bit); insert
  // throws std::length_error past it.
  static constexpr size_t kMaxTextBytes = UINT32_MAX;

  // Room for `tokens` texts without growing.
  void reserve(size_t tokens);
  // Adds `text` as token `id`; returns the id already holding it, if any
  // (and adds nothing then).
  std::optional<int32_t> insert(std::string_view text, int32_t id);
  std::optional<int32_t> find(std::string_view text) const;
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint32_t tag = 0;  // the hash's high bits: most mismatches end here
    int32_t id = -1;   // -1: empty
    uint32_t offset = 0;
    uint32_t length = 0;
  };
  size_t find_slot(std::string_view text, uint64_t hash) const;
  void rehash(size_t capacity);

  std::string texts_;  // every token's text, back to back
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace reprise::tok
