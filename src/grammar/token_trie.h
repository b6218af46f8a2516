// A vocabulary's token pieces (the bytes each token adds to the output) as a
// trie, so that a byte-level recognizer can be walked over every token at
// once, sharing the work for common prefixes and skipping whole subtrees at
// the first byte it refuses.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace reprise {

class TokenTrie {
 public:
  // pieces[id] is token id's bytes; tokens with an empty piece are left out
  // (control tokens: never produced under a constraint).
  explicit TokenTrie(std::vector<std::string> pieces);

  struct Node {
    int32_t child_begin = 0, child_end = 0;  // children: nodes [begin, end), by byte
    // Tokens in sorted order: [token_begin, own_end) end at this node,
    // [token_begin, subtree_end) end in its subtree.
    int32_t token_begin = 0, own_end = 0, subtree_end = 0;
    uint8_t byte = 0;  // the edge from the parent
  };
  static constexpr int32_t kRoot = 0;
  const Node& node(int32_t id) const { return nodes_[id]; }
  // Token ids ending at `node` / anywhere in its subtree.
  std::span<const int32_t> own_tokens(const Node& n) const {
    return {sorted_.data() + n.token_begin, static_cast<size_t>(n.own_end - n.token_begin)};
  }
  std::span<const int32_t> subtree_tokens(const Node& n) const {
    return {sorted_.data() + n.token_begin, static_cast<size_t>(n.subtree_end - n.token_begin)};
  }
  int32_t vocabulary_size() const { return static_cast<int32_t>(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_[id]; }
  size_t node_count() const { return nodes_.size(); }

 private:
  std::vector<std::string> pieces_;
  std::vector<int32_t> sorted_;  // non-empty pieces' ids, by piece
  std::vector<Node> nodes_;

  void build(int32_t node, int32_t begin, int32_t end, int32_t depth);
};

}  // namespace reprise
