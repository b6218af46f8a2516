#include "tokenizer/wpm_tokenizer.h"

#include "tokenizer/special_partition.h"
#include "tokenizer/unicode_text.h"
#include "util/error.h"

namespace reprise::tok {
namespace {

// The CJK ranges BERT treats as single-character words (as the Hugging Face
// implementation has them, including its 0x2B920 quirk).
bool is_cjk_ideograph(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

}  // namespace

WpmTokenizer::WpmTokenizer(Vocab vocab) : Tokenizer(std::move(vocab)) {
  if (vocab_.unk == kNoToken) throw Error("BERT vocabulary without an unknown token");
}

std::vector<std::string> WpmTokenizer::split_words(std::string_view text) const {
  std::vector<std::string> words(1);
  for (uint32_t cpt : decode_utf8_lenient(text)) {
    if (vocab_.strip_accents) cpt = nfd_first(cpt);
    const CodepointFlags flags = codepoint_flags(cpt);
    if (flags.whitespace()) {
      if (!words.back().empty()) words.emplace_back();
      continue;
    }
    if (cpt == 0 || cpt == 0xFFFD || flags.control()) continue;
    if (vocab_.strip_accents && flags.mark()) continue;
    const std::string s = codepoint_to_utf8(vocab_.lowercase ? to_lower(cpt) : cpt);
    if (flags.punctuation() || (cpt < 0x7F && flags.symbol()) || is_cjk_ideograph(cpt)) {
      if (!words.back().empty()) words.emplace_back();
      words.back() = s;
      words.emplace_back();
    } else {
      words.back() += s;
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

void WpmTokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  for (const std::string& w : split_words(text)) {
    if (w.empty()) continue;
    const std::string word = "\xE2\x96\x81" + w;
    const size_t n = word.size();
    const size_t first = out.size();
    // Longest vocabulary entry at each position; give up on the whole word
    // as soon as one position has none.
    for (size_t i = 0; i < n; ++i) {
      bool found = false;
      for (size_t j = std::min(n, i + vocab_.max_token_bytes + 1); j > i; --j) {
        if (auto id = vocab_.find(std::string_view(word).substr(i, j - i))) {
          out.push_back(*id);
          found = true;
          i = j - 1;
          break;
        }
      }
      if (!found) {
        out.resize(first);
        break;
      }
    }
    if (out.size() == first) out.push_back(vocab_.unk);
  }
}

std::vector<int32_t> WpmTokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  if (add_special) {
    if (vocab_.bos == kNoToken) throw Error("BERT vocabulary without a [CLS]/BOS token");
    out.push_back(vocab_.bos);
  }
  for (const Fragment& f : partition_special(vocab_, text, parse_special)) {
    if (f.is_text())
      encode_text(text.substr(f.offset, f.length), out);
    else
      out.push_back(f.token);
  }
  if (add_special) {
    if (vocab_.sep == kNoToken) throw Error("BERT vocabulary without a [SEP] token");
    out.push_back(vocab_.sep);
  }
  return out;
}

std::string WpmTokenizer::token_to_piece(int32_t id, bool render_special) const { return piece(id, render_special); }

}  // namespace reprise::tok
