// Structured output: a TokenConstraint that keeps a generation inside the
// JSON documents a schema allows (JsonMatcher), over one model's vocabulary.
//
// The allowed set is computed by walking the matcher over the vocabulary's
// trie. Inside a string, where most of a document's tokens are and almost
// every token is allowed, the walk would visit the whole trie; there the
// tokens that stay inside the string depend only on the string's own state,
// so JsonVocabulary remembers them per state and only the tokens that close
// the string are checked against the rest of the document. Keys that are
// not declared names (json_object's) are remembered alike.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "engine/token_constraint.h"
#include "grammar/json_matcher.h"
#include "grammar/json_schema.h"
#include "grammar/token_trie.h"

namespace reprise {

// One model's vocabulary for structured output, shared by its requests.
// Thread-safe.
class JsonVocabulary {
 public:
  explicit JsonVocabulary(std::vector<std::string> pieces);
  const TokenTrie& trie() const { return trie_; }

  // Tokens that, from free text (JsonMatcher::in_free_text) on top of
  // `stack`, stay inside it (`inside`, indexed by id), and those whose bytes
  // close it somewhere (`closing`), which the caller checks against the
  // whole stack.
  struct StringTokens {
    std::vector<uint64_t> inside;  // a bit per token id
    std::vector<int32_t> closing;
  };
  std::shared_ptr<const StringTokens> string_tokens(const JsonMatcher& matcher, const JsonStack& stack);

 private:
  TokenTrie trie_;
  int32_t longest_piece_ = 0;  // bytes
  // Frame kind, escape and UTF-8 state, the distances to the length bounds,
  // and a pattern's source and automaton state ("" and 0 without one).
  using Key = std::tuple<uint8_t, uint8_t, uint8_t, uint8_t, uint8_t, int64_t, int64_t, std::string, int32_t>;
  std::mutex mutex_;
  std::map<Key, std::shared_ptr<const StringTokens>> strings_;
};

class JsonConstraint final : public TokenConstraint {
 public:
  JsonConstraint(std::shared_ptr<const JsonSchema> schema, std::shared_ptr<JsonVocabulary> vocabulary);

  void allowed_tokens(std::vector<uint8_t>& allowed, bool& may_end) override;
  bool accept(int32_t token) override;

  // The same set, found by trying every token on its own (for tests).
  void allowed_tokens_one_by_one(std::vector<uint8_t>& allowed, bool& may_end) const;
  const JsonMatcher& matcher() const { return matcher_; }

 private:
  JsonMatcher matcher_;
  std::shared_ptr<JsonVocabulary> vocabulary_;
  std::vector<std::vector<JsonStack>> forks_;  // per trie depth

  // Whether the stacks (with their forks) accept every byte.
  bool accepts(const std::vector<JsonStack>& stacks, const std::string& bytes) const;
  // Adds the tokens `stack` alone allows next.
  void add_allowed(const JsonStack& stack, std::vector<uint8_t>& allowed);
  void walk_one_stack(int32_t trie_node, JsonStack& stack, size_t depth, std::vector<uint8_t>& allowed);
  void walk_stacks(int32_t trie_node, const std::vector<JsonStack>& stacks, std::vector<uint8_t>& allowed) const;
};

}  // namespace reprise
