// Pre-tokenizers for byte-level BPE: split text into the words that BPE merges
// run inside, exactly as llama.cpp does for each `tokenizer.ggml.pre` name.
//
// llama.cpp describes each pre-tokenizer as a list of regexes applied one
// after another; each regex re-splits every piece produced so far into its
// matches and the unmatched gaps between them. Here every regex is hand-coded
// as a "match at this position" function over code points (no regex engine),
// and the splitting loop reproduces std::regex_iterator's leftmost search.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace reprise::tok {

enum class PreTokenizerKind {
  Default,        // no/"default" pre name: GPT-2 pattern plus punctuation/digit passes
  Gpt2,           // gpt-2, mpt, olmo, jais, phi-2, ...
  Llama3,         // llama-bpe / llama3: contractions, \p{N}{1,3}, newline handling
  Qwen2,          // llama3 pattern with single digits
  Qwen35,         // qwen2 pattern with combining marks joined to letters
  DeepseekLlm,
  DeepseekCoder,
  Deepseek3,      // deepseek-v3, hunyuan-dense
  Falcon,
  Starcoder,      // starcoder, refact, command-r, smollm, ...: digits split, then GPT-2
  Poro,           // poro-chat, bloom, gpt3-finnish
  Viking,
};

// What a `tokenizer.ggml.pre` name implies besides the split itself
// (llama.cpp sets these flags per name before reading the metadata).
struct PreTokenizerConfig {
  PreTokenizerKind kind = PreTokenizerKind::Default;
  bool ignore_merges = false;  // a whole word found in the vocab is one token
  bool add_bos = false;        // default for tokenizer.ggml.add_bos_token
  bool add_sep = false;
  bool clean_spaces = true;    // detokenizer clean-up
  bool clear_bos = false;      // the model has no BOS (chatglm)
};

// Throws reprise::Error naming `pre_name` when it is unknown or not supported.
// An empty name means "default", as in llama.cpp.
PreTokenizerConfig pretokenizer_config(std::string_view pre_name);

// Splits `text` and returns the words with every byte mapped to the GPT-2
// byte alphabet (invalid UTF-8 is replaced with U+FFFD first, as llama.cpp).
std::vector<std::string> pretokenize(PreTokenizerKind kind, std::string_view text);

}  // namespace reprise::tok
