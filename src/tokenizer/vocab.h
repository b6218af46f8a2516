// The token table and tokenizer settings read from a GGUF's tokenizer.ggml.*
// metadata, with llama.cpp's defaults and fix-ups applied (special token ids,
// add_bos/add_eos, token attributes, end-of-generation set). The tokenizers
// only read it.
#pragma once
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/bpe_pretokenizer.h"
#include "tokenizer/token_index.h"

namespace reprise::gguf {
class File;
}

namespace reprise::tok {

enum class VocabKind { Spm, Bpe, Wpm };

// Token attributes (llama.cpp's llama_token_attr bits).
namespace attr {
constexpr uint32_t kUnknown = 1u << 0;
constexpr uint32_t kUnused = 1u << 1;
constexpr uint32_t kNormal = 1u << 2;
constexpr uint32_t kControl = 1u << 3;
constexpr uint32_t kUserDefined = 1u << 4;
constexpr uint32_t kByte = 1u << 5;
constexpr uint32_t kLstrip = 1u << 7;  // eat whitespace left of the special token
constexpr uint32_t kRstrip = 1u << 8;  // eat whitespace right of the special token
}  // namespace attr

struct TokenEntry {
  std::string text;
  float score = 0.0f;
  uint32_t attrs = 0;
};

constexpr int32_t kNoToken = -1;

class Vocab {
 public:
  // Throws reprise::Error naming the problem (missing/invalid metadata,
  // unsupported tokenizer model or pre-tokenizer).
  static Vocab from_gguf(const gguf::File& file);

  VocabKind kind = VocabKind::Spm;
  std::string model_name;  // tokenizer.ggml.model
  std::string pre_name;    // tokenizer.ggml.pre
  PreTokenizerConfig pre;  // BPE only

  std::vector<TokenEntry> tokens;
  TokenIndex ids;  // text -> id
  size_t max_token_bytes = 0;

  int32_t bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken, unk = kNoToken, sep = kNoToken,
          pad = kNoToken, mask = kNoToken;
  int32_t fim_pre = kNoToken, fim_suf = kNoToken, fim_mid = kNoToken, fim_pad = kNoToken, fim_rep = kNoToken,
          fim_sep = kNoToken;

  bool add_bos = false;
  bool add_eos = false;
  bool add_sep = false;
  bool add_space_prefix = false;  // SPM: prefix text with a space (becomes U+2581)
  bool clean_spaces = false;      // detokenizer clean-up of " ." etc.
  bool ignore_merges = false;     // BPE: whole words found in the vocab are kept
  bool lowercase = true;          // WPM normalizer
  bool strip_accents = true;      // WPM normalizer

  std::set<int32_t> eog;
  // Control, user-defined and unknown tokens, longest text first: the order
  // in which special-token text is searched for.
  std::vector<int32_t> special_tokens;
  // token_to_piece(id, render_special = true) for every id.
  std::vector<std::string> pieces;

  int32_t n_tokens() const { return static_cast<int32_t>(tokens.size()); }
  bool valid(int32_t id) const { return id >= 0 && id < n_tokens(); }
  uint32_t attrs(int32_t id) const { return tokens[id].attrs; }
  std::optional<int32_t> find(std::string_view text) const;
  // Token for a raw byte: SPM "<0xXX>" (or the byte itself as text), BPE the
  // byte's GPT-2 character. nullopt when the vocabulary lacks it.
  std::optional<int32_t> byte_token(uint8_t byte) const;

 private:
  void read_tokens(const gguf::File& file);
  void read_special_ids(const gguf::File& file);
  void detect_special_tokens();
  void apply_model_attributes(const gguf::File& file);
  void build_caches();
  std::string compute_piece(int32_t id) const;
};

}  // namespace reprise::tok
