#include "tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <cstring>

#include "gguf/gguf_file.h"
#include "tokenizer/bpe_pretokenizer.h"
#include "tokenizer/special_partition.h"
#include "tokenizer/unicode_text.h"

namespace reprise::tok {
namespace {

// Unambiguous key for a (left, right) pair: length of left, then both texts.
void merge_key(std::string& key, std::string_view left, std::string_view right) {
  uint32_t n = static_cast<uint32_t>(left.size());
  key.clear();
  key.append(reinterpret_cast<const char*>(&n), sizeof n);
  key.append(left);
  key.append(right);
}

struct Symbol {
  int prev = -1;
  int next = -1;
  size_t offset = 0;
  size_t length = 0;          // 0 once merged into its left neighbour
  int32_t token = kNoToken;  // the token whose text the symbol is, if any
};

struct Bigram {
  int left = 0;
  int right = 0;
  size_t size = 0;  // bytes of the merged text, to detect stale entries
  int rank = 0;
  int32_t merged = kNoToken;  // the merged text's token
};

// Lowest rank first; on ties the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

BpeTokenizer::BpeTokenizer(Vocab vocab, const gguf::File& file) : Tokenizer(std::move(vocab)) {
  const gguf::Value* merges = file.find("tokenizer.ggml.merges");
  if (!merges) file.fail("missing tokenizer metadata: no 'tokenizer.ggml.merges' key for a BPE vocabulary");
  if (merges->type != gguf::ValueType::ARRAY || merges->elem_type != gguf::ValueType::STRING)
    file.fail("'tokenizer.ggml.merges' is not a string array");
  ranks_.reserve(merges->strings.size());
  // The rules between two tokens also by their ids: nearly every lookup.
  by_tokens_.reserve(merges->strings.size());
  std::string key, merged;
  for (size_t i = 0; i < merges->strings.size(); ++i) {
    std::string_view line = merges->strings[i];
    std::string_view left, right;
    size_t space = line.size() > 1 ? line.find(' ', 1) : std::string_view::npos;
    if (space != std::string_view::npos) {
      left = line.substr(0, space);
      right = line.substr(space + 1);
    }
    merge_key(key, left, right);
    ranks_.emplace(key, static_cast<int>(i));  // the first occurrence wins
    if (space == std::string_view::npos) continue;
    auto left_token = vocab_.find(left);
    auto right_token = vocab_.find(right);
    if (!left_token || !right_token) continue;
    merged.assign(left).append(right);
    by_tokens_.insert(*left_token, *right_token, {static_cast<int32_t>(i), vocab_.find(merged).value_or(kNoToken)});
  }
  for (int32_t c = 0; c < static_cast<int32_t>(small_char_tokens_.size()); ++c) {
    std::string text;
    append_utf8(text, static_cast<uint32_t>(c));
    small_char_tokens_[c] = vocab_.find(text).value_or(kNoToken);
  }
}

int BpeTokenizer::merge_rank(std::string_view left, std::string_view right) const {
  thread_local std::string key;
  merge_key(key, left, right);
  auto it = ranks_.find(key);
  return it == ranks_.end() ? -1 : it->second;
}

int32_t BpeTokenizer::token_of_char(std::string_view text) const {
  // The byte alphabet's characters are all below U+0144.
  if (text.size() == 1 && static_cast<uint8_t>(text[0]) < 0x80) return small_char_tokens_[static_cast<uint8_t>(text[0])];
  if (text.size() == 2 && (text[0] & 0xE0) == 0xC0 && (text[1] & 0xC0) == 0x80) {
    const uint32_t c = ((static_cast<uint32_t>(text[0]) & 0x1F) << 6) | (static_cast<uint32_t>(text[1]) & 0x3F);
    if (c >= 0x80 && c < small_char_tokens_.size()) return small_char_tokens_[c];
  }
  return vocab_.find(text).value_or(kNoToken);
}

void BpeTokenizer::encode_word(const std::string& word, std::vector<int32_t>& out) const {
  if (vocab_.ignore_merges) {
    if (auto id = vocab_.find(word)) {
      out.push_back(*id);
      return;
    }
  }
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Bigram> queue;  // a heap in BigramOrder
  symbols.clear();
  queue.clear();
  for (size_t offset = 0; offset < word.size();) {
    Symbol s;
    s.offset = offset;
    s.length = std::min(utf8_sequence_length(static_cast<uint8_t>(word[offset])), word.size() - offset);
    s.token = token_of_char(std::string_view(word).substr(offset, s.length));
    offset += s.length;
    s.prev = static_cast<int>(symbols.size()) - 1;
    s.next = offset == word.size() ? -1 : static_cast<int>(symbols.size()) + 1;
    symbols.push_back(s);
  }
  auto text_of = [&](const Symbol& s) { return std::string_view(word).substr(s.offset, s.length); };

  // A pair of tokens is looked up by ids; a symbol that is no token (a
  // character outside the vocabulary, or a rule's text that is none) by text.
  auto add_bigram = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    Bigram b{left, right, l.length + r.length, 0, kNoToken};
    if (l.token != kNoToken && r.token != kNoToken) {
      auto merge = by_tokens_.find(l.token, r.token);
      if (!merge) return;
      b.rank = merge->rank;
      b.merged = merge->merged;
    } else {
      b.rank = merge_rank(text_of(l), text_of(r));
      if (b.rank < 0) return;
      b.merged = vocab_.find(std::string_view(word).substr(l.offset, b.size)).value_or(kNoToken);
    }
    queue.push_back(b);
    std::push_heap(queue.begin(), queue.end(), BigramOrder());
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) add_bigram(i - 1, i);

  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), BigramOrder());
    const Bigram b = queue.back();
    queue.pop_back();
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    // Stale: either side merged since. Symbols only grow rightwards from a
    // fixed offset, so the same total size means the same two symbols.
    if (left.length == 0 || right.length == 0 || left.length + right.length != b.size) continue;
    left.length += right.length;
    left.token = b.merged;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    add_bigram(left.prev, b.left);
    add_bigram(b.left, left.next);
  }

  for (const Symbol& s : symbols) {
    if (s.length == 0) continue;
    if (s.token != kNoToken) {
      out.push_back(s.token);
      continue;
    }
    // Not in the vocabulary: each byte of the (alphabet-mapped) text on its own.
    for (char c : text_of(s))
      if (auto id = vocab_.find(std::string_view(&c, 1))) out.push_back(*id);
  }
}

void BpeTokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  for (const std::string& word : pretokenize(vocab_.pre.kind, text)) encode_word(word, out);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  const std::vector<Fragment> fragments = partition_special(vocab_, text, parse_special);
  if (add_special && vocab_.add_bos) out.push_back(vocab_.bos);
  for (const Fragment& f : fragments) {
    if (f.is_text())
      encode_text(text.substr(f.offset, f.length), out);
    else
      out.push_back(f.token);
  }
  if (add_special && vocab_.add_eos) out.push_back(vocab_.eos);
  return out;
}

std::string BpeTokenizer::token_to_piece(int32_t id, bool render_special) const { return piece(id, render_special); }

}  // namespace reprise::tok
