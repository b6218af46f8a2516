#include "tokenizer/spm_tokenizer.h"

#include <map>
#include <queue>

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
  SpmMerger(const Vocab& vocab, const std::string& text) : vocab_(vocab), text_(text) {}

  void run(std::vector<int32_t>& out) {
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
      Bigram b = queue_.top();
      queue_.pop();
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
    for (int i = 0; i != -1; i = symbols_[i].next) resegment(symbols_[i], out);
  }

 private:
  std::string_view text_of(const Symbol& s) const { return std::string_view(text_).substr(s.offset, s.length); }

  void try_add_bigram(int left, int right) {
    if (left == -1 || right == -1) return;
    std::string merged(text_.substr(symbols_[left].offset, symbols_[left].length + symbols_[right].length));
    auto id = vocab_.find(merged);
    if (!id) return;
    queue_.push({left, right, vocab_.tokens[*id].score, merged.size()});
    last_merge_[merged] = {left, right};
  }

  // A symbol that is not a token was produced by a merge recorded earlier
  // (or is a single character): split it again, down to byte tokens.
  void resegment(const Symbol& s, std::vector<int32_t>& out) {
    std::string_view text = text_of(s);
    if (auto id = vocab_.find(text)) {
      out.push_back(*id);
      return;
    }
    auto it = last_merge_.find(std::string(text));
    if (it == last_merge_.end()) {
      for (char c : text) {
        auto byte = vocab_.byte_token(static_cast<uint8_t>(c));
        // llama.cpp throws when a byte token is missing; fall back to <unk>.
        if (byte) {
          out.push_back(*byte);
        } else if (vocab_.unk != kNoToken) {
          out.push_back(vocab_.unk);
        }
      }
      return;
    }
    resegment(symbols_[it->second.first], out);
    resegment(symbols_[it->second.second], out);
  }

  const Vocab& vocab_;
  const std::string& text_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue_;
  std::map<std::string, std::pair<int, int>> last_merge_;
};

void escape_spaces(const std::string& in, std::string& out) {
  for (char c : in) {
    if (c == ' ')
      out += "\xE2\x96\x81";
    else
      out.push_back(c);
  }
}

}  // namespace

SpmTokenizer::SpmTokenizer(Vocab vocab) : Tokenizer(std::move(vocab)) {}

void SpmTokenizer::encode_escaped(const std::string& text, std::vector<int32_t>& out) const {
  SpmMerger(vocab_, text).run(out);
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
