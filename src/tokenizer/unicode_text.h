// Unicode helpers shared by the tokenizers.
//
// Everything here follows llama.cpp's conventions rather than strict Unicode,
// because token ids must match llama.cpp byte for byte:
//  - UTF-8 decoding is lenient (overlong forms and surrogates are accepted) and
//    every byte that does not start a decodable sequence becomes U+FFFD;
//  - character classes are the general categories of the code point (ICU),
//    with "whitespace" meaning the Unicode White_Space property;
//  - NFD "normalization" maps a code point to the first code point of its
//    canonical decomposition (this is how llama.cpp strips accents for BERT).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace reprise::tok {

// Category bits of one code point (llama.cpp's unicode_cpt_flags).
struct CodepointFlags {
  enum : uint16_t {
    kUndefined = 0x0001,    // Cn, or beyond U+10FFFF
    kNumber = 0x0002,       // \p{N}
    kLetter = 0x0004,       // \p{L}
    kSeparator = 0x0008,    // \p{Z}
    kMark = 0x0010,         // \p{M}
    kPunctuation = 0x0020,  // \p{P}
    kSymbol = 0x0040,       // \p{S}
    kControl = 0x0080,      // \p{C} other than Cn
    kWhitespace = 0x0100,   // White_Space property
  };
  uint16_t bits = 0;

  bool undefined() const { return bits & kUndefined; }
  bool number() const { return bits & kNumber; }
  bool letter() const { return bits & kLetter; }
  bool separator() const { return bits & kSeparator; }
  bool mark() const { return bits & kMark; }
  bool punctuation() const { return bits & kPunctuation; }
  bool symbol() const { return bits & kSymbol; }
  bool control() const { return bits & kControl; }
  bool whitespace() const { return bits & kWhitespace; }
};

CodepointFlags codepoint_flags(uint32_t cpt);

// Byte length of a UTF-8 sequence judged by its first byte only (1 for
// continuation and invalid bytes), as llama.cpp splits text into symbols.
size_t utf8_sequence_length(uint8_t lead);

// Lenient decoding (see above). Invalid bytes decode to U+FFFD, one per byte.
std::vector<uint32_t> decode_utf8_lenient(std::string_view text);

// Appends the UTF-8 encoding of `cpt`; code points above U+10FFFF (which the
// lenient decoder can produce) are written as U+FFFD.
void append_utf8(std::string& out, uint32_t cpt);
std::string codepoint_to_utf8(uint32_t cpt);

// Simple lowercase mapping (ICU u_tolower).
uint32_t to_lower(uint32_t cpt);

// First code point of the canonical (NFD) decomposition, or cpt itself.
uint32_t nfd_first(uint32_t cpt);

// GPT-2 byte-level BPE alphabet: each byte is shown as a printable character.
const std::string& byte_to_gpt2_char(uint8_t byte);
// Inverse of the above; returns -1 for a code point outside the alphabet.
int gpt2_char_to_byte(uint32_t cpt);

}  // namespace reprise::tok
