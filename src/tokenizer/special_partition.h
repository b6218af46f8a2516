// Splits input text around the text of special tokens before the model's
// tokenizer sees it (llama.cpp's tokenizer_st_partition).
//
// Special tokens are tried longest first; each one splits every remaining text
// fragment at all its occurrences. Control and unknown tokens are recognised
// only when parse_special is set; user-defined tokens always are (as Hugging
// Face tokenizers do with added tokens). LSTRIP/RSTRIP tokens swallow the
// ASCII whitespace beside them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace reprise::tok {

struct Fragment {
  int32_t token = kNoToken;  // a special token, or kNoToken for raw text
  size_t offset = 0;         // raw text: byte range in the input
  size_t length = 0;
  bool is_text() const { return token == kNoToken; }
};

std::vector<Fragment> partition_special(const Vocab& vocab, std::string_view text, bool parse_special);

}  // namespace reprise::tok
