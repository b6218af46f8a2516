#include "tokenizer/special_partition.h"

namespace reprise::tok {
namespace {

bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

}  // namespace

std::vector<Fragment> partition_special(const Vocab& vocab, std::string_view text, bool parse_special) {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({kNoToken, 0, text.size()});

  std::vector<Fragment> next;
  for (int32_t special : vocab.special_tokens) {
    const TokenEntry& token = vocab.tokens[special];
    if (!parse_special && (token.attrs & (attr::kControl | attr::kUnknown))) continue;
    const std::string_view needle = token.text;

    bool changed = false;
    next.clear();
    for (const Fragment& f : fragments) {
      if (!f.is_text()) {
        next.push_back(f);
        continue;
      }
      size_t begin = f.offset;
      size_t length = f.length;
      while (length > 0) {
        size_t hit = text.substr(0, begin + length).find(needle, begin);
        if (hit == std::string_view::npos) break;
        changed = true;
        size_t left = hit - begin;
        if (token.attrs & attr::kLstrip)
          while (left > 0 && is_ascii_space(text[begin + left - 1])) --left;
        if (left > 0) next.push_back({kNoToken, begin, left});
        next.push_back({special, 0, 0});

        size_t right_begin = hit + needle.size();
        size_t right_length = begin + length - right_begin;
        if (token.attrs & attr::kRstrip) {
          while (right_length > 0 && is_ascii_space(text[right_begin])) {
            ++right_begin;
            --right_length;
          }
        }
        begin = right_begin;
        length = right_length;
      }
      if (length > 0) next.push_back({kNoToken, begin, length});
    }
    if (changed) fragments.swap(next);
  }
  return fragments;
}

}  // namespace reprise::tok
