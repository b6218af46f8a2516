// WordPiece tokenizer (tokenizer.ggml.model = "bert"), as llama.cpp: BERT
// normalisation (lowercase, accents stripped, punctuation and CJK characters
// split off, controls dropped), then greedy longest-match of each word with a
// leading U+2581; a word that cannot be covered becomes [UNK].
#pragma once
#include "tokenizer/tokenizer.h"

namespace reprise::tok {

class WpmTokenizer final : public Tokenizer {
 public:
  explicit WpmTokenizer(Vocab vocab);
  // add_special adds [CLS] first and [SEP] last (llama.cpp ignores
  // add_bos/add_eos for BERT vocabularies).
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override;
  std::string token_to_piece(int32_t id, bool render_special = false) const override;

 private:
  std::vector<std::string> split_words(std::string_view text) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
};

}  // namespace reprise::tok
