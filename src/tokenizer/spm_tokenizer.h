// SentencePiece-style tokenizer (tokenizer.ggml.model = "llama"), as llama.cpp
// implements it: spaces become U+2581 (with a leading one when
// add_space_prefix), then adjacent symbols are merged greedily by the score of
// the vocabulary entry they form, and symbols left without a token fall back
// to <0xXX> byte tokens.
#pragma once
#include "tokenizer/tokenizer.h"

namespace reprise::tok {

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(Vocab vocab);
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override;
  std::string token_to_piece(int32_t id, bool render_special = false) const override;

 private:
  // Tokenizes one fragment that is already whitespace-escaped.
  void encode_escaped(const std::string& text, std::vector<int32_t>& out) const;
};

}  // namespace reprise::tok
