// BPE merge rules looked up by the token ids of the pair they join: a flat,
// open-addressed table (one probe sequence in one array), because a node-based
// map keyed by text spent most of byte-level BPE's time in its lookups.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace reprise::tok {

class MergeTable {
 public:
  struct Merge {
    int32_t rank = 0;     // the rule's position in tokenizer.ggml.merges
    int32_t merged = -1;  // the joined text's token id, or -1 (kNoToken) when none
  };

  // Room for `rules` rules without growing.
  void reserve(size_t rules);
  // Adds the rule joining `left` and `right`; the first rule for a pair wins.
  void insert(int32_t left, int32_t right, Merge merge);
  std::optional<Merge> find(int32_t left, int32_t right) const;
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t key_of(int32_t left, int32_t right) {
    return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
  }
  size_t slot_of(uint64_t key) const;
  void grow();

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace reprise::tok
