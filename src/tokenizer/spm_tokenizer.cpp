#include "tokenizer/spm_tokenizer.h"

#include <algorithm>

#include "tokenizer/special_partition.h"
#include "tokenizer/unicode_text.h"

namespace reprise::tok {
namespace {

struct Symbol {
  int prev = -1;
  int next = -1;
  size_t offset = 0;  // into the fragment text
  size_t length = 0;  // 0 once merged into its left neighbour
};

struct Bigram {
  int left = 0;
  int right = 0;
  float score = 0;
  size_t size = 0;  // bytes of the merged text, to detect stale entries
};

// Highest score first; on ties the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

// The merge state for one fragment.
class SpmMerger {
 public:
  SpmMerger(const Vocab& vocab, std::string_view text) : vocab_(vocab), text_(text) {}

  void run(std::vector<int32_t>& out) {
    symbols_.clear();
    queue_.clear();
    for (size_t offset = 0; offset < text_.size();) {
      Symbol s;
      s.offset = offset;
      s.length = std::min(utf8_sequence_length(static_cast<uint8_t>(text_[offset])), text_.size() - offset);
      offset += s.length;
      s.prev = static_cast<int>(symbols_.size()) - 1;
      s.next = offset == text_.size() ? -1 : static_cast<int>(symbols_.size()) + 1;
      symbols_.push_back(s);
    }
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) try_add_bigram(i - 1, i);

    while (!queue_.empty()) {
      std::pop_heap(queue_.begin(), queue_.end(), BigramOrder());
      const Bigram b = queue_.back();
      queue_.pop_back();
      Symbol& left = symbols_[b.left];
      Symbol& right = symbols_[b.right];
      if (left.length == 0 || right.length == 0 || left.length + right.length != b.size) continue;
      left.length += right.length;
      right.length = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = b.left;
      try_add_bigram(left.prev, b.left);
      try_add_bigram(b.left, left.next);
    }

    if (symbols_.empty()) return;
    for (int i = 0; i != -1; i = symbols_[i].next) emit(symbols_[i], out);
  }

 private:
  std::string_view text_of(const Symbol& s) const { return text_.substr(s.offset, s.length); }

  void try_add_bigram(int left, int right) {
    if (left == -1 || right == -1) return;
    const size_t size = symbols_[left].length + symbols_[right].length;
    // No token is longer than the longest one: skip the lookup.
    if (size > vocab_.max_token_bytes) return;
    auto id = vocab_.find(text_.substr(symbols_[left].offset, size));
    if (!id) return;
    queue_.push_back({left, right, vocab_.tokens[*id].score, size});
    std::push_heap(queue_.begin(), queue_.end(), BigramOrder());
  }

  // A merged symbol is always a token (only pairs that form one are merged),
  // so a symbol without a token is one character of the input: it becomes
  // its bytes' tokens. (llama.cpp also keeps a map from merged text back to
  // the pair that formed it, for splitting such symbols again; its entries
  // are all tokens, so it is never consulted, and reprise keeps none.)
  void emit(const Symbol& s, std::vector<int32_t>& out) const {
    std::string_view text = text_of(s);
    if (auto id = vocab_.find(text)) {
      out.push_back(*id);
      return;
    }
    for (char c : text) {
      auto byte = vocab_.byte_token(static_cast<uint8_t>(c));
      // llama.cpp throws when a byte token is missing; fall back to <unk>.
      if (byte) {
        out.push_back(*byte);
      } else if (vocab_.unk != kNoToken) {
        out.push_back(vocab_.unk);
      }
    }
  }

  const Vocab& vocab_;
  std::string_view text_;
  // The thread's buffers, reused word after word.
  static thread_local std::vector<Symbol> symbols_;
  static thread_local std::vector<Bigram> queue_;  // a heap in BigramOrder
};

thread_local std::vector<Symbol> SpmMerger::symbols_;
thread_local std::vector<Bigram> SpmMerger::queue_;

constexpr std::string_view kEscapedSpace = "\xE2\x96\x81";

void escape_spaces(const std::string& in, std::string& out) {
  for (char c : in) {
    if (c == ' ')
      out += kEscapedSpace;
    else
      out.push_back(c);
  }
}

}  // namespace

void spm_merge(const Vocab& vocab, std::string_view escaped, std::vector<int32_t>& out) {
  SpmMerger(vocab, escaped).run(out);
}

SpmTokenizer::SpmTokenizer(Vocab vocab) : Tokenizer(std::move(vocab)) {
  for (const TokenEntry& token : vocab_.tokens) {
    const std::string_view text = token.text;
    for (size_t i = text.find(kEscapedSpace, 1); i != std::string_view::npos; i = text.find(kEscapedSpace, i + 1))
      joins_before_space_[static_cast<uint8_t>(text[i - 1])] = true;
  }
}

void SpmTokenizer::encode_escaped(std::string_view text, std::vector<int32_t>& out) const {
  // Cut before each escaped space that starts a character (as the merger
  // splits characters) and whose previous byte no token holds right before
  // one: a token across the cut would hold exactly that pair. Each piece is
  // merged on its own; merges never join symbols across a cut, and within a
  // piece they pop in the same order as in the whole text's queue.
  size_t start = 0;
  for (size_t p = 0; p < text.size();) {
    const size_t length = std::min(utf8_sequence_length(static_cast<uint8_t>(text[p])), text.size() - p);
    if (p > start && text.substr(p, length) == kEscapedSpace &&
        !joins_before_space_[static_cast<uint8_t>(text[p - 1])]) {
      spm_merge(vocab_, text.substr(start, p - start), out);
      start = p;
    }
    p += length;
  }
  spm_merge(vocab_, text.substr(start), out);
}

std::vector<int32_t> SpmTokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  const std::vector<Fragment> fragments = partition_special(vocab_, text, parse_special);
  if (add_special && vocab_.add_bos) out.push_back(vocab_.bos);

  // Every text fragment that starts the input or follows a special token gets
  // the space prefix, as in llama.cpp.
  bool after_special = true;
  std::string raw;
  std::string escaped;
  for (const Fragment& f : fragments) {
    if (!f.is_text()) {
      out.push_back(f.token);
      after_special = true;
      continue;
    }
    raw.clear();
    if (vocab_.add_space_prefix && after_special) raw.push_back(' ');
    raw.append(text.substr(f.offset, f.length));
    escaped.clear();
    escape_spaces(raw, escaped);
    encode_escaped(escaped, out);
    after_special = false;
  }
  if (add_special && vocab_.add_eos) out.push_back(vocab_.eos);
  return out;
}

std::string SpmTokenizer::token_to_piece(int32_t id, bool render_special) const { return piece(id, render_special); }

}  // namespace reprise::tok
