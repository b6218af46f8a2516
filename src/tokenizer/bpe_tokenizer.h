// Byte-level BPE tokenizer (tokenizer.ggml.model = "gpt2"), as llama.cpp:
// pre-tokenize into words (bpe_pretokenizer.h), map bytes to the GPT-2
// alphabet, then inside each word repeatedly merge the adjacent pair with the
// lowest merge rank (tokenizer.ggml.merges order), leftmost first.
#pragma once
#include <string>
#include <unordered_map>

#include "tokenizer/tokenizer.h"

namespace reprise::tok {

class BpeTokenizer final : public Tokenizer {
 public:
  // Reads tokenizer.ggml.merges from `file`; throws reprise::Error if missing.
  BpeTokenizer(Vocab vocab, const gguf::File& file);
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override;
  std::string token_to_piece(int32_t id, bool render_special = false) const override;

  // Rank of merging `left` and `right`, or -1.
  int merge_rank(std::string_view left, std::string_view right) const;

 private:
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int> ranks_;  // key: see merge_key()
};

}  // namespace reprise::tok
