#include "grammar/json_constraint.h"

#include <algorithm>

namespace reprise {

namespace {

constexpr size_t kMaxRememberedStrings = 1024;

// The frames one step may change (JsonMatcher::step changes none below the
// top three), so a walk can undo a step without copying the stack.
struct StackTop {
  size_t size;
  int n;
  JsonFrame frames[3];

  explicit StackTop(const JsonStack& s) : size(s.size()), n(static_cast<int>(std::min<size_t>(3, s.size()))) {
    for (int i = 0; i < n; ++i) frames[i] = s[size - n + i];
  }
  void restore(JsonStack& s) const {
    s.resize(size);
    for (int i = 0; i < n; ++i) s[size - n + i] = frames[i];
  }
};

}  // namespace

std::shared_ptr<const JsonVocabulary::StringTokens> JsonVocabulary::string_tokens(const JsonMatcher& matcher,
                                                                                   const JsonStack& stack) {
  const JsonFrame& top = stack.back();
  // A string's next tokens depend on its escape and UTF-8 state and, when
  // its length is bounded, on its length and bounds; a free key's on its
  // UTF-8 state.
  const bool is_string = top.kind == JsonFrame::String;
  const bool bounded = is_string && matcher.schema().node(top.node).has_length_limits();
  const SchemaNode* limits = bounded ? &matcher.schema().node(top.node) : nullptr;
  const Key key{top.kind, top.escape, top.utf8_left, top.utf8_lo, top.utf8_hi, bounded ? top.count : 0,
                bounded ? limits->min_length : 0, bounded ? limits->max_length : -1};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = strings_.find(key); it != strings_.end()) return it->second;
  }
  auto result = std::make_shared<StringTokens>();
  result->inside.assign(trie_.vocabulary_size(), 0);
  // A probe: the text's frame alone in a document; a byte that closes the
  // text pops the string or moves the key's object on.
  JsonStack probe{JsonFrame{}, top};
  std::vector<JsonStack> forks;
  auto walk = [&](auto& self, int32_t trie_node, const JsonStack& at) -> void {
    const TokenTrie::Node& n = trie_.node(trie_node);
    for (int32_t c = n.child_begin; c < n.child_end; ++c) {
      const TokenTrie::Node& child = trie_.node(c);
      JsonStack next = at;
      forks.clear();
      if (!matcher.step(next, child.byte, forks)) continue;
      if (next.size() < 2 || !JsonMatcher::in_free_text(next.back())) {
        const auto tokens = trie_.subtree_tokens(child);
        result->closing.insert(result->closing.end(), tokens.begin(), tokens.end());
        continue;
      }
      for (int32_t id : trie_.own_tokens(child)) result->inside[id] = 1;
      self(self, c, next);
    }
  };
  walk(walk, TokenTrie::kRoot, probe);
  std::lock_guard<std::mutex> lock(mutex_);
  if (strings_.size() >= kMaxRememberedStrings) strings_.clear();
  strings_[key] = result;
  return result;
}

JsonConstraint::JsonConstraint(std::shared_ptr<const JsonSchema> schema, std::shared_ptr<JsonVocabulary> vocabulary)
    : matcher_(std::move(schema)), vocabulary_(std::move(vocabulary)) {}

bool JsonConstraint::accepts(const std::string& bytes) const {
  JsonMatcher m = matcher_;
  return m.advance(bytes);
}

void JsonConstraint::walk_one_stack(int32_t trie_node, JsonStack& stack, size_t depth, std::vector<uint8_t>& allowed) {
  const TokenTrie& trie = vocabulary_->trie();
  const TokenTrie::Node& n = trie.node(trie_node);
  if (forks_.size() <= depth) forks_.resize(depth + 1);
  for (int32_t c = n.child_begin; c < n.child_end; ++c) {
    const TokenTrie::Node& child = trie.node(c);
    const StackTop saved(stack);
    // By index: the recursion below may grow forks_.
    std::vector<JsonStack>& forks = forks_[depth];
    forks.clear();
    if (matcher_.step(stack, child.byte, forks)) {
      for (int32_t id : trie.own_tokens(child)) allowed[id] = 1;
      if (forks.empty()) {
        walk_one_stack(c, stack, depth + 1, allowed);
      } else {
        std::vector<JsonStack> stacks{stack};
        stacks.insert(stacks.end(), forks.begin(), forks.end());
        JsonMatcher::dedupe(stacks);
        walk_stacks(c, stacks, allowed);
      }
    }
    saved.restore(stack);
  }
}

void JsonConstraint::walk_stacks(int32_t trie_node, const std::vector<JsonStack>& stacks,
                                 std::vector<uint8_t>& allowed) const {
  const TokenTrie& trie = vocabulary_->trie();
  const TokenTrie::Node& n = trie.node(trie_node);
  std::vector<JsonStack> next, forks;
  for (int32_t c = n.child_begin; c < n.child_end; ++c) {
    const TokenTrie::Node& child = trie.node(c);
    next.clear();
    for (const JsonStack& s : stacks) {
      JsonStack copy = s;
      forks.clear();
      if (matcher_.step(copy, child.byte, forks)) next.push_back(std::move(copy));
      for (auto& f : forks) next.push_back(std::move(f));
    }
    if (next.empty()) continue;
    JsonMatcher::dedupe(next);
    for (int32_t id : trie.own_tokens(child)) allowed[id] = 1;
    walk_stacks(c, next, allowed);
  }
}

void JsonConstraint::allowed_tokens(std::vector<uint8_t>& allowed, bool& may_end) {
  const TokenTrie& trie = vocabulary_->trie();
  allowed.assign(trie.vocabulary_size(), 0);
  may_end = matcher_.can_end();
  const auto& stacks = matcher_.stacks();
  if (stacks.size() > 1) return walk_stacks(TokenTrie::kRoot, stacks, allowed);
  JsonStack stack = stacks.front();
  if (JsonMatcher::in_free_text(stack.back())) {
    const auto strings = vocabulary_->string_tokens(matcher_, stack);
    allowed = strings->inside;
    JsonStack scratch;
    std::vector<JsonStack> forks;
    for (int32_t id : strings->closing) {
      // One stack, stepped in place (a copy into reused memory); a token
      // that forks the state is rare and checked by a whole matcher.
      scratch = stack;
      bool ok = true, forked = false;
      for (char c : trie.piece(id)) {
        forks.clear();
        ok = matcher_.step(scratch, static_cast<uint8_t>(c), forks);
        forked = !forks.empty();
        if (!ok || forked) break;
      }
      if (forked) ok = accepts(trie.piece(id));
      if (ok) allowed[id] = 1;
    }
    return;
  }
  walk_one_stack(TokenTrie::kRoot, stack, 0, allowed);
}

void JsonConstraint::allowed_tokens_one_by_one(std::vector<uint8_t>& allowed, bool& may_end) const {
  const TokenTrie& trie = vocabulary_->trie();
  allowed.assign(trie.vocabulary_size(), 0);
  may_end = matcher_.can_end();
  for (int32_t id = 0; id < trie.vocabulary_size(); ++id)
    allowed[id] = !trie.piece(id).empty() && accepts(trie.piece(id));
}

bool JsonConstraint::accept(int32_t token) {
  const TokenTrie& trie = vocabulary_->trie();
  if (token < 0 || token >= trie.vocabulary_size() || trie.piece(token).empty()) return false;
  return matcher_.advance(trie.piece(token));
}

}  // namespace reprise
