// Byte-level BPE tokenizer (tokenizer.ggml.model = "gpt2"), as llama.cpp:
// pre-tokenize into words (bpe_pretokenizer.h), map bytes to the GPT-2
// alphabet, then inside each word repeatedly merge the adjacent pair with the
// lowest merge rank (tokenizer.ggml.merges order), leftmost first.
#pragma once
#include <array>
#include <string>
#include <unordered_map>

#include "tokenizer/merge_table.h"
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
  // Tokenizes one pre-tokenized word, already in the byte alphabet.
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;

 private:
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  // The token of one character's text, or kNoToken.
  int32_t token_of_char(std::string_view text) const;

  std::unordered_map<std::string, int> ranks_;  // every rule; key: see merge_key()
  MergeTable by_tokens_;                        // the rules joining two tokens
  std::array<int32_t, 0x180> small_char_tokens_{};  // by code point: the byte alphabet's
};

}  // namespace reprise::tok
