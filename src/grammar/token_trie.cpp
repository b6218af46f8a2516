#include "grammar/token_trie.h"

#include <algorithm>

namespace reprise {

TokenTrie::TokenTrie(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {
  for (int32_t id = 0; id < static_cast<int32_t>(pieces_.size()); ++id)
    if (!pieces_[id].empty()) sorted_.push_back(id);
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) {
    return pieces_[a] != pieces_[b] ? pieces_[a] < pieces_[b] : a < b;
  });
  nodes_.emplace_back();
  build(kRoot, 0, static_cast<int32_t>(sorted_.size()), 0);
}

// `begin..end` are the sorted tokens whose pieces share their first `depth`
// bytes (the path to `node`). Iterative over children, recursive over depth
// (bounded by the longest piece).
void TokenTrie::build(int32_t node, int32_t begin, int32_t end, int32_t depth) {
  int32_t own_end = begin;
  while (own_end < end && static_cast<int32_t>(pieces_[sorted_[own_end]].size()) == depth) ++own_end;
  // Children are allocated together so that they are contiguous.
  struct Group {
    uint8_t byte;
    int32_t begin, end;
  };
  std::vector<Group> groups;
  for (int32_t i = own_end; i < end;) {
    const auto byte = static_cast<uint8_t>(pieces_[sorted_[i]][depth]);
    int32_t j = i;
    while (j < end && static_cast<uint8_t>(pieces_[sorted_[j]][depth]) == byte) ++j;
    groups.push_back({byte, i, j});
    i = j;
  }
  const auto first_child = static_cast<int32_t>(nodes_.size());
  nodes_.resize(nodes_.size() + groups.size());
  {
    Node& n = nodes_[node];
    n.child_begin = first_child;
    n.child_end = first_child + static_cast<int32_t>(groups.size());
    n.token_begin = begin;
    n.own_end = own_end;
    n.subtree_end = end;
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    nodes_[first_child + g].byte = groups[g].byte;
    build(first_child + static_cast<int32_t>(g), groups[g].begin, groups[g].end, depth + 1);
  }
}

}  // namespace reprise
