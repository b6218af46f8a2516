// Text <-> token ids for GGUF models, reproducing llama.cpp's tokenizers
// exactly (same ids for the same text and flags). Supported models and
// pre-tokenizers are listed in docs/tokenizers.md; anything else is refused
// with reprise::Error rather than approximated.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace reprise {

namespace gguf {
class File;
}

class Tokenizer {
 public:
  // Builds the tokenizer the GGUF's tokenizer.ggml.* metadata describes. Throws
  // reprise::Error naming the problem for unsupported models/pre-tokenizers.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& file);
  virtual ~Tokenizer();

  // add_special: add BOS/EOS as the metadata says (tokenizer.ggml.add_bos_token /
  // add_eos_token, with llama.cpp's defaults per model type; BERT adds CLS ... SEP).
  // parse_special: recognise control/user-defined special tokens' text in
  // `text` (llama.cpp parse_special). User-defined tokens are recognised
  // even without it, as in llama.cpp.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const = 0;

  // Raw bytes of a token as it appears in output text (byte-fallback tokens ->
  // the byte, SPM U+2581 -> space, byte-level BPE mapping undone). Control and
  // unknown tokens give "" unless render_special. Throws for an invalid id.
  // The leading space SentencePiece models put on the first word is kept
  // (as llama.cpp's token_to_piece does); detokenize() can remove it.
  virtual std::string token_to_piece(int32_t id, bool render_special = false) const = 0;

  // Whole-sequence decoding as llama_detokenize: with remove_special a
  // leading BOS / trailing EOS added by the model is dropped; the space added
  // by add_space_prefix is removed from the first piece (unless a BOS was
  // dropped); BPE/WPM models get llama.cpp's " ." / " 's" clean-up when the
  // vocabulary asks for it.
  std::string detokenize(std::span<const int32_t> ids, bool remove_special = false,
                         bool unparse_special = false) const;

  int32_t n_vocab() const { return vocab_.n_tokens(); }
  int32_t bos_id() const { return vocab_.bos; }  // -1 when absent
  int32_t eos_id() const { return vocab_.eos; }  // -1 when absent
  bool add_bos() const { return vocab_.add_bos; }
  bool add_eos() const { return vocab_.add_eos; }
  // End-of-generation: eos, eot, <|im_end|>, <end_of_turn>, ... as llama.cpp decides.
  bool is_eog(int32_t id) const { return vocab_.eog.count(id) > 0; }
  // Vocabulary string as stored in the GGUF. Throws for an invalid id.
  const std::string& token_text(int32_t id) const;
  std::optional<int32_t> find_token(std::string_view text) const { return vocab_.find(text); }

  // Control tokens (e.g. <s>, <|im_end|>) are never produced from plain text
  // unless parse_special; true for control/unknown ids.
  bool is_control(int32_t id) const;
  const tok::Vocab& vocab() const { return vocab_; }

 protected:
  explicit Tokenizer(tok::Vocab vocab);
  // Shared by the subclasses: the cached piece with the special-token rule.
  std::string piece(int32_t id, bool render_special) const;

  tok::Vocab vocab_;
};

// Every token's bytes as it appears in output text (token_to_piece), with
// control and unknown tokens empty: what constraining output to a language
// (structured output) walks over.
std::vector<std::string> output_pieces(const Tokenizer& tokenizer);

// A model's token id as output text: token_to_piece, and "" for the ids a
// model has beyond its tokenizer's vocabulary (padding rows), which are
// valid model outputs and inputs but name no text.
std::string model_token_piece(const Tokenizer& tokenizer, int32_t id);

// Streams detokenized text: returns only complete UTF-8 sequences, holding
// back an incomplete tail until later tokens complete it; flush() returns the
// rest. Invalid bytes are replaced with U+FFFD, so all output is valid UTF-8.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool render_special = false);
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool render_special_;
  std::string pending_;
};

}  // namespace reprise
