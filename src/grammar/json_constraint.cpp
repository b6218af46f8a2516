#include "grammar/json_constraint.h"

#include <algorithm>
#include <cstring>

namespace reprise {

namespace {

constexpr size_t kMaxRememberedStrings = 256;

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

JsonVocabulary::JsonVocabulary(std::vector<std::string> pieces) : trie_(std::move(pieces)) {
  for (int32_t id = 0; id < trie_.vocabulary_size(); ++id)
    longest_piece_ = std::max(longest_piece_, static_cast<int32_t>(trie_.piece(id).size()));
}

std::shared_ptr<const JsonVocabulary::StringTokens> JsonVocabulary::string_tokens(const JsonMatcher& matcher,
                                                                                   const JsonStack& stack) {
  const JsonFrame& top = stack.back();
  // A string's next tokens depend on its escape and UTF-8 state and, when
  // its length is bounded, on its length and bounds; a free key's on its
  // UTF-8 state.
  // A token adds at most longest_piece_ characters, so bounds further away
  // than that act alike: the key holds the distances to them, clipped.
  // With a pattern, which continuations can still finish depends on the
  // exact distances to the bounds: they are not clipped.
  const bool is_string = top.kind == JsonFrame::String;
  const SchemaNode* limits = is_string ? &matcher.schema().node(top.node) : nullptr;
  const bool patterned = limits && limits->pattern >= 0;
  const int64_t far = longest_piece_ + 1;
  const int64_t to_min =
      limits ? std::clamp<int64_t>(limits->min_length - top.count, 0, patterned ? limits->min_length : far) : 0;
  const int64_t to_max = limits && limits->max_length >= 0
                             ? (patterned ? limits->max_length - top.count
                                          : std::min<int64_t>(limits->max_length - top.count, far))
                             : -1;
  const Key key{top.kind,
                top.escape,
                top.utf8_left,
                top.utf8_lo,
                top.utf8_hi,
                to_min,
                to_max,
                patterned ? matcher.schema().pattern(limits->pattern).dfa->source() : std::string(),
                patterned ? top.pattern_state : 0};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = strings_.find(key); it != strings_.end()) return it->second;
  }
  auto result = std::make_shared<StringTokens>();
  result->inside.assign((trie_.vocabulary_size() + 63) / 64, 0);
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
      for (int32_t id : trie_.own_tokens(child)) result->inside[id / 64] |= uint64_t{1} << (id % 64);
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

bool JsonConstraint::accepts(const std::vector<JsonStack>& stacks, const std::string& bytes) const {
  std::vector<JsonStack> current = stacks, next;
  for (char c : bytes) {
    if (!matcher_.step_all(current, static_cast<uint8_t>(c), next)) return false;
    std::swap(current, next);
  }
  return true;
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
  std::vector<JsonStack> next;
  for (int32_t c = n.child_begin; c < n.child_end; ++c) {
    const TokenTrie::Node& child = trie.node(c);
    if (!matcher_.step_all(stacks, child.byte, next)) continue;
    for (int32_t id : trie.own_tokens(child)) allowed[id] = 1;
    walk_stacks(c, next, allowed);
  }
}

void JsonConstraint::add_allowed(const JsonStack& stack, std::vector<uint8_t>& allowed) {
  const TokenTrie& trie = vocabulary_->trie();
  if (JsonMatcher::in_free_text(stack.back())) {
    const auto strings = vocabulary_->string_tokens(matcher_, stack);
    for (size_t w = 0; w < strings->inside.size(); ++w) {
      const uint64_t bits = strings->inside[w];
      if (bits == ~uint64_t{0} && (w + 1) * 64 <= allowed.size()) {
        std::memset(allowed.data() + w * 64, 1, 64);  // most words inside a string
        continue;
      }
      for (uint64_t b = bits; b != 0; b &= b - 1) allowed[w * 64 + static_cast<size_t>(__builtin_ctzll(b))] = 1;
    }
    JsonStack scratch;
    std::vector<JsonStack> forks;
    for (int32_t id : strings->closing) {
      if (allowed[id]) continue;
      // Stepped in place on a copy in reused memory; a token that forks
      // the stack is checked with its forks.
      scratch = stack;
      bool ok = true, forked = false;
      for (char c : trie.piece(id)) {
        forks.clear();
        ok = matcher_.step(scratch, static_cast<uint8_t>(c), forks);
        forked = !forks.empty();
        if (!ok || forked) break;
      }
      if (forked) ok = accepts({stack}, trie.piece(id));
      if (ok) allowed[id] = 1;
    }
    return;
  }
  JsonStack walked = stack;
  walk_one_stack(TokenTrie::kRoot, walked, 0, allowed);
}

// A token is allowed when some stack allows it: each stack is walked alone,
// so strings' remembered tokens serve every alternative.
void JsonConstraint::allowed_tokens(std::vector<uint8_t>& allowed, bool& may_end) {
  allowed.assign(vocabulary_->trie().vocabulary_size(), 0);
  may_end = matcher_.can_end();
  for (const JsonStack& stack : matcher_.stacks()) add_allowed(stack, allowed);
}

void JsonConstraint::allowed_tokens_one_by_one(std::vector<uint8_t>& allowed, bool& may_end) const {
  const TokenTrie& trie = vocabulary_->trie();
  allowed.assign(trie.vocabulary_size(), 0);
  may_end = matcher_.can_end();
  for (int32_t id = 0; id < trie.vocabulary_size(); ++id)
    allowed[id] = !trie.piece(id).empty() && accepts(matcher_.stacks(), trie.piece(id));
}

bool JsonConstraint::accept(int32_t token) {
  const TokenTrie& trie = vocabulary_->trie();
  if (token < 0 || token >= trie.vocabulary_size() || trie.piece(token).empty()) return false;
  return matcher_.advance(trie.piece(token));
}

}  // namespace reprise
