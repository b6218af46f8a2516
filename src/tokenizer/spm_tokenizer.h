// SentencePiece-style tokenizer (tokenizer.ggml.model = "llama"), as llama.cpp
// implements it: spaces become U+2581 (with a leading one when
// add_space_prefix), then adjacent symbols are merged greedily by the score of
// the vocabulary entry they form, and symbols left without a token fall back
// to <0xXX> byte tokens.
#pragma once
#include <array>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace reprise::tok {

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(Vocab vocab);
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override;
  std::string token_to_piece(int32_t id, bool render_special = false) const override;

  // Tokenizes one fragment that is already whitespace-escaped, word by word
  // where no token can join two words (the same ids as spm_merge of the whole
  // fragment, in a fraction of the time for long texts).
  void encode_escaped(std::string_view text, std::vector<int32_t>& out) const;

 private:
  // Byte b is true when some token holds b right before an escaped space.
  std::array<bool, 256> joins_before_space_{};
};

// Merges one whitespace-escaped text as a whole, as llama.cpp does: the
// reference the tokenizer's word-by-word merging must match (tests).
void spm_merge(const Vocab& vocab, std::string_view escaped, std::vector<int32_t>& out);

}  // namespace reprise::tok
