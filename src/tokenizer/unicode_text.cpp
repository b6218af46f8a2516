#include "tokenizer/unicode_text.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <array>
#include <mutex>

namespace reprise::tok {
namespace {

constexpr uint32_t kCodepointLimit = 0x110000;

uint16_t category_bits(UChar32 c) {
  switch (u_charType(c)) {
    case U_UNASSIGNED:
      return CodepointFlags::kUndefined;
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return CodepointFlags::kLetter;
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
      return CodepointFlags::kMark;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return CodepointFlags::kNumber;
    case U_SPACE_SEPARATOR:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
      return CodepointFlags::kSeparator;
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_PRIVATE_USE_CHAR:
    case U_SURROGATE:
      return CodepointFlags::kControl;
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_CONNECTOR_PUNCTUATION:
    case U_OTHER_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION:
      return CodepointFlags::kPunctuation;
    case U_MATH_SYMBOL:
    case U_CURRENCY_SYMBOL:
    case U_MODIFIER_SYMBOL:
    case U_OTHER_SYMBOL:
      return CodepointFlags::kSymbol;
    default:
      return CodepointFlags::kUndefined;
  }
}

// One table for all code points: tokenizers query every character of every
// prompt, so the ICU calls are paid once per process (about 2 MB).
const std::vector<uint16_t>& flag_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(kCodepointLimit);
    for (uint32_t c = 0; c < kCodepointLimit; ++c) {
      uint16_t bits = category_bits(static_cast<UChar32>(c));
      if (u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE))
        bits |= CodepointFlags::kWhitespace;
      t[c] = bits;
    }
    return t;
  }();
  return table;
}

struct Gpt2Alphabet {
  std::array<std::string, 256> byte_to_char;
  std::array<int, 512> char_to_byte{};  // all alphabet code points are < 512
};

const Gpt2Alphabet& gpt2_alphabet() {
  static const Gpt2Alphabet alphabet = [] {
    Gpt2Alphabet a;
    a.char_to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next_extra = 0;
    for (int b = 0; b < 256; ++b) {
      uint32_t cpt = printable(b) ? static_cast<uint32_t>(b) : 256u + next_extra++;
      a.byte_to_char[b] = codepoint_to_utf8(cpt);
      a.char_to_byte[cpt] = b;
    }
    return a;
  }();
  return alphabet;
}

}  // namespace

CodepointFlags codepoint_flags(uint32_t cpt) {
  if (cpt >= kCodepointLimit) return CodepointFlags{CodepointFlags::kUndefined};
  return CodepointFlags{flag_table()[cpt]};
}

size_t utf8_sequence_length(uint8_t lead) {
  static constexpr size_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLengths[lead >> 4];
}

std::vector<uint32_t> decode_utf8_lenient(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  auto cont = [&](size_t i) { return i < n && (s[i] & 0xC0) == 0x80; };
  size_t i = 0;
  while (i < n) {
    uint8_t b = s[i];
    if (b < 0x80) {
      out.push_back(b);
      i += 1;
    } else if ((b & 0xE0) == 0xC0 && cont(i + 1)) {
      out.push_back(((b & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu));
      i += 2;
    } else if ((b & 0xF0) == 0xE0 && cont(i + 1) && cont(i + 2)) {
      out.push_back(((b & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3Fu));
      i += 3;
    } else if ((b & 0xF8) == 0xF0 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      out.push_back(((b & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) |
                    (s[i + 3] & 0x3Fu));
      i += 4;
    } else {
      out.push_back(0xFFFD);
      i += 1;
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cpt) {
  if (cpt > 0x10FFFF) cpt = 0xFFFD;
  if (cpt < 0x80) {
    out.push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

std::string codepoint_to_utf8(uint32_t cpt) {
  std::string s;
  append_utf8(s, cpt);
  return s;
}

uint32_t to_lower(uint32_t cpt) {
  if (cpt >= kCodepointLimit) return cpt;
  return static_cast<uint32_t>(u_tolower(static_cast<UChar32>(cpt)));
}

uint32_t nfd_first(uint32_t cpt) {
  if (cpt < 0xC0 || cpt >= kCodepointLimit) return cpt;  // nothing below U+00C0 decomposes
  UErrorCode status = U_ZERO_ERROR;
  static const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(status);
  if (!nfd) return cpt;
  icu::UnicodeString decomposition;
  if (!nfd->getDecomposition(static_cast<UChar32>(cpt), decomposition) || decomposition.isEmpty())
    return cpt;
  return static_cast<uint32_t>(decomposition.char32At(0));
}

const std::string& byte_to_gpt2_char(uint8_t byte) { return gpt2_alphabet().byte_to_char[byte]; }

int gpt2_char_to_byte(uint32_t cpt) {
  if (cpt >= 512) return -1;
  return gpt2_alphabet().char_to_byte[cpt];
}

}  // namespace reprise::tok
